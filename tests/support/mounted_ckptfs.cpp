#include "mounted_ckptfs.h"

#include <fcntl.h>
#include <cerrno>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "test_tree.h"

namespace ckptfs::testing {

bool IsMounted(const std::string& path) {
  char buf[4096];
  std::string real = ::realpath(path.c_str(), buf) ? buf : path;
  std::ifstream info("/proc/self/mountinfo");
  std::string line;
  while (std::getline(info, line)) {
    std::istringstream ss(line);
    std::string id, parent, dev, root, point;
    ss >> id >> parent >> dev >> root >> point;
    if (point == real || point == path) return true;
  }
  return false;
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

nlohmann::json QueryMount(const std::string& ctl, const std::string& command, const std::string& mountpoint) {
  CommandResult r = RunCommand(ctl + " " + command + " --json " + ShellQuote(mountpoint));
  auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return nlohmann::json{{"unparsed", r.out}};
  return j;
}

MountedCkptfs::MountedCkptfs(const std::string& daemon, const std::string& src, const std::string& mnt,
                             const std::string& options, const std::string& log_path)
    : mnt_(mnt), log_path_(log_path) {
  MakeDirs(mnt);
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDERR_FILENO);
    ::dup2(fd, STDOUT_FILENO);
    ::execl(daemon.c_str(), daemon.c_str(), src.c_str(), mnt.c_str(), "-f", "-o", options.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  mounted_ = WaitFor([&] {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;  // it exited: no mount is coming
      return true;
    }
    return IsMounted(mnt);
  }) && pid_ > 0 && IsMounted(mnt);
}

MountedCkptfs::~MountedCkptfs() { Unmount(); }

std::string MountedCkptfs::Log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void MountedCkptfs::Unmount() {
  if (IsMounted(mnt_)) {
    if (RunCommand("fusermount3 -u " + ShellQuote(mnt_) + " 2>/dev/null").exit_code != 0) {
      RunCommand("fusermount3 -u -z " + ShellQuote(mnt_) + " 2>/dev/null");
    }
  }
  mounted_ = false;
  if (pid_ <= 0) return;
  // ECHILD: a test reaped it itself.
  const bool exited = WaitFor([&] {
    const pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    return r == pid_ || (r < 0 && errno == ECHILD);
  }, std::chrono::seconds(10));
  if (!exited) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
}

bool MountedCkptfs::WaitForExit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return true;
  if (!WaitFor([&] { return ::waitpid(pid_, nullptr, WNOHANG) == pid_; }, timeout)) return false;
  pid_ = -1;
  mounted_ = false;
  return true;
}

pid_t MountedCkptfs::ServingPid() const {
  if (pid_ <= 0) return -1;
  // The supervisor's youngest child: after a hand-over the old daemon may
  // still be draining for a moment beside the one that serves now.
  pid_t youngest = pid_;
  uint64_t youngest_start = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ... starttime (field 22); comm may hold spaces,
    // so parse after ')'.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != pid_) continue;
    std::string skipped;
    for (int field = 5; field < 22; ++field) rest >> skipped;
    uint64_t start = 0;
    rest >> start;
    if (youngest == pid_ || start >= youngest_start) {
      youngest = static_cast<pid_t>(std::stol(entry.path().filename().string()));
      youngest_start = start;
    }
  }
  return youngest;
}

void MountedCkptfs::KillDashNine() {
  if (pid_ <= 0) return;
  // Under a supervisor the serving child dies with it (a parent-death
  // signal), a moment later: wait for that too, so that what the caller
  // sees next is a dead connection, not a request cut off mid-way.
  const pid_t serving = ServingPid();
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  if (serving != pid_) {
    WaitFor([&] {
      std::ifstream stat("/proc/" + std::to_string(serving) + "/stat");
      std::string line;
      if (!std::getline(stat, line)) return true;  // gone
      const auto close = line.rfind(')');
      return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
    });
  }
  pid_ = -1;
}

}  // namespace ckptfs::testing
