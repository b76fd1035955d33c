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
            auto status = StatusJson(visible(r), *watcher_, facts, ctx_);
            AddFleetStatus(status, manifests_.get(), source_fs_, options_);
            return status;
          }),
      row(protocol::kLs, [this, visible](const Request& r) { return LsJson(visible(r), *view_, options_.source); }),
      row(protocol::kStats,
          [this, visible](const Request& r) {
            return HandleStats(ctx_, VisibleByName(visible(r), *view_, options_.source));
          }),
      row(protocol::kPreload, [this](const Request& r) { return HandlePreload(ctx_, r); }),
      row(protocol::kUnpin, [this](const Request& r) { return HandleUnpin(ctx_, r); }),
      row(protocol::kEvict, [this](const Request& r) { return HandleEvict(ctx_, r); }),
      row(protocol::kRescan,
          [this](const Request&) {
            watcher_->RequestRescan();
            return protocol::OkReply();
          }),
  });
}

}  // namespace ckptfs::daemon
