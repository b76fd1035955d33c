// The serving daemon's side of supervision (see src/supervisor/supervisor.h
// and include/ckptfs/handover_protocol.h): the /dev/fuse descriptor it was
// given, the INIT request to adopt when it takes a connection over, and the
// link on which it reports and is told to drain or resend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/control.h"
#include "ckptfs/fuse_ops.h"
#include "ckptfs/mutex.h"
#include "ckptfs/unique_fd.h"
#include "open_inode_reporter.h"

namespace ckptfs::daemon {

class FdHandover {
 public:
  // What a supervisor put in the environment, or null when this process was
  // not started by one. The variables are removed, so that nothing this
  // daemon runs inherits them.
  static std::unique_ptr<FdHandover> FromEnvironment();

  ~FdHandover();

  int fuse_fd() const { return fuse_fd_; }
  // The connection's per-thread channels the supervisor made (none if it
  // could not), handed to the connection once.
  std::vector<UniqueFd> TakeChannels() { return std::move(channels_); }
  // The connection's INIT request when taking one over; empty for the first
  // daemon of a mount.
  const std::vector<uint8_t>& adopted_init() const { return adopted_init_; }

  // Reports to the supervisor; failures are logged.
  void SendInit(const std::vector<uint8_t>& request);
  void SendReady();

  // Serves the supervisor's requests (drain, resend) on a thread, acting on
  // `ctx`'s connection, until Stop.
  void Listen(fuse::FsContext& ctx);
  // After the session loop: a drained daemon hands its open inodes over.
  void Stop(fuse::FsContext& ctx);
  // The supervisor asked this daemon to drain: its connection goes on with
  // a successor, and the requests it read must still be answered.
  bool drained() const { return drained_; }

  // Control command "restart": asks the supervisor to start `binary` (the
  // same one if not given) and hand the connection over to it.
  nlohmann::json HandleRestart(const ControlServer::Request& r);

  // For status: start time, restarts, the previous daemon's end.
  nlohmann::json StatusJson() const;

 private:
  FdHandover() = default;
  void Send(const nlohmann::json& message);

  int fuse_fd_ = -1;  // owned by the session once attached
  std::vector<UniqueFd> channels_;
  UniqueFd link_;
  Mutex send_mu_;  // one message at a time on link_
  std::vector<uint8_t> adopted_init_;
  uint64_t restarts_ = 0;
  std::string last_exit_;
  int64_t mounted_at_ = 0;
  int64_t started_at_ = 0;
  int supervisor_pid_ = 0;
  std::string started_as_;  // handover::kStarted*
  int predecessor_pid_ = 0;
  std::thread listener_;
  std::atomic<bool> drained_{false};
  mutable Mutex reporter_mu_;
  std::unique_ptr<OpenInodeReporter> reporter_ GUARDED_BY(reporter_mu_);  // made by Listen, stopped by Stop
  mutable Mutex failures_mu_;
  uint64_t handover_failures_ GUARDED_BY(failures_mu_) = 0;
  std::string last_handover_error_ GUARDED_BY(failures_mu_);
};

// Test seam (tests/integration/restart_test.cpp): CKPTFS_TEST_FAIL_START=FILE
// makes a supervised daemon exit at start, with a log line, while FILE
// exists, which drives its supervisor into a crash loop. Unset in
// production: then this is false.
bool FailStartForTest();

// The same status fields for a daemon without a supervisor.
nlohmann::json UnsupervisedStatusJson(int64_t started_at);

}  // namespace ckptfs::daemon
