// A real ckptfs mount for tests: starts the daemon in the foreground as a
// child process, waits for the mount, and always unmounts and reaps it (in
// the destructor, so a failing test cleans up too).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace ckptfs::testing {

// True if `path` is a mount point now (per /proc/self/mountinfo).
bool IsMounted(const std::string& path);

// Polls `condition` every 20 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::seconds(20));

// `CTL COMMAND --json MOUNTPOINT` (status, stats, ls) parsed; an object
// {"unparsed": OUTPUT} when the output is not JSON.
nlohmann::json QueryMount(const std::string& ctl, const std::string& command, const std::string& mountpoint);

class MountedCkptfs {
 public:
  // Runs `daemon SRC MNT -f -o OPTIONS`; stderr goes to LOG_PATH.
  MountedCkptfs(const std::string& daemon, const std::string& src, const std::string& mnt,
                const std::string& options, const std::string& log_path);
  ~MountedCkptfs();
  MountedCkptfs(const MountedCkptfs&) = delete;
  MountedCkptfs& operator=(const MountedCkptfs&) = delete;

  bool ok() const { return mounted_; }
  // The process started: with supervise=on (the default) the supervisor.
  pid_t pid() const { return pid_; }
  // The process serving the mount now: the supervisor's youngest child (an
  // old one may still be draining after a hand-over), or pid()
  // itself with supervise=off (-1 if none).
  pid_t ServingPid() const;
  const std::string& mountpoint() const { return mnt_; }
  std::string Log() const;

  // fusermount3 -u, then waits for the daemon to exit (kills it if it won't).
  void Unmount();
  // Waits up to `timeout` for the daemon to exit by itself (after an
  // unmount done by the test); true once it has, and it is reaped.
  bool WaitForExit(std::chrono::milliseconds timeout);
  // Leaves the daemon dead and the mount broken, as a crash would.
  void KillDashNine();

 private:
  std::string mnt_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool mounted_ = false;
};

}  // namespace ckptfs::testing
