// The daemon's control commands: one row each, binding a protocol name to
// the handler that answers it (query_commands.h, cache_commands.h).
#include "cache_commands.h"
#include "ckptfs/control_protocol.h"
#include "daemon.h"
#include "fleet.h"
#include "query_commands.h"
#include "query_filter.h"

namespace ckptfs::daemon {

CommandTable Daemon::MakeCommands() {
  using Request = ControlServer::Request;
  // Who may run a command is the protocol's word (control_protocol.h).
  auto row = [](std::string_view name, ControlServer::Handler handler) {
    return ControlCommand{std::string(name), protocol::NeedsOwner(name), std::move(handler)};
  };
  auto visible = [this](const Request& r) { return VisibleStates(watcher_->States(), r); };
  return CommandTable({
      row(protocol::kStatus,
          [this, visible](const Request& r) {
            const MountFacts facts{&options_, state_dir_, index_->path(), log_->destination()};
            auto status = StatusJson(visible(r), *watcher_, facts, ctx_, /*node_counters=*/r.privileged);
            AddFleetStatus(status, manifests_.get(), source_fs_, options_);
            status[protocol::kDaemon] = DaemonStatusJson();
            return status;
          }),
      row(protocol::kLs, [this, visible](const Request& r) { return LsJson(visible(r), *view_, options_.source); }),
      row(protocol::kStats,
          [this, visible](const Request& r) {
            return HandleStats(ctx_, index_fill_.get(), VisibleByName(visible(r), *view_, options_.source),
                               /*node_counters=*/r.privileged);
          }),
      // A daemon that takes the mount over pins what was pinned (pin_list.h).
      row(protocol::kPreload, [this](const Request& r) { return RecordPins(r, HandlePreload(ctx_, r)); }),
      row(protocol::kUnpin, [this](const Request& r) { return RecordPins(r, HandleUnpin(ctx_, r)); }),
      row(protocol::kEvict, [this](const Request& r) { return RecordPins(r, HandleEvict(ctx_, r)); }),
      row(protocol::kRescan,
          [this](const Request&) {
            watcher_->RequestRescan();
            return protocol::OkReply();
          }),
      row(protocol::kRestart,
          [this](const Request& r) {
            if (handover_) return handover_->HandleRestart(r);
            return nlohmann::json{{protocol::kOk, false},
                                  {protocol::kError,
                                   "this mount has no supervisor (supervise=off): unmount and mount it again"}};
          }),
  });
}

nlohmann::json Daemon::RecordPins(const ControlServer::Request& r, nlohmann::json reply) {
  pins_->Record(r, reply);
  return reply;
}

// Start time, restarts and the last exit (from the supervisor), and whether
// the kernel retries the requests a dead daemon held.
nlohmann::json Daemon::DaemonStatusJson() {
  nlohmann::json j = handover_ ? handover_->StatusJson() : UnsupervisedStatusJson(started_at_);
  j["kernel_resend"] = fuse::KernelHasResend(ctx_);
  return j;
}

}  // namespace ckptfs::daemon
