// The mount outlives its daemon (supervise=on, the default): a serving
// daemon killed with SIGKILL is replaced and readers never see ENOTCONN nor
// a wrong byte; listings and xattrs are the same across a kill; ckptfsctl
// restart hands the mount to another binary under 16 readers without one
// error; SIGTERM to the supervisor unmounts; a daemon that cannot start
// drives the supervisor into a logged, backed-off crash loop in which the
// mount answers EIO instead of hanging, and out of it once it can.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "file_reads.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;
const std::string kNextDaemon = CKPTFS_NEXT_VERSION_PATH;  // the same ckptfs, another version string

// The pattern of the streamed file: every 8-byte word is a function of its
// offset, so a byte served from the wrong place or the wrong file shows.
uint64_t PatternWord(uint64_t offset) { return (offset * 0x9E3779B97F4A7C15ull) ^ 0x5DEECE66Dull; }

void WritePatternFile(const std::string& path, uint64_t size) {
  MakeDirs(fs::path(path).parent_path());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  std::vector<uint64_t> buf(kMiB / 8);
  for (uint64_t at = 0; at < size; at += kMiB) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = PatternWord(at + i * 8);
    ASSERT_EQ(::pwrite(fd, buf.data(), kMiB, static_cast<off_t>(at)), static_cast<ssize_t>(kMiB));
  }
  ::close(fd);
}

nlohmann::json Status(const std::string& mnt) { return QueryMount(kCtl, "status", mnt); }

// What a reader saw: bytes checked, reads that failed by errno, and the
// first wrong byte's offset.
struct ReaderTally {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> passes{0};
  std::atomic<uint64_t> eio{0};
  std::atomic<uint64_t> enotconn{0};
  std::atomic<uint64_t> other_errors{0};
  std::atomic<int64_t> wrong_at{-1};
  std::atomic<bool> in_read{false};  // inside pread: a request is likely with the daemon
};

class RestartTest : public MountFixture {
 protected:
  RestartTest() : MountFixture("ckptfs-restart") {}
  bool WaitForLink(const std::string& name) {
    return WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/" + name); }, std::chrono::seconds(60));
  }
  std::string DigestDir(const std::string& by_name) {
    return mnt_ + "/" + fs::read_symlink(mnt_ + "/by-name/" + by_name).filename().string();
  }
  // Children killed while their requests waited (see OpensGoOnInChild).
  void TearDown() override {
    for (pid_t pid : stragglers_) ::waitpid(pid, nullptr, 0);
  }
  // SIGKILLs the daemon serving `m` and waits until another one serves.
  void KillServingDaemon(MountedCkptfs& m) {
    const pid_t victim = m.ServingPid();
    ASSERT_GT(victim, 0);
    ASSERT_NE(victim, m.pid()) << "no supervised daemon to kill";
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    ASSERT_TRUE(WaitFor([&] {
      const pid_t now = m.ServingPid();
      return now > 0 && now != victim && now != m.pid() && Status(mnt_).value("pid", 0) == now;
    })) << m.Log();
  }

  std::vector<pid_t> stragglers_;
};

// Reads `path` in 1 MiB preads, pass after pass, until `stop`, checking
// every word; an EIO is counted and the read retried.
void StreamAndCheck(const std::string& path, uint64_t size, const std::atomic<bool>& stop, ReaderTally& t) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    ++t.other_errors;
    return;
  }
  std::vector<uint64_t> buf(kMiB / 8);
  for (uint64_t at = 0; !stop && t.wrong_at < 0;) {
    t.in_read = true;
    const ssize_t n = ::pread(fd, buf.data(), kMiB, static_cast<off_t>(at));
    t.in_read = false;
    if (n < 0) {
      if (errno == ENOTCONN) {
        ++t.enotconn;
        break;
      }
      (errno == EIO ? t.eio : t.other_errors)++;
      continue;
    }
    for (size_t i = 0; i < static_cast<size_t>(n) / 8; ++i) {
      if (buf[i] != PatternWord(at + i * 8)) {
        t.wrong_at = static_cast<int64_t>(at + i * 8);
        break;
      }
    }
    t.bytes += static_cast<uint64_t>(n);
    at += static_cast<uint64_t>(n);
    if (at >= size) {
      at = 0;
      ++t.passes;
    }
  }
  ::close(fd);
}

TEST_F(RestartTest, AGigabyteStreamedThroughFiveKillsNeverSeesENOTCONNNorAWrongByte) {
  constexpr uint64_t kSize = 1ull << 30;
  WritePatternFile(src_ + "/big/model.safetensors", kSize);
  // fill=off: every read comes to the daemon (the chunk path), so each kill
  // lands among reads in flight, on a handle the next daemon never gave.
  auto m = Mount("fill=off,cache_size=64M");
  ASSERT_TRUE(WaitForLink("big")) << m->Log();
  const std::string file = DigestDir("big") + "/model.safetensors";

  std::atomic<bool> stop{false};
  ReaderTally t;
  std::thread reader([&] { StreamAndCheck(file, kSize, stop, t); });
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937_64 rng(seed);
  int kills = 0;
  bool progressing = true;
  for (int k = 0; k < 5 && progressing && t.enotconn == 0 && t.wrong_at < 0; ++k) {
    // A random point in the stream, somewhere in the next fifth of the file.
    const uint64_t until = t.bytes + std::uniform_int_distribution<uint64_t>(1, kSize / 5)(rng);
    // ... at a moment the reader waits for a read, so the kill leaves one unanswered.
    progressing = WaitFor([&] { return (t.bytes >= until && t.in_read) || t.enotconn > 0; }, std::chrono::seconds(60));
    if (!progressing) break;
    KillServingDaemon(*m);
    ++kills;
  }
  // One whole pass after the last kill, read by the last daemon.
  const uint64_t passes = t.passes;
  progressing = progressing && WaitFor([&] { return t.passes > passes + 1 || t.enotconn > 0 || t.wrong_at >= 0; },
                                       std::chrono::seconds(120));
  EXPECT_TRUE(progressing) << "the reader hung (a read never answered)\n" << m->Log();
  // A read the kernel never answers ends only with the connection.
  if (!progressing) m->KillDashNine();
  stop = true;
  reader.join();

  const nlohmann::json status = Status(mnt_);
  std::cout << "[ figure ] 1 GiB stream, " << kills << " SIGKILLs (seed " << seed << "): " << t.eio
            << " EIO, " << t.enotconn << " ENOTCONN, " << t.other_errors << " other errors, "
            << t.bytes / kMiB << " MiB checked; kernel resend: " << status["daemon"].value("kernel_resend", false)
            << "\n";
  RecordProperty("eio_reads", std::to_string(t.eio));
  EXPECT_EQ(kills, 5);
  EXPECT_EQ(t.enotconn, 0u);
  EXPECT_EQ(t.wrong_at, -1) << "a wrong byte at offset " << t.wrong_at;
  EXPECT_EQ(t.other_errors, 0u);
  // With FUSE_NOTIFY_RESEND the reads a dead daemon held are retried: none fails.
  if (status["daemon"].value("kernel_resend", false)) {
    EXPECT_EQ(t.eio, 0u);
  }
  EXPECT_EQ(status["daemon"]["restarts"], 5) << status.dump();
  EXPECT_NE(status["daemon"]["last_exit"].get<std::string>().find("SIGKILL"), std::string::npos);
  EXPECT_NE(m->Log().find("killed by signal 9 (SIGKILL)"), std::string::npos) << m->Log();
}

// `ls -lRi` (times left out: the root's and by-name's are the time of the
// view's publish) and getfattr of every node, as text.
std::string Listing(const std::string& mnt) {
  CommandResult ls = RunCommand("ls -lRi --time-style=+ " + ShellQuote(mnt), true);
  CommandResult attrs = RunCommand("cd " + ShellQuote(mnt) + " && getfattr -R -h -d -m user. . | grep -v ckptfs.control",
                                   true);
  return ls.out + "\n--- xattrs\n" + attrs.out;
}

TEST_F(RestartTest, ListingsAndXattrsAreTheSameAcrossAKill) {
  WriteModel(src_ + "/org/a", {.seed = 1});
  WriteModel(src_ + "/org/b", {.seed = 2});
  WriteModel(src_ + "/run7", {.seed = 3});
  WriteModel(src_ + "/run7/checkpoint-500", {.seed = 4});
  auto m = Mount("");
  ASSERT_TRUE(WaitUntilIndexed()) << m->Log();  // run7 too: the listing must not change under the kills
  ASSERT_TRUE(WaitForLink("org/a") && WaitForLink("org/b") && fs::is_directory(mnt_ + "/by-name/run7") &&
              fs::is_symlink(mnt_ + "/by-name/run7/checkpoint-500")) << m->Log();
  const std::string before = Listing(mnt_);
  ASSERT_NE(before.find("sha256-"), std::string::npos) << before;
  ASSERT_NE(before.find("user.ckptfs.digest"), std::string::npos) << before;

  std::atomic<bool> stop{false};
  std::atomic<int> loops{0}, differing{0};
  std::string first_difference;
  std::thread looper([&] {
    while (!stop) {
      const std::string now = Listing(mnt_);
      if (now != before && differing++ == 0) first_difference = now;
      ++loops;
    }
  });
  for (int k = 0; k < 2; ++k) {
    const int at = loops;
    ASSERT_TRUE(WaitFor([&] { return loops > at; }, std::chrono::seconds(60)));
    KillServingDaemon(*m);
  }
  const int after_kills = loops;
  EXPECT_TRUE(WaitFor([&] { return loops > after_kills + 1; }, std::chrono::seconds(60)));
  stop = true;
  looper.join();
  EXPECT_EQ(differing, 0) << "before:\n" << before << "\nthen:\n" << first_difference;
  EXPECT_EQ(first_difference.find("not connected"), std::string::npos);
}

TEST_F(RestartTest, RestartWithAnotherBinaryUnderSixteenReadersGivesNoError) {
  constexpr int kReaders = 16;
  std::vector<std::string> data;
  for (int i = 0; i < kReaders; ++i) {
    data.push_back(RandomBytes(3 * kMiB + 1000 * i, 100 + i));
    WriteFile(src_ + "/m/shard-" + std::to_string(i) + ".safetensors", data.back());
  }
  auto m = Mount("cache_size=256M");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const std::string dir = DigestDir("m");
  const std::string old_version = Status(mnt_)["daemon"]["version"];

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> errors{0}, reads{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&, i] {
      while (!stop) {
        std::string got;
        try {
          got = ReadFile(dir + "/shard-" + std::to_string(i) + ".safetensors");
        } catch (const std::exception&) {
          ++errors;
          continue;
        }
        if (got != data[static_cast<size_t>(i)]) ++errors;
        ++reads;
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return reads > 2 * kReaders; }));
  const pid_t old_pid = m->ServingPid();
  CommandResult r = RunCommand(kCtl + " restart --binary " + ShellQuote(kNextDaemon) + " " + ShellQuote(mnt_), true);
  EXPECT_EQ(r.exit_code, 0) << r.out << m->Log();
  const uint64_t at = reads;
  EXPECT_TRUE(WaitFor([&] { return reads > at + 2 * kReaders; }));
  stop = true;
  for (auto& t : readers) t.join();

  const nlohmann::json status = Status(mnt_);
  EXPECT_EQ(errors, 0u) << m->Log();
  EXPECT_NE(status["daemon"]["version"], old_version);
  EXPECT_NE(status["daemon"]["version"].get<std::string>().find("+next"), std::string::npos) << status.dump();
  EXPECT_NE(status["pid"], old_pid);
  EXPECT_TRUE(WaitFor([&] { return ::kill(old_pid, 0) != 0; })) << "the old daemon did not exit";
  EXPECT_NE(m->Log().find("drains and exits"), std::string::npos) << m->Log();
}

TEST_F(RestartTest, SigtermToTheSupervisorUnmounts) {
  WriteModel(src_ + "/m", {.seed = 5});
  auto m = Mount("");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const pid_t serving = m->ServingPid();
  ASSERT_NE(serving, m->pid());
  ASSERT_EQ(::kill(m->pid(), SIGTERM), 0);
  int status = -1;
  ASSERT_TRUE(WaitFor([&] { return ::waitpid(m->pid(), &status, WNOHANG) == m->pid(); })) << m->Log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(IsMounted(mnt_));
  EXPECT_TRUE(WaitFor([&] { return ::kill(serving, 0) != 0; }));
  EXPECT_NE(m->Log().find("unmounting"), std::string::npos) << m->Log();
}

TEST_F(RestartTest, PassthroughOpensAndPinsSurviveARestartAndAKill) {
  const std::string data = RandomBytes(8 * kMiB + 5, 77);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = Mount("cache_size=256M");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const std::string file = DigestDir("m") + "/model.safetensors";
  CommandResult pre = RunCommand(kCtl + " preload --pin " + ShellQuote(mnt_ + "/by-name/m"), true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  if (Status(mnt_)["passthrough"]["mode"] != "on") GTEST_SKIP() << "no FUSE passthrough here";

  // An open file, answered with passthrough, read half-way.
  const int fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string got(data.size(), '\0');
  const size_t half = data.size() / 2;
  ASSERT_EQ(::pread(fd, got.data(), half, 0), static_cast<ssize_t>(half));

  // A hand-over: new opens of the inode the kernel holds in passthrough join it.
  CommandResult r = RunCommand(kCtl + " restart " + ShellQuote(mnt_), true);
  ASSERT_EQ(r.exit_code, 0) << r.out << m->Log();
  EXPECT_EQ(ReadFile(file), data) << m->Log();
  EXPECT_EQ(Status(mnt_)["passthrough"]["mode"], "on");

  // A crash: the open file goes on reading from the backing file the kernel holds.
  KillServingDaemon(*m);
  ASSERT_EQ(::pread(fd, got.data() + half, data.size() - half, static_cast<off_t>(half)),
            static_cast<ssize_t>(data.size() - half));
  // A new open of the inode the kernel holds in passthrough: the supervisor
  // told the new daemon which backing id it uses (else the kernel fails it).
  EXPECT_EQ(ReadFile(file), data) << m->Log();
  ::close(fd);
  EXPECT_TRUE(got == data);
  const nlohmann::json status = Status(mnt_);
  EXPECT_EQ(status["passthrough"]["mode"], "on") << status.dump();
  // The pin list brought the file back, pinned, into the new daemon's host tier.
  EXPECT_TRUE(WaitFor([&] { return QueryMount(kCtl, "stats", mnt_)["tiers"]["host"].value("pinned", uint64_t{0}) >= data.size(); }))
      << QueryMount(kCtl, "stats", mnt_).dump() << m->Log();
  EXPECT_EQ(ReadFile(file), data);
  EXPECT_GE(QueryMount(kCtl, "stats", mnt_)["opens"].value("passthrough", 0), 1) << m->Log();
}

// A daemon that takes a mount over gets no INIT, where the limit of the
// kernel's background requests (read-ahead) is asked for. A mount started
// by a daemon from before that limit (the kernel's 12, set here through
// fusectl as such a daemon left it) gets 64 at its next restart, not at its
// next remount.
TEST_F(RestartTest, ARestartRaisesTheConnectionsBackgroundLimit) {
  WriteFile(src_ + "/m/model.bin", "w");
  auto m = Mount("");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  Fusectl fusectl(tmp_ / "fusectl");
  ASSERT_TRUE(fusectl.mounted());
  const std::string conn = fusectl.ConnectionOf(mnt_);
  ASSERT_EQ(ReadFile(conn + "/max_background"), "64\n") << conn;
  WriteFile(conn + "/max_background", "12");
  WriteFile(conn + "/congestion_threshold", "9");
  ASSERT_EQ(ReadFile(conn + "/max_background"), "12\n");
  CommandResult r = RunCommand(kCtl + " restart " + ShellQuote(mnt_), true);
  ASSERT_EQ(r.exit_code, 0) << r.out << m->Log();
  EXPECT_EQ(ReadFile(conn + "/max_background"), "64\n") << m->Log();
  EXPECT_EQ(ReadFile(conn + "/congestion_threshold"), "48\n");
  EXPECT_EQ(ReadFile(mnt_ + "/by-name/m/model.bin"), "w");
}

// Opens, reads and closes each of `paths` in a child process (so that a
// hang is detected where an open in the test itself would hang it): true
// once it has, false if it failed or was still at it after 60 s. Then it is
// killed, and put in `stragglers` to be reaped once the daemon can answer
// again (a request the daemon has read holds its process until answered).
bool OpensGoOnInChild(const std::vector<std::string>& paths, std::vector<pid_t>& stragglers) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    char byte;
    for (const std::string& path : paths) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0 || ::pread(fd, &byte, 1, 0) != 1) ::_exit(1);
      ::close(fd);
    }
    ::_exit(0);
  }
  int status = 0;
  if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(60))) {
    ::kill(pid, SIGKILL);
    stragglers.push_back(pid);
    return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The link to the supervisor holds 278 small messages here, and the reports
// of one file's opens are sent as one record while they wait: to fill it,
// open more distinct files than that. Writes them into `dir` of SRC; the
// paths they will have in the mount's `digest_dir` come from Paths.
struct ManyFiles {
  static constexpr int kCount = 600;
  explicit ManyFiles(const std::string& dir) {
    for (int i = 0; i < kCount; ++i) WriteFile(dir + "/f/" + std::to_string(i) + ".json", "{}");
  }
  static std::vector<std::string> Paths(const std::string& digest_dir) {
    std::vector<std::string> out;
    for (int i = 0; i < kCount; ++i) out.push_back(digest_dir + "/f/" + std::to_string(i) + ".json");
    return out;
  }
};

// With the supervisor stopped: opens ManyFiles' files of `digest_dir`
// (which must not wait) until the link is full and their reports wait.
void FillTheStoppedSupervisorsLink(const std::string& digest_dir, const std::string& mnt, MountedCkptfs& m,
                                   std::vector<pid_t>& stragglers) {
  EXPECT_TRUE(OpensGoOnInChild(ManyFiles::Paths(digest_dir), stragglers))
      << "opens waited for a supervisor that does not read" << m.Log();
  ASSERT_TRUE(WaitFor([&] { return Status(mnt)["daemon"].value("open_inode_reports_waiting", uint64_t{0}) > 0; }))
      << "the link never filled: this proves nothing" << m.Log();
}

// Some thread of `pid` is in system call `nr` now (/proc/PID/task/*/syscall).
// The system call each thread of `pid` waits in now, with its first two
// arguments (/proc/PID/task/TID/syscall: number, then arguments in hex).
struct WaitingCall {
  long nr = -1;
  unsigned long arg0 = 0, arg1 = 0;
};
std::vector<WaitingCall> WaitingCalls(pid_t pid) {
  std::vector<WaitingCall> out;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "syscall");
    WaitingCall c;
    std::string arg0, arg1;
    if (!(in >> c.nr)) continue;
    if (in >> arg0 >> arg1) {
      c.arg0 = std::stoul(arg0, nullptr, 16);
      c.arg1 = std::stoul(arg1, nullptr, 16);
    }
    out.push_back(c);
  }
  return out;
}

bool AThreadWaitsIn(pid_t pid, long nr) {
  for (const WaitingCall& c : WaitingCalls(pid)) {
    if (c.nr == nr) return true;
  }
  return false;
}

// Stops the supervisor (SIGSTOP) for the object's life; SIGCONT at the end,
// also when the test fails.
class StoppedProcess {
 public:
  explicit StoppedProcess(pid_t pid) : pid_(pid) { stopped_ = ::kill(pid_, SIGSTOP) == 0; }
  ~StoppedProcess() { Resume(); }
  bool stopped() const { return stopped_; }
  void Resume() {
    if (std::exchange(stopped_, false)) ::kill(pid_, SIGCONT);
  }

 private:
  pid_t pid_;
  bool stopped_ = false;
};

// Every open and release is reported to the supervisor, for the successor
// of a daemon that crashes. A supervisor that stops reading (here SIGSTOP;
// in life: swapped out, or busy) must hold up no open, and once it reads
// again must learn the open files it was not told of meanwhile: a reporter
// that dropped what the link could not take left the successor not knowing
// that a file is open through passthrough, and its new opens failed.
TEST_F(RestartTest, ASupervisorThatStopsReadingHoldsUpNoOpenAndMissesNoOpenFile) {
  const std::string data = RandomBytes(4 * kMiB + 3, 91);
  WriteFile(src_ + "/m/model.safetensors", data);
  ManyFiles many(src_ + "/m");
  auto m = Mount("cache_size=256M");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  CommandResult pre = RunCommand(kCtl + " preload --pin " + ShellQuote(mnt_ + "/by-name/m"), true);
  ASSERT_EQ(pre.exit_code, 0) << pre.out;
  if (Status(mnt_)["passthrough"]["mode"] != "on") GTEST_SKIP() << "no FUSE passthrough here";
  const std::string shard = DigestDir("m") + "/model.safetensors";

  int fd = -1;
  {
    StoppedProcess supervisor(m->pid());
    ASSERT_TRUE(supervisor.stopped());
    ASSERT_NO_FATAL_FAILURE(FillTheStoppedSupervisorsLink(DigestDir("m"), mnt_, *m, stragglers_));
    // The shard opened now, through passthrough: its report waits behind.
    // (Only in a child may an open wait while the supervisor is stopped:
    // opens held up for ever would hang this test, not fail it.)
    ASSERT_TRUE(OpensGoOnInChild({shard}, stragglers_));
    fd = ::open(shard.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_GT(Status(mnt_)["daemon"].value("open_inode_reports_waiting", uint64_t{0}), 0u);
  }
  EXPECT_TRUE(WaitFor([&] { return Status(mnt_)["daemon"].value("open_inode_reports_waiting", uint64_t{1}) == 0; }))
      << Status(mnt_).dump() << m->Log();

  // A crash: the successor must know the shard is open through passthrough.
  KillServingDaemon(*m);
  std::string got(data.size(), '\0');
  EXPECT_EQ(::pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == data);
  EXPECT_EQ(ReadFile(shard), data) << "a new open of a file held open through passthrough failed" << m->Log();
  ::close(fd);
  EXPECT_TRUE(m->Log().find("reports of open files wait") != std::string::npos) << m->Log();
}

// `ckptfsctl restart` asked while the supervisor does not read its link
// waits for it, and only it does: opens and reads go on meanwhile (the
// restart's message once held the link's lock that every open's report
// took, under the lock of every open), and the restart completes once the
// supervisor reads again.
TEST_F(RestartTest, ARestartAskedOfAStoppedSupervisorHoldsUpNoOpen) {
  const std::string data = RandomBytes(2 * kMiB + 1, 92);
  WriteFile(src_ + "/m/model.safetensors", data);
  ManyFiles many(src_ + "/m");
  auto m = Mount("");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  const std::string shard = DigestDir("m") + "/model.safetensors";
  const pid_t before = m->ServingPid();
  pid_t restart = -1;
  {
    StoppedProcess supervisor(m->pid());
    ASSERT_TRUE(supervisor.stopped());
    // Fill the link, so that the restart's message cannot go.
    ASSERT_NO_FATAL_FAILURE(FillTheStoppedSupervisorsLink(DigestDir("m"), mnt_, *m, stragglers_));
    restart = ::fork();
    if (restart == 0) {
      ::execl("/bin/sh", "sh", "-c", (kCtl + " restart " + ShellQuote(mnt_) + " >/dev/null 2>&1").c_str(), nullptr);
      ::_exit(127);
    }
    ASSERT_GT(restart, 0);
    // The restart reached the daemon: one of its threads waits in send(2)
    // (sendto) for room on the link. No other thread does: the reporter
    // never waits in send.
    ASSERT_TRUE(WaitFor([&] { return AThreadWaitsIn(before, SYS_sendto); })) << m->Log();
    EXPECT_TRUE(OpensGoOnInChild(std::vector<std::string>(500, shard), stragglers_))
        << "opens waited behind a restart's message" << m->Log();
  }
  int status = 0;
  const bool ended = WaitFor([&] { return ::waitpid(restart, &status, WNOHANG) == restart; }, std::chrono::seconds(120));
  if (!ended) {
    ::kill(restart, SIGKILL);
    ::waitpid(restart, nullptr, 0);
  }
  ASSERT_TRUE(ended) << m->Log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << m->Log();
  EXPECT_NE(m->ServingPid(), before) << m->Log();
  EXPECT_EQ(ReadFile(shard), data);
}

// Runs `stat` of `path` in a child process: its errno (0: it worked), or -1
// if it was still waiting after 20 s (then it is killed).
int StatErrnoInChild(const std::string& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    struct stat st;
    ::_exit(::stat(path.c_str(), &st) == 0 ? 0 : errno);
  }
  int status = 0;
  if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; })) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(RestartTest, ACrashLoopBacksOffAnswersEioAndEndsWhenADaemonStarts) {
  WriteModel(src_ + "/m", {.seed = 6});
  const std::string fail_file = tmp_ / "fail-start";
  ::setenv("CKPTFS_TEST_FAIL_START", fail_file.c_str(), 1);
  auto m = Mount("");
  ::unsetenv("CKPTFS_TEST_FAIL_START");
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  WriteFile(fail_file, "");
  ::kill(m->ServingPid(), SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return m->Log().find("crash loop") != std::string::npos; })) << m->Log();
  const std::string log = m->Log();
  EXPECT_NE(log.find("failing at start on purpose"), std::string::npos) << log;
  EXPECT_NE(log.find("restarting it in 100 ms"), std::string::npos) << log;
  EXPECT_NE(log.find("restarting it in 200 ms"), std::string::npos) << log;
  // In the loop a request is answered, with EIO, instead of waiting forever
  // (a name never looked up, so that the kernel has to ask).
  int probe = 0;
  EXPECT_EQ(StatErrnoInChild(mnt_ + "/by-name/none-" + std::to_string(++probe)), EIO) << m->Log();

  fs::remove(fail_file);
  EXPECT_TRUE(WaitFor([&] { return StatErrnoInChild(mnt_ + "/by-name/none-" + std::to_string(++probe)) == ENOENT; },
                      std::chrono::seconds(30)))
      << m->Log();
  EXPECT_EQ(StatErrnoInChild(mnt_ + "/by-name/m"), 0);
  // Logged when the supervisor reads the new daemon's "ready", which may
  // come after that daemon answered the stats above.
  EXPECT_TRUE(WaitFor([&] { return m->Log().find("the crash loop is over") != std::string::npos; })) << m->Log();
  EXPECT_TRUE(IsMounted(mnt_));
}

// The /dev/fuse descriptors `pid` holds.
std::vector<int> FuseDescriptors(pid_t pid) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    if (fs::read_symlink(e.path(), link_ec) == "/dev/fuse") out.push_back(std::stoi(e.path().filename().string()));
  }
  return out;
}

// Whether descriptor `fd` of `pid` is the very open file that one of
// `other`'s descriptors `theirs` is (kcmp(2), KCMP_FILE).
bool SharedWith(pid_t pid, int fd, pid_t other, const std::vector<int>& theirs) {
  for (int t : theirs) {
    if (SameOpenFile(pid, fd, other, t)) return true;
  }
  return false;
}

// The descriptors that threads of `pid` wait in read() on (syscall 0, its
// first argument).
std::set<int> DescriptorsReadBlockingIn(pid_t pid) {
  std::set<int> out;
  for (const WaitingCall& c : WaitingCalls(pid)) {
    if (c.nr == SYS_read) out.insert(static_cast<int>(c.arg0));
  }
  return out;
}

// Whether a thread of `pid` waits in poll() on one of `fds` (its pollfd
// array read from the process's memory).
bool AThreadPollsOn(pid_t pid, const std::vector<int>& fds) {
  const int mem = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  if (mem < 0) return false;
  bool found = false;
  for (const WaitingCall& c : WaitingCalls(pid)) {
    if (c.nr != SYS_poll) continue;
    std::vector<pollfd> polled(std::min<unsigned long>(c.arg1, 64));
    const ssize_t n = ::pread(mem, polled.data(), polled.size() * sizeof(pollfd), static_cast<off_t>(c.arg0));
    for (size_t i = 0; n > 0 && i < static_cast<size_t>(n) / sizeof(pollfd); ++i) {
      found = found || std::find(fds.begin(), fds.end(), polled[i].fd) != fds.end();
    }
  }
  ::close(mem);
  return found;
}

// Supervision costs the request path nothing that libfuse's clone_fd does
// not: the serving daemon's threads wait in blocking reads, each on a
// channel of its own, and those channels are held by the supervisor (so a
// daemon that dies leaves what it read to its successor's resend; the kill
// tests above check that no such request fails). A successor reads from the
// same channels.
TEST_F(RestartTest, TheServingDaemonsThreadsBlockInReadsOnChannelsTheSupervisorHolds) {
  const std::string data = RandomBytes(3 * kMiB, 8);
  WriteFile(src_ + "/m/model.safetensors", data);
  auto m = Mount("threads=2");  // 4 FUSE threads at most, so 4 channels
  ASSERT_TRUE(WaitForLink("m")) << m->Log();
  for (int round = 0; round < 2; ++round) {
    const pid_t serving = m->ServingPid();
    ASSERT_GT(serving, 0);
    ASSERT_NE(serving, m->pid());
    const std::vector<int> ours = FuseDescriptors(serving), supervisors = FuseDescriptors(m->pid());
    std::set<int> channels;
    for (int fd : ours) {
      if (SharedWith(serving, fd, m->pid(), supervisors)) channels.insert(fd);
    }
    EXPECT_EQ(channels.size(), ours.size()) << "a /dev/fuse descriptor the supervisor does not hold";
    EXPECT_GE(channels.size(), 5u) << "the shared descriptor and 4 channels";
    // Idle: threads wait in read() on at least two different channels.
    std::set<int> waited_on;
    EXPECT_TRUE(WaitFor([&] {
      waited_on = DescriptorsReadBlockingIn(serving);
      std::erase_if(waited_on, [&](int fd) { return !channels.count(fd); });
      return waited_on.size() >= 2;
    })) << "threads of the serving daemon do not block in read() on channels";
    EXPECT_FALSE(AThreadPollsOn(serving, ours)) << "a FUSE thread polls /dev/fuse";
    EXPECT_TRUE(ReadFile(DigestDir("m") + "/model.safetensors") == data);
    if (round == 0) {
      CommandResult r = RunCommand(kCtl + " restart " + ShellQuote(mnt_), true);
      ASSERT_EQ(r.exit_code, 0) << r.out << m->Log();
      ASSERT_NE(m->ServingPid(), serving);
    }
  }
}

}  // namespace
}  // namespace ckptfs::testing
