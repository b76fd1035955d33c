// stamp_headers against hostile headers, through the real daemon: a header
// nested 100,000 arrays deep (it used to overflow the daemon's stack on the
// first stat) and a header of a million keys (it used to take time quadratic
// in the number of keys: hours for this one). Neither test reads a clock:
// the first would crash and the second would run past the test's TIMEOUT.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "ckptfs/safetensors_header.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

// A safetensors file from a raw header text (padded to a multiple of 8) and
// the data section.
std::string FileWithHeader(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// Valid under every format rule, with an extra key 100,000 arrays deep (200 KB).
std::string DeeplyNestedFile() {
  return FileWithHeader(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":)" + std::string(100'000, '[') +
                            std::string(100'000, ']') + "}}",
                        "q");
}

// 20,000 tensors of 4 bytes each and 1,000,000 metadata keys: a 14 MB header.
std::string ManyKeysFile() {
  std::string h = R"({"__metadata__":{"format":"pt")";
  for (int i = 0; i < 1'000'000; ++i) h += ",\"k" + std::to_string(i) + "\":\"v\"";
  h += "}";
  for (int i = 0; i < 20'000; ++i) {
    h += ",\"model.layers." + std::to_string(i / 100) + ".mlp.experts." + std::to_string(i % 100) +
         ".weight\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[" + std::to_string(4 * i) + "," +
         std::to_string(4 * i + 4) + "]}";
  }
  return FileWithHeader(h + "}", RandomBytes(80'000, 7));
}

// Running, not a zombie: a crashed daemon's parent has not reaped it yet.
bool DaemonRunning(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  return static_cast<bool>(stat >> pid_field >> comm >> state) && state != "Z";
}

class StampRobustnessTest : public MountFixture {
 protected:
  StampRobustnessTest() : MountFixture("ckptfs-stamp-robust") {}
  // Periodic rescans stay on here (the default).
  std::unique_ptr<MountedCkptfs> MountStamped(const std::string& wait_for) {
    auto m = MountWith(src_, mnt_, "state=" + state_ + ",settle=0,stamp_headers");
    EXPECT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/" + wait_for); })) << m->Log();
    return m;
  }
};

TEST_F(StampRobustnessTest, DeeplyNestedHeaderIsServedUnstampedAndTheDaemonLives) {
  const std::string nested = DeeplyNestedFile();
  WriteFile(src_ + "/nested/model.safetensors", nested);
  WriteFile(src_ + "/ok/model.safetensors", MakeSafetensors({{"w", "U8", {3}, "abc"}}, R"({"format": "pt"})"));
  auto m = MountStamped("ok");
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/nested"); })) << m->Log();
  const std::string through = mnt_ + "/by-name/nested/model.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(through.c_str(), &st), 0) << std::strerror(errno) << "\n" << m->Log();
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), nested.size());
  EXPECT_TRUE(ReadFile(through) == nested) << "not served byte for byte";
  EXPECT_NE(m->Log().find("is served unstamped: invalid safetensors header: header nests arrays and objects more "
                          "than 128 deep"),
            std::string::npos)
      << m->Log();
  // Still up, and still stamping the files that deserve it.
  EXPECT_TRUE(DaemonRunning(m->ServingPid()));
  EXPECT_NE(ReadFile(mnt_ + "/by-name/ok/model.safetensors").find("ckptfs.checkpoint"), std::string::npos);
  EXPECT_TRUE(IsMounted(mnt_));

  // ckptfsctl says why it will not stamp it, and exits by itself (a signal
  // would read as 128 + its number).
  CommandResult r =
      RunCommand(kCtl + " --state " + state_ + " digest --stamped " + src_ + "/nested/model.safetensors", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("nests arrays and objects more than 128 deep (it is served unstamped)"), std::string::npos)
      << r.out;
}

TEST_F(StampRobustnessTest, MillionKeyHeaderStatsAndReadsStamped) {
  const std::string source = ManyKeysFile();
  WriteFile(src_ + "/big/model.safetensors", source);
  auto m = MountStamped("big");
  const std::string through = mnt_ + "/by-name/big/model.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(through.c_str(), &st), 0) << std::strerror(errno) << "\n" << m->Log();
  const std::string served = ReadFile(through);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), served.size());
  auto h = ParseSafetensorsHeader(served, served.size());
  ASSERT_TRUE(h.ok()) << h.status().message();
  auto sh = ParseSafetensorsHeader(source, source.size());
  ASSERT_TRUE(sh.ok()) << sh.status().message();
  EXPECT_EQ(h->tensors, 20'000u);
  EXPECT_EQ((h->header_len - sh->header_len) % 8, 0u);
  EXPECT_TRUE(served.substr(8 + h->header_len) == source.substr(8 + sh->header_len)) << "tensor bytes differ";
  const std::string digest = fs::canonical(through).parent_path().filename();
  const auto& meta = h->json["__metadata__"].get_ref<const nlohmann::ordered_json::object_t&>();
  ASSERT_EQ(meta.size(), 1'000'003u);  // format, the million keys, the two stamps
  const auto stamps = meta.end() - 2;  // appended after the source's keys
  EXPECT_EQ(stamps[0].first, "ckptfs.checkpoint");
  EXPECT_EQ(stamps[0].second, digest);
  EXPECT_EQ(stamps[1].first, "ckptfs.sha256");
  EXPECT_TRUE(DaemonRunning(m->ServingPid()));
}

TEST_F(StampRobustnessTest, StatOfAStampedFileReadsNothingFromTheSource) {
  // What stat needs (the stamped size) is computed at indexing and stored,
  // so a stat, even the first after a remount, reads no byte of the file:
  // a 100 MB header would otherwise be read and parsed under the caller's
  // stat.
  const std::string source = MakeSafetensors({{"w", "U8", {3}, "abc"}}, R"({"format": "pt"})");
  WriteFile(src_ + "/model/model.safetensors", source);
  const std::string through = mnt_ + "/by-name/model/model.safetensors";
  for (int mount = 0; mount < 2; ++mount) {
    auto m = MountStamped("model");
    struct stat st {};
    ASSERT_EQ(::stat(through.c_str(), &st), 0) << std::strerror(errno) << "\n" << m->Log();
    const auto stats = QueryMount(kCtl, "stats", mnt_);
    EXPECT_EQ(stats.value("source_bytes_read", uint64_t{1}), 0u) << "mount " << mount << ": " << stats.dump();
    const std::string served = ReadFile(through);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), served.size());
    EXPECT_GT(served.size(), source.size());  // stamped
    EXPECT_NE(served.find("ckptfs.checkpoint"), std::string::npos);
  }
}

}  // namespace
}  // namespace ckptfs::testing
