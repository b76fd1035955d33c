// stamp_headers under a real mount: tensors byte-identical, the two keys in
// every header, and a header-keyed fingerprint that now tells a base from its
// fine-tune.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckptfs/hashes.h"
#include "ckptfs/safetensors_header.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

// An independent safetensors reader (Python's json and struct over the raw
// bytes): tensor name -> SHA-256 of its bytes, plus the metadata.
nlohmann::json PythonRead(const std::string& path) {
  const char* script = R"PY(
import hashlib, json, struct, sys
with open(sys.argv[1], "rb") as f:
    raw = f.read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n].decode("utf-8"))
out = {"metadata": header.get("__metadata__", {}), "tensors": {}}
for name, meta in header.items():
    if name == "__metadata__":
        continue
    b, e = meta["data_offsets"]
    out["tensors"][name] = hashlib.sha256(raw[8 + n + b:8 + n + e]).hexdigest()
print(json.dumps(out))
)PY";
  CommandResult r = RunCommand("python3 -c " + ShellQuote(script) + " " + ShellQuote(path));
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << path << ": " << r.out;
  return j;
}

// The weight cache's fingerprint: shards sorted by name, each name and its
// raw header (length prefix and JSON) hashed; the directory is left out.
std::string HeaderFingerprint(const std::string& dir) {
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().filename());
  }
  std::sort(shards.begin(), shards.end());
  Sha256 h;
  for (const auto& s : shards) {
    const std::string header = SafetensorsHeader(ReadFile(dir + "/" + s));
    h.Update(s.data(), s.size());
    h.Update(header.data(), header.size());
  }
  return ToHex(h.Finish());
}

class StampMountTest : public MountFixture {
 protected:
  StampMountTest() : MountFixture("ckptfs-stamp") {}
  void SetUp() override {
    ASSERT_EQ(RunCommand(std::string(MAKE_DEMO_TREE_PATH) + " " + src_).exit_code, 0);
  }
  // At `mnt`, and waits until every checkpoint of the tree is indexed.
  // Periodic rescans stay on here (the default).
  std::unique_ptr<MountedCkptfs> Mount(const std::string& mnt, const std::string& extra) {
    auto m = MountWith(src_, mnt, "state=" + state_ + ",settle=0" + extra);
    EXPECT_TRUE(WaitUntilIndexed(mnt)) << m->Log();
    EXPECT_TRUE(fs::is_symlink(mnt + "/by-name/run7/checkpoint-500")) << m->Log();
    return m;
  }
};

TEST_F(StampMountTest, TensorsIdenticalAndKeysPresentThroughAStampedMount) {
  const std::string mnt = tmp_ / "stamped";
  auto m = Mount(mnt, ",stamp_headers");
  for (const char* ck : {"base", "finetune", "base-copy", "run7"}) {
    const std::string digest = fs::canonical(mnt + "/by-name/" + ck + "/config.json").parent_path().filename();
    for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
      const std::string through = mnt + "/by-name/" + ck + "/" + shard;
      const std::string source = src_ + "/" + ck + "/" + shard;
      const std::string file_sha = RunCommand("sha256sum " + source).out.substr(0, 64);
      // The independent reader.
      auto served = PythonRead(through);
      auto original = PythonRead(source);
      EXPECT_EQ(served["tensors"], original["tensors"]) << through;
      EXPECT_EQ(served["metadata"]["ckptfs.checkpoint"], digest) << through;
      EXPECT_EQ(served["metadata"]["ckptfs.sha256"], file_sha) << through;
      EXPECT_EQ(served["metadata"]["format"], "pt");
      // The project's parser on the served bytes, and mmap agreeing with read.
      const std::string bytes = ReadFile(through);
      auto h = ParseSafetensorsHeader(bytes, bytes.size());
      ASSERT_TRUE(h.ok()) << h.status().message();
      const std::string src_bytes = ReadFile(source);
      auto sh = ParseSafetensorsHeader(src_bytes, src_bytes.size());
      ASSERT_TRUE(sh.ok());
      EXPECT_TRUE(bytes.substr(8 + h->header_len) == src_bytes.substr(8 + sh->header_len)) << through;
      EXPECT_EQ((h->header_len - sh->header_len) % 8, 0u);
      EXPECT_EQ(fs::file_size(through), bytes.size());
      int fd = ::open(through.c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      void* p = ::mmap(nullptr, bytes.size(), PROT_READ, MAP_SHARED, fd, 0);
      ASSERT_NE(p, MAP_FAILED);
      EXPECT_TRUE(std::string(static_cast<char*>(p), bytes.size()) == bytes);
      ::munmap(p, bytes.size());
      ::close(fd);
      // xattrs still name the source content.
      char x[128];
      ssize_t n = ::getxattr(through.c_str(), "user.ckptfs.sha256", x, sizeof x);
      EXPECT_EQ(std::string(x, static_cast<size_t>(std::max<ssize_t>(n, 0))), file_sha);
    }
  }
  // Non-safetensors members are untouched.
  EXPECT_EQ(ReadFile(mnt + "/by-name/base/config.json"), ReadFile(src_ + "/base/config.json"));
}

TEST_F(StampMountTest, HeaderKeyedFingerprintSeparatesBaseAndFineTuneOnlyWhenStamped) {
  const std::string plain = tmp_ / "plain";
  const std::string stamped = tmp_ / "stamped";
  auto a = Mount(plain, "");
  auto b = Mount(stamped, ",stamp_headers");
  const auto fp = [&](const std::string& mnt, const char* ck) { return HeaderFingerprint(mnt + "/by-name/" + ck); };
  // The bug ckptfs exists for: through a plain view, one key for both.
  EXPECT_EQ(fp(plain, "base"), fp(plain, "finetune"));
  EXPECT_EQ(fp(plain, "base"), HeaderFingerprint(src_ + "/base"));  // plain means every byte is the source's
  // Stamped: the headers differ wherever the content differs...
  EXPECT_NE(fp(stamped, "base"), fp(stamped, "finetune"));
  // ...and identical copies still agree.
  EXPECT_EQ(fp(plain, "base"), fp(plain, "base-copy"));
  EXPECT_EQ(fp(stamped, "base"), fp(stamped, "base-copy"));
}

TEST_F(StampMountTest, InvalidHeaderIsServedUnstampedWithAWarning) {
  // Declares 8 bytes of F32 but holds 4: breaks the size rule.
  WriteFile(src_ + "/broken/model.safetensors",
            MakeSafetensors({{"w", "U8", {4}, "abcd"}}).replace(8, std::string::npos,
                                                                 [] {
                                                                   std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})";
                                                                   while (h.size() % 8) h += ' ';
                                                                   return h + "abcd";
                                                                 }()));
  {
    std::string f = ReadFile(src_ + "/broken/model.safetensors");
    const uint64_t n = f.size() - 8 - 4;
    for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    WriteFile(src_ + "/broken/model.safetensors", f);
  }
  const std::string mnt = tmp_ / "stamped";
  auto m = Mount(mnt, ",stamp_headers");
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt + "/by-name/broken"); })) << m->Log();
  EXPECT_EQ(ReadFile(mnt + "/by-name/broken/model.safetensors"), ReadFile(src_ + "/broken/model.safetensors"));
  EXPECT_NE(m->Log().find(src_ + "/broken/model.safetensors is served unstamped: invalid safetensors header: "
                                 "tensor \"w\" holds 4 bytes but its shape and dtype need 8"),
            std::string::npos)
      << m->Log();
}

TEST_F(StampMountTest, DigestStampedPrintsTheStampedHeader) {
  CommandResult r = RunCommand(kCtl + " --state " + state_ + " digest --stamped " + src_ +
                               "/finetune/model-00002-of-00002.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::ordered_json::parse(r.out);
  const std::string digest =
      RunCommand(kCtl + " --state " + state_ + " digest " + src_ + "/finetune").out.substr(0, 71);
  EXPECT_EQ(j["checkpoint"], digest);
  EXPECT_EQ(j["header"]["__metadata__"]["ckptfs.checkpoint"], digest);
  EXPECT_EQ(j["header"]["__metadata__"]["ckptfs.sha256"],
            RunCommand("sha256sum " + src_ + "/finetune/model-00002-of-00002.safetensors").out.substr(0, 64));
  EXPECT_EQ((j["header_bytes"]["stamped"].get<uint64_t>() - j["header_bytes"]["source"].get<uint64_t>()) % 8, 0u);
  // What the mount would serve is exactly this header.
  const std::string mnt = tmp_ / "stamped";
  auto m = Mount(mnt, ",stamp_headers");
  const std::string served = SafetensorsHeader(ReadFile(mnt + "/by-name/finetune/model-00002-of-00002.safetensors"));
  EXPECT_EQ(nlohmann::ordered_json::parse(served.substr(8)), j["header"]);  // same keys, same order
  EXPECT_NE(RunCommand(kCtl + " digest --stamped " + src_ + "/finetune/config.json", true).exit_code, 0);
}

}  // namespace
}  // namespace ckptfs::testing
