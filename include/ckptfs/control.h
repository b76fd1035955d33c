// The control socket: one Unix stream socket per mount, its path published in
// the xattr user.ckptfs.control of the mount root. A client sends one JSON
// line ({"cmd": "status"}) and reads JSON lines back: zero or more progress
// lines ({"progress": done, "total": n}) for long work, then the answer
// ({"ok": true, ...} or {"ok": false, "error": "..."}). Each connection is
// served on its own thread, so a long preload does not hold up `status`.
// The peer's credentials (SO_PEERCRED) decide:
// queries are open to everyone who can reach the socket; changes are for root
// and the user who mounted.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <functional>
#include <string>
#include <thread>
#include <vector>

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
    gid_t peer_gid = 0;
    std::vector<gid_t> peer_groups;  // supplementary groups (SO_PEERGROUPS)
    bool privileged;  // root or the mount's owner
    const std::atomic<bool>* stopping;  // long work gives up when this turns true
    // Sends a progress line to the client; false once the client has gone.
    std::function<bool(const nlohmann::json&)> progress;
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
  std::mutex conn_mu_;
  std::condition_variable conn_cv_;
  int connections_ = 0;
};

// Client side: sends `request` to the socket and returns the final reply,
// handing progress lines to `on_progress` if given.
Result<nlohmann::json> ControlCall(const std::string& socket_path, const nlohmann::json& request,
                                   const std::function<void(const nlohmann::json&)>& on_progress = nullptr);

}  // namespace ckptfs
