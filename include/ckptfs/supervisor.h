// Supervisor: the process that holds a mount's /dev/fuse descriptor so that
// the mount outlives the daemon serving it (README, "Restart and upgrade").
//
// It runs the serving daemon (this same ckptfs binary, or the one `ckptfsctl
// restart --binary` names) as a child with the descriptor inherited, and
// when the child dies starts another, which takes the connection over
// (ConnectionIo: the INIT request kept here, FUSE_NOTIFY_RESEND). It does no
// FUSE work itself, except answering EIO while in a crash loop
// (RestartPolicy), and so has little to crash on. One line is logged per
// restart, with its cause.
//
// SIGTERM or SIGINT: unmounts (lazily, as fusermount3 -u -z), stops the
// children and exits 0. Except a SIGTERM that keep_mount_on_term says is
// the stop half of a restart (systemctl restart, which keeps the descriptor
// in systemd's fd store): the serving daemon drains, the mount stays, and
// on_hand_back gets the open-file record for the next supervisor. SIGHUP is passed on to the serving daemon (rescan).
// The mount unmounted by someone else: the daemon's loop ends with status 0,
// the descriptor reports POLLERR, and the supervisor exits 0 too.
//
// Each child has a role, and is told apart by its pid and role, never by
// its place in the list (issue 21 item 8): the first daemon; a successor
// that a `ckptfsctl restart` started beside the serving daemon; a
// replacement started because none serves. A successor has
// handover_timeout to report ready, or it is killed and the serving daemon
// is told the restart failed. Whenever the serving daemon dies, a pending
// successor is killed too (it was to take over from a live daemon) and a
// replacement is started, so a crash during a hand-over never leaves the
// mount without a server.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/unique_fd.h"
#include "ckptfs/restart_policy.h"

namespace ckptfs::supervisor {

struct SupervisorConfig {
  std::string binary;             // the daemon to run (an absolute path)
  std::vector<std::string> args;  // its arguments, argv[1] on
  int fuse_fd = -1;               // the mount's /dev/fuse descriptor (O_NONBLOCK)
  // The connection's per-thread channels for the daemons (fuse_channels.h);
  // none: they read the shared descriptor.
  std::vector<UniqueFd> channels;
  std::string mountpoint;
  std::function<void()> unmount;  // lazily unmounts; called once
  // A daemonized start's waiting parent: one byte, the exit status it is to
  // return, once the first daemon serves (0) or could not start (1).
  UniqueFd ready_pipe;
  // Called once, when the first daemon serves (to detach from the terminal).
  std::function<void()> on_started;
  // A connection initialized before this supervisor (handed back by
  // systemd's fd store): its INIT request, which every daemon adopts.
  std::vector<uint8_t> adopted_init;
  // Called with the INIT request the first daemon reports (to store it).
  std::function<void(const std::vector<uint8_t>&)> on_init_request;
  // The open-file record (JSON array of [ino, opens, backing id]) the
  // adopted connection's last daemon left, for the first daemon started.
  nlohmann::json adopted_open_inodes = nlohmann::json::array();
  // Asked at SIGTERM: true to leave the mount up for a successor.
  std::function<bool()> keep_mount_on_term;
  // Called once, after a SIGTERM that kept the mount, with the open-file record.
  std::function<void(const nlohmann::json&)> on_hand_back;
  RestartPolicy::Limits limits;
  // How long a successor started by `ckptfsctl restart` may take to report ready.
  std::chrono::milliseconds handover_timeout = std::chrono::seconds(120);
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorConfig config);
  // Runs until the mount is gone; the exit status for main.
  int Run();

 private:
  enum class Role { kFirst, kSuccessor, kReplacement };
  struct Child {
    pid_t pid = -1;
    UniqueFd link;  // SOCK_SEQPACKET to it
    std::string binary;
    Role role = Role::kFirst;
    std::chrono::steady_clock::time_point started;
    std::chrono::steady_clock::time_point ready_by;  // a successor's deadline
    bool ready = false;
    bool draining = false;
    // Killed by the supervisor, and why; its messages are ignored from then on.
    std::string abandoned;
    // Its inodes with open files: ino -> (opens, backing id), as it reports them.
    std::map<uint64_t, std::pair<uint64_t, int>> open_inodes;
  };
  using ChildIt = std::list<Child>::iterator;
  static const char* RoleName(Role role);  // as handover_protocol.h spells it

  bool Spawn(const std::string& binary, const std::string& why, Role role, pid_t predecessor = 0);
  void OnRestartAsked(ChildIt child, const nlohmann::json& message);
  void OnSuccessorGone(const Child& dead, const std::string& cause);
  void Abandon(Child& child, const std::string& why);
  void AbandonLateSuccessors();
  void OnMessage(ChildIt child, const nlohmann::json& message);
  void OnReady(ChildIt child);
  void ReapChildren();
  void OnExit(ChildIt child, int wait_status);
  void Stop(const std::string& why);
  void HandBack(const std::string& why);
  void OnSignal(int signo);
  void ReportStart(uint8_t status);
  void Send(Child& child, const nlohmann::json& message);
  ChildIt Serving();           // the child that reported ready and serves, or end()
  ChildIt PendingSuccessor();  // a successor not ready yet (and not abandoned), or end()
  bool ServerPresentOrComing() const;
  bool MountGone() const;
  int PollTimeoutMs() const;
  void PollOnce();

  SupervisorConfig config_;
  RestartPolicy policy_;
  UniqueFd signals_;  // signalfd: TERM, INT, HUP, CHLD
  std::vector<UniqueFd> channels_;  // the connection's clones, held for the mount's life
  std::list<Child> children_;
  std::vector<uint8_t> init_request_;  // as the kernel sent it to the first daemon
  nlohmann::json inherited_ = nlohmann::json::array();  // a drained daemon's open inodes
  uint64_t restarts_ = 0;
  std::string last_exit_ = "none";
  int64_t mounted_at_ = 0;
  bool stopping_ = false;
  bool handing_back_ = false;  // stopping, but leaving the mount to a successor
  bool started_ = false;   // the first daemon became ready
  bool crash_loop_ = false;
  int exit_status_ = 0;
  // A restart waits for its back-off to pass.
  bool restart_pending_ = false;
  std::chrono::steady_clock::time_point restart_at_;
};

}  // namespace ckptfs::supervisor
