// `systemctl restart ckptfs@X` keeps the mount (mount/ckptfs@.service),
// against a stand-in for the service manager (tests/support/
// fake_service_manager.h: the fd store, LISTEN_FDS, and the bus that says
// which job runs) with real processes and a real mount: the supervisor
// told SIGTERM during a restart job leaves the mount up, its connection and
// open-file record in the store; a read made while no supervisor runs
// waits and gets the right bytes; the next supervisor takes the connection
// back and a reader looping over a file the whole time sees no error,
// ENOTCONN included; SIGTERM during a stop job still unmounts.
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

#include "ckptfs/unique_fd.h"
#include "fake_service_manager.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

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

// The supervisors started: each is reaped by ExitStatus or, at the end of
// a failed test, killed; then the mount point is lazily unmounted.
struct Supervisors {
  std::string mnt;
  std::vector<pid_t> pids;
  ~Supervisors() {
    for (pid_t p : pids) ::kill(p, SIGKILL);  // its daemons die with it (PR_SET_PDEATHSIG)
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
    if (IsMounted(mnt)) RunCommand("fusermount3 -u -z " + ShellQuote(mnt));
  }
  // Its exit status once it exits (within 30 s), else -1 and left to the destructor.
  int ExitStatus(pid_t pid) {
    int status = -1;
    if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(30))) return -1;
    pids.erase(std::remove(pids.begin(), pids.end(), pid), pids.end());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// The file's bytes, or the error as text ("error: ...").
std::string ReadWhole(const std::string& path) {
  try {
    return ReadFile(path);
  } catch (const std::exception& e) {
    return std::string("error: ") + e.what();
  }
}

// Where the kernel has thread `tid` of this process wait ("request_wait_answer":
// on a FUSE request).
std::string WaitChannel(pid_t tid) {
  std::string text;
  try {
    text = ReadFile("/proc/self/task/" + std::to_string(tid) + "/wchan");
  } catch (const std::exception&) {
  }
  return text;
}

// Stops and joins a reader thread, at the end of the scope whatever failed.
// Declared before the manager: a reader waiting on a connection nobody
// serves is let go once the manager closes the stored descriptor.
struct ReaderThread {
  std::atomic<bool> stop{false};
  std::thread thread;
  ~ReaderThread() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

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
  LoopTally tally;
  ReaderThread reader, gap_reader;
  FakeServiceManager manager(tmp_ / "manager");
  Supervisors supervisors{mnt_, {}};

  const pid_t first = manager.Start(Argv(), log_);
  supervisors.pids.push_back(first);
  ASSERT_TRUE(WaitFor([&] { return manager.ReadyCount() == 1; }, std::chrono::seconds(60))) << Log();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << Log();
  const std::string file = mnt_ + "/" + fs::read_symlink(mnt_ + "/by-name/m").filename().string() + "/model.safetensors";
  CommandResult pre = RunCommand(kCtl + " preload --pin " + ShellQuote(mnt_ + "/by-name/m"), true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  // Held open across the restart: with passthrough the kernel keeps its
  // backing id, and new opens fail with EIO unless the next daemon learns it.
  const UniqueFd held(::open(file.c_str(), O_RDONLY));
  ASSERT_TRUE(held.valid());
  ASSERT_EQ(ReadFile(file), data);
  EXPECT_TRUE(WaitFor([&] {
    const auto names = manager.StoredNames();
    return std::count(names.begin(), names.end(), "fuse") == 1 && std::count(names.begin(), names.end(), "fuse-init") == 1;
  })) << Log();

  reader.thread = std::thread([&] { ReadInLoop(file, data, reader.stop, tally); });
  ASSERT_TRUE(WaitFor([&] { return tally.reads >= 3; })) << Log();

  // systemctl restart: the stop half.
  manager.SetJobType("restart");
  ASSERT_EQ(::kill(first, SIGTERM), 0);
  EXPECT_EQ(supervisors.ExitStatus(first), 0) << Log();
  EXPECT_TRUE(IsMounted(mnt_)) << Log();
  const auto names = manager.StoredNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "fuse-open-inodes"), 1) << Log();
  // The channels stay for the next supervisor (a request the draining daemon
  // took as its loop ended is still on one), once each.
  const auto channels = std::count(names.begin(), names.end(), "fuse-channel");
  EXPECT_GE(channels, 4) << Log();
  // Between the two halves no daemon runs: a read made now waits in the
  // kernel (seen in its thread's wait channel) for the next one.
  std::atomic<pid_t> gap_tid{0};
  std::string gap_bytes;
  gap_reader.thread = std::thread([&] {
    gap_tid = ::gettid();
    gap_bytes = ReadWhole(file);
  });
  EXPECT_TRUE(WaitFor([&] { return gap_tid != 0 && WaitChannel(gap_tid) == "request_wait_answer"; })) << Log();
  // The start half: the stored descriptors, as LISTEN_FDS.
  manager.SetJobType("");
  const pid_t second = manager.Start(Argv(), log_);
  supervisors.pids.push_back(second);
  ASSERT_TRUE(WaitFor([&] { return manager.ReadyCount() == 2; }, std::chrono::seconds(60))) << Log();
  gap_reader.thread.join();
  {
    const auto now = manager.StoredNames();
    EXPECT_EQ(std::count(now.begin(), now.end(), "fuse-channel"), channels) << "taken back, stored again once";
  }
  EXPECT_TRUE(gap_bytes == data) << gap_bytes.size() << " bytes: " << gap_bytes.substr(0, 200);
  const uint64_t reads_at_restart = tally.reads;
  EXPECT_TRUE(WaitFor([&] { return tally.reads >= reads_at_restart + 3 || tally.enotconn > 0; })) << Log();
  EXPECT_EQ(ReadFile(file), data) << Log();
  char tail[16] = {};
  EXPECT_EQ(::pread(held.get(), tail, sizeof tail, static_cast<off_t>(data.size() - sizeof tail)), 16) << Log();
  EXPECT_EQ(std::string(tail, sizeof tail), data.substr(data.size() - sizeof tail));
  EXPECT_NE(Log().find("took the FUSE connection"), std::string::npos) << Log();
  // The record went to the daemon that serves now; the store forgets it.
  EXPECT_TRUE(WaitFor([&] {
    const auto now = manager.StoredNames();
    return std::count(now.begin(), now.end(), "fuse-open-inodes") == 0;
  })) << Log();

  reader.stop = true;
  reader.thread.join();
  EXPECT_EQ(tally.enotconn, 0u) << Log();
  EXPECT_EQ(tally.other_errors, 0u) << "last errno " << tally.last_errno << "\n" << Log();
  EXPECT_EQ(tally.wrong, 0u);

  // systemctl stop: SIGTERM during a stop job unmounts.
  manager.SetJobType("stop");
  ASSERT_EQ(::kill(second, SIGTERM), 0);
  EXPECT_EQ(supervisors.ExitStatus(second), 0) << Log();
  EXPECT_FALSE(IsMounted(mnt_)) << Log();
  EXPECT_NE(Log().find("systemd job stop; unmounting"), std::string::npos) << Log();
}

// The supervisor killed (its daemon dies with it) and started again, as
// Restart=always does: every request the dead daemon had read is answered by
// the next one. They were read from the supervisor's channels
// (fuse_channels.h), which the store keeps too; a channel closed by the
// last process holding it would fail its requests (ECONNABORTED).
TEST_F(SystemdRestartTest, ASupervisorKilledAndStartedAgainFailsNoRead) {
  const std::string data = RandomBytes(8 * kMiB, 15);
  WriteFile(src_ + "/m/model.safetensors", data);
  MakeDirs(mnt_);
  MakeDirs(tmp_ / "manager");
  LoopTally tally;
  ReaderThread reader;
  FakeServiceManager manager(tmp_ / "manager");
  Supervisors supervisors{mnt_, {}};
  std::vector<std::string> argv = Argv();
  argv.back() += ",fill=off";  // every read a request to the daemon
  supervisors.pids.push_back(manager.Start(argv, log_));
  ASSERT_TRUE(WaitFor([&] { return manager.ReadyCount() == 1; }, std::chrono::seconds(60))) << Log();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << Log();
  const std::string file = mnt_ + "/" + fs::read_symlink(mnt_ + "/by-name/m").filename().string() + "/model.safetensors";
  EXPECT_TRUE(WaitFor([&] {
    const auto names = manager.StoredNames();
    return std::count(names.begin(), names.end(), "fuse-channel") >= 4;
  })) << Log();
  reader.thread = std::thread([&] { ReadInLoop(file, data, reader.stop, tally); });
  for (int kill = 1; kill <= 3; ++kill) {
    const uint64_t reads = tally.reads;
    ASSERT_TRUE(WaitFor([&] { return tally.reads >= reads + 2 || tally.enotconn > 0; })) << Log();
    const pid_t victim = supervisors.pids.back();
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    EXPECT_EQ(supervisors.ExitStatus(victim), 128 + SIGKILL);
    supervisors.pids.push_back(manager.Start(argv, log_));
    ASSERT_TRUE(WaitFor([&] { return manager.ReadyCount() == kill + 1; }, std::chrono::seconds(60))) << Log();
  }
  const uint64_t reads = tally.reads;
  EXPECT_TRUE(WaitFor([&] { return tally.reads >= reads + 2 || tally.enotconn > 0; })) << Log();
  reader.stop = true;
  reader.thread.join();
  EXPECT_EQ(tally.enotconn, 0u) << Log();
  EXPECT_EQ(tally.other_errors, 0u) << "last errno " << tally.last_errno << "\n" << Log();
  EXPECT_EQ(tally.wrong, 0u);
}

}  // namespace
}  // namespace ckptfs::testing
