#include "ckptfs/command_table.h"

#include <unistd.h>

#include <algorithm>

#include "ckptfs/control_protocol.h"

namespace ckptfs {

CommandTable::CommandTable(std::vector<ControlCommand> commands) : commands_(std::move(commands)) {}

nlohmann::json CommandTable::Dispatch(const ControlServer::Request& r) const {
  // The server only hands over objects with a string "cmd".
  const std::string name = r.body.value(protocol::kCmd, std::string());
  const auto it = std::ranges::find(commands_, name, &ControlCommand::name);
  if (it == commands_.end()) return protocol::ErrorReply("unknown command: " + name);
  if (it->needs_owner && !r.privileged) {
    return protocol::ErrorReply(name + " is for root or the mount's owner (uid " + std::to_string(::geteuid()) +
                                "); you are uid " + std::to_string(r.peer_uid));
  }
  return it->handler(r);
}

ControlServer::Handler CommandTable::AsHandler() const {
  return [this](const ControlServer::Request& r) { return Dispatch(r); };
}

}  // namespace ckptfs
