// Issue 21 item 6: the host tier must not spend the daemon's descriptors.
// One user reads thousands of files; another user's read must still work,
// and the daemon's descriptors stay bounded. As real users (setpriv), with
// the real daemon under a temporary directory, unmounted even on failure.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "as_user.h"
#include "ckptfs/hashes.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

const User kReader{"reader", 2003, 2003, {}};
const User kVictim{"victim", 2002, 2002, {}};

std::string FromEnv(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

size_t OpenDescriptors(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    ++n;
  }
  return n;
}

// The daemon runs with RLIMIT_NOFILE 1024, soft and hard (as a unit with
// LimitNOFILE=1024 gives it, where raising it is not allowed). The reader
// opens 3,000 config-sized files and 600 of 300 KB, each once, in one
// checkpoint; every open of a file not yet resident copies it into the host
// tier (fill=wait). Before the fix every copy was a memfd: the daemon ran
// out of descriptors after about 1,000, and from then on every read by
// anybody that needed the source failed with EIO.
//
// Bounds checked: every read of both users succeeds; the tier's memfds stay
// within its descriptor budget (ckptfsctl stats), which is under half the
// limit; and the daemon holds at most budget + 64 descriptors more after
// the reads than before them.
TEST(DescriptorTest, ThousandsOfFilesReadByOneUserLeaveOtherUsersTheirReads) {
  TempDir tmp{"ckptfs-robust-fds"};
  ::chmod(tmp.path().c_str(), 0755);
  const std::string src = tmp / "src", mnt = tmp / "mnt", state = tmp / "state";
  const std::string crowd = src + "/crowd";
  WriteFile(crowd + "/model.bin", "weights");
  for (int i = 0; i < 3000; ++i) WriteFile(crowd + "/cfg/" + std::to_string(i) + ".json", "{\"n\": " + std::to_string(i) + "}");
  for (int i = 0; i < 600; ++i) WriteFile(crowd + "/mid/" + std::to_string(i) + ".dat", RandomBytes(300 << 10, 100 + i));
  const std::string theirs = RandomBytes(6 << 20, 7);
  WriteFile(src + "/other/m/model.bin", theirs);
  RunCommand("chmod -R a+rX " + ShellQuote(tmp.path()));

  const std::string daemon = FromEnv("CKPTFS_TEST_DAEMON", CKPTFS_PATH);
  const std::string ctl = FromEnv("CKPTFS_TEST_CTL", CKPTFSCTL_PATH);
  const std::string limited = tmp / "ckptfs-nofile-1024";
  WriteFile(limited, "#!/bin/sh\nexec prlimit --nofile=1024:1024 -- " + ShellQuote(daemon) + " \"$@\"\n");
  ::chmod(limited.c_str(), 0755);
  MountedCkptfs m(limited, src, mnt, "state=" + state + ",settle=0,rescan=0,allow_other,supervise=off,threads=2",
                  tmp / "daemon.log");
  ASSERT_TRUE(m.ok()) << m.Log();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt + "/by-name/crowd") && fs::is_symlink(mnt + "/by-name/other/m"); },
                      std::chrono::seconds(120)))
      << m.Log();
  const std::string crowd_digest = fs::read_symlink(mnt + "/by-name/crowd").filename();
  const std::string other_digest = fs::read_symlink(mnt + "/by-name/other/m").filename();
  const size_t before = OpenDescriptors(m.pid());

  AsResult many = RunAs(kReader, "find " + ShellQuote(mnt + "/" + crowd_digest) + " -type f -exec cat {} + >/dev/null");
  EXPECT_EQ(many.exit_code, 0) << many.out.substr(0, 2000) << m.Log().substr(0, 4000);
  AsResult read = RunAs(kVictim, "sha256sum < " + ShellQuote(mnt + "/" + other_digest + "/model.bin"));
  EXPECT_EQ(read.exit_code, 0) << read.out << m.Log().substr(0, 4000);
  EXPECT_EQ(read.out.substr(0, 64), ToHex(Sha256Of(theirs))) << read.out;

  const nlohmann::json stats = QueryMount(ctl, "stats", mnt);
  ASSERT_TRUE(stats.contains("tiers")) << stats.dump();
  const auto& host = stats["tiers"]["host"];
  ASSERT_TRUE(host.contains("descriptor_budget")) << host.dump();
  const uint64_t budget = host["descriptor_budget"].get<uint64_t>();
  EXPECT_LE(budget, 512u);
  EXPECT_LE(host["descriptors"].get<uint64_t>(), budget) << host.dump();
  EXPECT_LE(OpenDescriptors(m.pid()), before + budget + 64) << host.dump();
  m.Unmount();
}

}  // namespace
}  // namespace ckptfs::testing
