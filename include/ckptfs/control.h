// The control socket: one Unix stream socket per mount, its path published in
// the xattr user.ckptfs.control of the mount root. A client sends one JSON
// line ({"cmd": "status"}) and reads one JSON line back ({"ok": true, ...} or
// {"ok": false, "error": "..."}). The peer's credentials (SO_PEERCRED) decide:
// queries are open to everyone who can reach the socket; changes are for root
// and the user who mounted.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

// Where the control socket of `mountpoint` lives: /run/ckptfs for root,
// $XDG_RUNTIME_DIR/ckptfs otherwise (else the state directory), named by a
// hash of the mount point's canonical path.
std::string ControlSocketPath(const std::string& canonical_mountpoint, const std::string& state_dir);

class ControlServer {
 public:
  struct Request {
    nlohmann::json body;
    uid_t peer_uid;
    bool privileged;  // root or the mount's owner
  };
  using Handler = std::function<nlohmann::json(const Request&)>;

  ControlServer(std::string path, Handler handler) : path_(std::move(path)), handler_(std::move(handler)) {}
  ~ControlServer();  // stops and removes the socket
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  Status Start();
  void Stop();
  const std::string& path() const { return path_; }

 private:
  void Run();
  void Serve(int fd);

  std::string path_;
  Handler handler_;
  UniqueFd listen_;
  UniqueFd wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Client side: sends `request` to the socket and returns the reply.
Result<nlohmann::json> ControlCall(const std::string& socket_path, const nlohmann::json& request);

}  // namespace ckptfs
