// What a mount must refuse, and what must never leave it without a server
// (issue 21 items 8, 10, 11 and 13): a second mount on the same mount
// point, a source reached through the mount point, a rescan interval too
// short to be useful, and a crash or a hung successor during a pending
// `ckptfsctl restart`. Each test runs the real daemon under a temporary
// directory and unmounts what it mounted, even when it fails; "does not
// hang" is a generous timeout(1) around the operation, never a timing
// assertion.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckptfs/mount_table.h"
#include "mount_fixture.h"
#include "mounted_ckptfs.h"
#include "test_binaries.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

namespace fs = std::filesystem;

// How many mounts are stacked at `path` now.
int MountsAt(const std::string& path) {
  int n = 0;
  for (const auto& m : ReadMountTable()) n += m.mount_point == path;
  return n;
}

// `sh -c COMMAND` in the background, its output in a file; killed and
// reaped when this dies.
class BackgroundCommand {
 public:
  BackgroundCommand(const std::string& command, const std::string& out_path) : out_path_(out_path) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", (command + " >" + ShellQuote(out_path) + " 2>&1").c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~BackgroundCommand() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;

  // Its exit status once it exited within `timeout`; -1 if it did not.
  int Wait(std::chrono::seconds timeout) {
    int status = 0;
    if (pid_ <= 0 || !WaitFor([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout)) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string Output() const { return ReadFile(out_path_); }

 private:
  std::string out_path_;
  pid_t pid_ = -1;
};

class MountPerimeterTest : public MountFixture {
 protected:
  MountPerimeterTest() : MountFixture("ckptfs-perimeter") {}
  void SetUp() override { ::chmod(tmp_.path().c_str(), 0755); }

  // The daemon in the foreground, given 20 s: a start that is refused
  // returns long before; one that is not would be ended by timeout(1).
  CommandResult StartInForeground(const std::string& src, const std::string& extra = "") {
    CommandResult r = RunCommand("timeout 20 " + kDaemon + " " + ShellQuote(src) + " " + ShellQuote(mnt_) +
                                     " -f -o " + ShellQuote(Options(extra)),
                                 /*merge_stderr=*/true);
    return r;
  }
  // `status` with a bound: a mount that nobody serves would hang it.
  nlohmann::json Status() {
    CommandResult r = RunCommand("timeout 10 " + kCtl + " status --json " + ShellQuote(mnt_));
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }
  int ServingPid() { return Status().value("pid", 0); }
  // A file read through the mount in a child given 20 s ("" if it failed).
  std::string ReadThroughMount(const std::string& rel) {
    CommandResult r = RunCommand("timeout 20 cat " + ShellQuote(mnt_ + "/" + rel));
    return r.exit_code == 0 ? r.out : "";
  }
  // A successor that starts and never reports ready: a shell that writes
  // its pid to PIDFILE and sleeps.
  std::string NeverReadyBinary() {
    const std::string script = tmp_ / "never-ready.sh";
    WriteFile(script, "#!/bin/sh\necho $$ > " + ShellQuote(successor_pidfile_) + "\nexec sleep 600\n");
    ::chmod(script.c_str(), 0755);
    return script;
  }
  pid_t SuccessorPid() {
    std::ifstream f(successor_pidfile_);
    pid_t pid = 0;
    f >> pid;
    return pid;
  }
  static bool Gone(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const auto close = line.rfind(')');
    return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
  }

  std::string successor_pidfile_ = tmp_ / "successor.pid";
};

// Item 10: a second mount on a mount point that holds one is refused,
// naming it, and leaves the first mount's control socket and pin list as
// they were.
TEST_F(MountPerimeterTest, ASecondMountOnTheSameMountPointIsRefusedAndTakesNothing) {
  WriteModel(src_ + "/m", {.seed = 11});
  const std::string other_src = tmp_ / "src2";
  WriteModel(other_src + "/n", {.seed = 12});
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << m->Log();
  const int first_pid = ServingPid();
  ASSERT_GT(first_pid, 0);
  CommandResult pin = RunCommand(kCtl + " preload --pin " + mnt_ + "/by-name/m", true);
  ASSERT_EQ(pin.exit_code, 0) << pin.out;
  std::string pin_list;
  for (const auto& e : fs::directory_iterator(state_)) {
    if (e.path().filename().string().rfind("pins-", 0) == 0) pin_list = e.path();
  }
  ASSERT_FALSE(pin_list.empty());
  const std::string pins = ReadFile(pin_list);

  CommandResult second = StartInForeground(other_src);
  while (MountsAt(mnt_) > 1) RunCommand("fusermount3 -u -z " + ShellQuote(mnt_));
  EXPECT_NE(second.exit_code, 0) << second.out;
  EXPECT_NE(second.exit_code, 124) << "the second mount was not refused: " << second.out;
  EXPECT_NE(second.out.find("mount point " + mnt_ + " already holds a ckptfs mount"), std::string::npos)
      << second.out;
  EXPECT_EQ(ServingPid(), first_pid) << "the first mount's control socket is gone";
  ASSERT_TRUE(fs::exists(pin_list)) << "the first mount's pin list was deleted";
  EXPECT_EQ(ReadFile(pin_list), pins);
}

// Item 11: SRC below MNT, by its own path, through a symlink, and through
// a bind mount of MNT, is refused at start with the reason, instead of a
// mount that waits on itself.
TEST_F(MountPerimeterTest, ASourceReachedThroughTheMountPointIsRefusedAtStart) {
  WriteModel(mnt_ + "/src/m", {.seed = 13});  // MNT is still a plain directory
  Symlink(mnt_ + "/src", tmp_ / "link");
  std::vector<std::string> sources = {mnt_ + "/src", tmp_ / "link", tmp_ / "link/m"};
  const std::string alt = tmp_ / "alt";
  MakeDirs(alt);
  const bool bound = ::geteuid() == 0 && ::mount(mnt_.c_str(), alt.c_str(), nullptr, MS_BIND, nullptr) == 0;
  if (bound) sources.push_back(alt + "/src");
  for (const auto& src : sources) {
    SCOPED_TRACE(src);
    CommandResult r = StartInForeground(src);
    while (MountsAt(mnt_) > 0) RunCommand("fusermount3 -u -z " + ShellQuote(mnt_));
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.exit_code, 124) << "the start was not refused: " << r.out;
    EXPECT_NE(r.out.find("lies below the mount point " + mnt_), std::string::npos) << r.out;
  }
  if (bound) ::umount2(alt.c_str(), MNT_DETACH);
  EXPECT_TRUE(bound) << "the bind-mount case was not tried";
}

// Item 13: rescan= other than 0 is at least a second (each rescan walks all
// of SRC), refused with its range like settle=; --help says the range.
TEST_F(MountPerimeterTest, ARescanShorterThanASecondIsRefusedWithItsRange) {
  WriteModel(src_ + "/m", {.seed = 14});
  MakeDirs(mnt_);
  for (const char* opt : {"rescan=1e-9", "rescan=0.5"}) {
    CommandResult r = StartInForeground(src_, opt);
    if (IsMounted(mnt_)) RunCommand("fusermount3 -u -z " + ShellQuote(mnt_));
    EXPECT_NE(r.exit_code, 0) << opt << ": " << r.out;
    EXPECT_NE(r.exit_code, 124) << opt << " was taken: " << r.out;
    EXPECT_NE(r.out.find(std::string("option ") + opt + ": expected a number of seconds from 1 to 31536000"),
              std::string::npos)
        << r.out;
  }
  EXPECT_NE(RunCommand(kDaemon + " --help").out.find("1 to 31536000, or 0 to turn it off"), std::string::npos);
}

// Item 8: `ckptfsctl restart` starts a successor that never reports ready,
// and the serving daemon is killed meanwhile. A daemon (neither of the two)
// serves again, reads are right, and the restart returns, saying it did
// not happen.
TEST_F(MountPerimeterTest, ACrashDuringAPendingRestartLeavesTheMountServedAndRestartReturns) {
  WriteModel(src_ + "/m", {.seed = 15});
  auto m = Mount();
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << m->Log();
  const int old_pid = ServingPid();
  ASSERT_GT(old_pid, 0);
  BackgroundCommand restart(kCtl + " restart --binary " + NeverReadyBinary() + " " + mnt_, tmp_ / "restart.out");
  ASSERT_TRUE(WaitFor([&] { return SuccessorPid() > 0; })) << m->Log();
  const pid_t successor = SuccessorPid();
  ASSERT_EQ(::kill(old_pid, SIGKILL), 0);

  EXPECT_TRUE(WaitFor([&] {
    const int now = ServingPid();
    return now > 0 && now != old_pid && now != successor;
  }, std::chrono::seconds(60))) << m->Log();
  EXPECT_EQ(ReadThroughMount("by-name/m/config.json"), ReadFile(src_ + "/m/config.json")) << m->Log();
  const int rc = restart.Wait(std::chrono::seconds(60));
  EXPECT_NE(rc, -1) << "ckptfsctl restart still waits: " << restart.Output();
  EXPECT_NE(rc, 0) << restart.Output();
  EXPECT_NE(restart.Output().find("the restart did not happen"), std::string::npos) << restart.Output();
  EXPECT_TRUE(WaitFor([&] { return Gone(successor); })) << "the abandoned successor still runs";
}

// Item 8: a successor that never reports ready is stopped at the
// hand-over's deadline (handover_timeout=2), the restart fails saying why,
// and the daemon that served goes on serving.
TEST_F(MountPerimeterTest, ASuccessorThatNeverServesIsStoppedAtItsDeadline) {
  WriteModel(src_ + "/m", {.seed = 16});
  auto m = Mount("handover_timeout=2");
  ASSERT_TRUE(WaitFor([&] { return fs::is_symlink(mnt_ + "/by-name/m"); })) << m->Log();
  const int old_pid = ServingPid();
  ASSERT_GT(old_pid, 0);
  CommandResult r = RunCommand("timeout 90 " + kCtl + " restart --binary " + NeverReadyBinary() + " " + mnt_, true);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, 124) << "ckptfsctl restart did not return: " << r.out;
  EXPECT_NE(r.out.find("the restart failed, daemon pid " + std::to_string(old_pid) + " goes on serving"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("did not report ready within 2 s"), std::string::npos) << r.out;
  const pid_t successor = SuccessorPid();
  EXPECT_GT(successor, 0);
  EXPECT_TRUE(WaitFor([&] { return Gone(successor); })) << m->Log();
  EXPECT_EQ(ServingPid(), old_pid);
  EXPECT_EQ(ReadThroughMount("by-name/m/config.json"), ReadFile(src_ + "/m/config.json")) << m->Log();
}

}  // namespace
}  // namespace ckptfs::testing
