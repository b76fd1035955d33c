// The daemon's control commands as data: a table of {name, needs owner,
// handler}. The table, not each handler, refuses a change asked by someone
// who is neither root nor the mount's owner, and answers an unknown command,
// so a new command is one row and cannot forget the check.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/control.h"

namespace ckptfs {

struct ControlCommand {
  std::string name;
  bool needs_owner;  // a change: root or the mount's owner only
  ControlServer::Handler handler;
};

class CommandTable {
 public:
  explicit CommandTable(std::vector<ControlCommand> commands);

  // The reply to `r`: the handler's, or an error for an unknown command or
  // a caller who may not run it. Handler exceptions pass through (the
  // ControlServer turns them into error replies).
  nlohmann::json Dispatch(const ControlServer::Request& r) const;

  // Dispatch as a ControlServer handler; the table must outlive the server.
  ControlServer::Handler AsHandler() const;

  const std::vector<ControlCommand>& commands() const { return commands_; }

 private:
  std::vector<ControlCommand> commands_;
};

}  // namespace ckptfs
