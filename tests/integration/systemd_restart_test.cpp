// `systemctl restart ckptfs@X` keeps the mount (mount/ckptfs@.service),
// against a stand-in for the service manager (tests/support/
// fake_service_manager.h: the fd store, LISTEN_FDS, and the bus that says
// which job runs) with real processes and a real mount: the supervisor
// told SIGTERM during a restart job leaves the mount up, its connection and
// open-file record in the store; the next supervisor takes them back and
// a reader looping over a file the whole time sees no error, ENOTCONN
// included; SIGTERM during a stop job still unmounts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <thread>

#include "fake_service_manager.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;
const std::string kDaemon = CKPTFS_PATH;
const std::string kCtl = CKPTFSCTL_PATH;
constexpr size_t kMiB = 1 << 20;

// Every read's outcome: errors by errno, and reads that returned other bytes.
struct LoopTally {
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> enotconn{0};
  std::atomic<uint64_t> other_errors{0};
  std::atomic<uint64_t> wrong{0};
  std::atomic<int> last_errno{0};
};

// Opens, reads whole and closes `path` until `stop`: each pass a new open,
// which a daemon must answer, as engines loading a checkpoint do.
void ReadInLoop(const std::string& path, const std::string& expected, const std::atomic<bool>& stop, LoopTally& t) {
  std::string buf(expected.size() + 1, '\0');
  while (!stop) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ssize_t n = fd < 0 ? -1 : 0;
    for (ssize_t got = 1; fd >= 0 && got > 0 && static_cast<size_t>(n) < buf.size(); n += got) {
      got = ::read(fd, buf.data() + n, buf.size() - static_cast<size_t>(n));
      if (got < 0) n = -1;
      if (got <= 0) break;
    }
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (n < 0) {
      t.last_errno = err;
      (err == ENOTCONN ? t.enotconn : t.other_errors)++;
      if (err == ENOTCONN) return;
      continue;
    }
    if (buf.compare(0, static_cast<size_t>(n), expected) != 0 || static_cast<size_t>(n) != expected.size()) ++t.wrong;
    ++t.reads;
  }
}

// Kills and reaps what it was given, and lazily unmounts, unless released.
struct Cleanup {
  std::string mnt;
  std::vector<pid_t> pids;
  ~Cleanup() {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
    if (IsMounted(mnt)) RunCommand("fusermount3 -u -z " + ShellQuote(mnt));
  }
};

int ExitStatusOf(pid_t pid) {
  int status = -1;
  if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(30))) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class SystemdRestartTest : public ::testing::Test {
 protected:
  std::vector<std::string> Argv() const {
    return {kDaemon, src_, mnt_, "-f", "-o", "state=" + state_ + ",settle=0,rescan=0,cache_size=256M"};
  }
  std::string Log() const { return ReadFile(log_); }
  pid_t ServingPid() { return QueryMount(kCtl, "status", mnt_).value("pid", 0); }

  TempDir tmp_{"ckptfs-systemd"};
  std::string src_ = tmp_ / "src";
  std::string mnt_ = tmp_ / "mnt";
  std::string state_ = tmp_ / "state";
  std::string log_ = tmp_ / "daemon.log";
};

TEST_F(SystemdRestartTest, RestartJobKeepsTheMountAndTheReaderNeverFailsStopJobUnmounts) {
  const std::string data = RandomBytes(4 * kMiB + 3, 14);
  WriteFile(src_ + "/m/model.safetensors", data);
  MakeDirs(mnt_);
  MakeDirs(tmp_ / "manager");
  FakeServiceManager manager(tmp_ / "manager");
  Cleanup cleanup{mnt_, {}};

  const pid_t first = manager.Start(Argv(), log_);
  cleanup.pids.push_back(first);
  ASSERT_TRUE(WaitFor([&] { return manager.ReadyCount() == 1; }, std::chrono::seconds(60))) << Log();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << Log();
  const std::string file = mnt_ + "/" + fs::read_symlink(mnt_ + "/by-name/m").filename().string() + "/model.safetensors";
  CommandResult pre = RunCommand(kCtl + " preload --pin " + ShellQuote(mnt_ + "/by-name/m"), true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  // Held open across the restart: with passthrough the kernel keeps its
  // backing id, and new opens fail with EIO unless the next daemon learns it.
  const int held = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(ReadFile(file), data);
  EXPECT_TRUE(WaitFor([&] {
    const auto names = manager.StoredNames();
    return std::count(names.begin(), names.end(), "fuse") == 1 && std::count(names.begin(), names.end(), "fuse-init") == 1;
  })) << Log();

  LoopTally tally;
  std::atomic<bool> stop{false};
  std::thread reader([&] { ReadInLoop(file, data, stop, tally); });
  ASSERT_TRUE(WaitFor([&] { return tally.reads >= 3; })) << Log();

  // systemctl restart: the stop half.
  manager.SetJobType("restart");
  ASSERT_EQ(::kill(first, SIGTERM), 0);
  EXPECT_EQ(ExitStatusOf(first), 0) << Log();
  cleanup.pids.clear();
  EXPECT_TRUE(IsMounted(mnt_)) << Log();
  const auto names = manager.StoredNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "fuse-open-inodes"), 1) << Log();
  // The start half: the stored descriptors, as LISTEN_FDS.
  manager.SetJobType("");
  const pid_t second = manager.Start(Argv(), log_);
  cleanup.pids.push_back(second);
  ASSERT_TRUE(WaitFor([&] { return manager.ReadyCount() == 2; }, std::chrono::seconds(60))) << Log();
  const uint64_t reads_at_restart = tally.reads;
  EXPECT_TRUE(WaitFor([&] { return tally.reads >= reads_at_restart + 3 || tally.enotconn > 0; })) << Log();
  EXPECT_EQ(ReadFile(file), data) << Log();
  char tail[16] = {};
  EXPECT_EQ(::pread(held, tail, sizeof tail, static_cast<off_t>(data.size() - sizeof tail)), 16) << Log();
  EXPECT_EQ(std::string(tail, sizeof tail), data.substr(data.size() - sizeof tail));
  EXPECT_NE(Log().find("took the FUSE connection"), std::string::npos) << Log();
  // The record went to the daemon that serves now; the store forgets it.
  EXPECT_TRUE(WaitFor([&] {
    const auto now = manager.StoredNames();
    return std::count(now.begin(), now.end(), "fuse-open-inodes") == 0;
  })) << Log();

  stop = true;
  reader.join();
  ::close(held);
  EXPECT_EQ(tally.enotconn, 0u) << Log();
  EXPECT_EQ(tally.other_errors, 0u) << "last errno " << tally.last_errno << "\n" << Log();
  EXPECT_EQ(tally.wrong, 0u);

  // systemctl stop: SIGTERM during a stop job unmounts.
  manager.SetJobType("stop");
  ASSERT_EQ(::kill(second, SIGTERM), 0);
  EXPECT_EQ(ExitStatusOf(second), 0) << Log();
  cleanup.pids.clear();
  EXPECT_FALSE(IsMounted(mnt_)) << Log();
  EXPECT_NE(Log().find("systemd job stop; unmounting"), std::string::npos) << Log();
}

}  // namespace
}  // namespace ckptfs::testing
