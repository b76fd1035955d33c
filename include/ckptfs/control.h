// The control socket: one Unix stream socket per mount, its path published in
// the xattr user.ckptfs.control of the mount root. A client sends one JSON
// line ({"cmd": "status"}) and reads JSON lines back: zero or more progress
// lines ({"progress": done, "total": n}) for long work, then the answer
// ({"ok": true, ...} or {"ok": false, "error": "..."}). Paths are bytes and
// travel in the encoding of json_path.h, both ways: handlers see and return
// plain byte strings; the server encodes and decodes.
// The peer's credentials (SO_PEERCRED) decide:
// queries are open to everyone who can reach the socket; changes are for root
// and the user who mounted.
//
// Any local user can connect, so serving is bounded (issues 11 and 21): open
// connections per uid and in all, the size of a request and the time to send
// it, the time a whole reply may take to reach a client that reads slowly,
// and the threads: one accepts and reads requests for all connections, a
// small pool answers queries, of whose threads no uid holds more than
// per_uid_threads at once, a thread of its own answers root and the mount's
// owner (readiness probes, `status`, `ckptfsctl restart`), and a separate
// pool runs long commands (preload), so a long preload never holds up
// `status`. The server never holds more than
// total + 2 * per_uid + 5 descriptors (the connections, the listening socket,
// an eventfd, epoll, a reserve, one client being refused), however many
// clients come; out of descriptors, it refuses with a line and does not spin. No
// exception from a handler, or from encoding its reply, reaches the serving
// threads: the client gets an error line and the server goes on.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/control_protocol.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

class FairPool;
class ThreadPool;

// Where the control socket of `mountpoint` lives: /run/ckptfs for root,
// $XDG_RUNTIME_DIR/ckptfs otherwise (else the state directory), named by a
// hash of the mount point's canonical path.
std::string ControlSocketPath(const std::string& canonical_mountpoint, const std::string& state_dir);

// Raises this process's soft limit on open files to its hard limit and
// returns the new soft limit. The usual soft limit (1024) is a relic of
// select(); a daemon that every engine reads through must not fail a read
// with EIO for want of a descriptor while the hard limit allows more. Meant
// for the daemon's main(), before any thread starts.
Result<rlim_t> RaiseOpenFileLimit();

struct ControlLimits {
  // Open connections of one uid, root's included: a flood from one uid must
  // not shut the others out. ckptfsctl uses one connection per command.
  size_t per_uid = 16;
  // Open connections of unprivileged clients together. Root and the mount's
  // owner are not counted here (only against per_uid), so an admin can still
  // ask `status` while others hold every place.
  size_t total = 128;
  size_t max_request = 64 * 1024;
  // From accept to a whole request line; ckptfsctl sends at once.
  std::chrono::milliseconds request_timeout{5000};
  // How long a whole reply may take to be written to a client that reads
  // slowly (each progress line of long work gets as long): past it the
  // connection is closed. A deadline per write would let a client that
  // reads a little now and then hold a thread for as long as it likes.
  std::chrono::milliseconds reply_timeout{10000};
  unsigned query_threads = 4;
  // At most this many of the query threads answer one uid at once; its
  // other requests wait for them (never for other uids' requests).
  unsigned per_uid_threads = 2;
  // Threads that answer only root and the mount's owner, so that no other
  // uid can keep them waiting.
  unsigned privileged_threads = 1;
  unsigned long_threads = 2;  // at most this many long commands run at once; more wait their turn
  std::vector<std::string> long_commands{std::string(protocol::kPreload)};
};

class ControlServer {
 public:
  struct Request {
    nlohmann::json body;
    uid_t peer_uid;
    gid_t peer_gid = 0;
    std::optional<std::vector<gid_t>> peer_groups;  // supplementary groups (SO_PEERGROUPS); nullopt: unknown
    bool privileged;  // root or the mount's owner
    const std::atomic<bool>* stopping;  // long work gives up when this turns true
    // Sends a progress line to the client; false once the client has gone.
    std::function<bool(const nlohmann::json&)> progress;
  };
  using Handler = std::function<nlohmann::json(const Request&)>;

  ControlServer(std::string path, Handler handler, ControlLimits limits = {});
  ~ControlServer();  // stops and removes the socket
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // `take_over`: this daemon takes the mount over from one still serving
  // it (a hand-over), and replaces the socket that one listens on. Without
  // it a socket that a live server still answers on is left alone and
  // Start fails: it belongs to another mount of the same mount point.
  Status Start(bool take_over = false);
  void Stop();
  const std::string& path() const { return path_; }

 private:
  struct Connection;
  class Admissions;
  using ConnectionPtr = std::shared_ptr<Connection>;

  // The accepting and reading thread.
  void Run();
  void RunOnce();
  int NextTimeoutMs() const;
  void AcceptAll();
  bool RefuseWithReserveFd();
  void LogRefusal(const std::string& why);
  void Admit(UniqueFd fd);
  void ReadRequest(int fd);
  void Dispatch(int fd, std::string line);
  void Drop(int fd, const std::string& why);
  void ExpireIdle();
  // On a pool thread.
  void Serve(Connection& c, nlohmann::json body);
  nlohmann::json Answer(Connection& c, nlohmann::json body);

  std::string path_;
  Handler handler_;
  ControlLimits limits_;
  UniqueFd listen_;
  ino_t bound_ino_ = 0;  // the socket file this server bound (Stop removes only that one)
  UniqueFd wake_;
  UniqueFd epoll_;
  UniqueFd reserve_;  // closed to accept-and-refuse a client when descriptors run out
  std::atomic<bool> stop_{false};
  std::unique_ptr<Admissions> admissions_;
  std::unique_ptr<FairPool> query_pool_;
  std::unique_ptr<ThreadPool> privileged_pool_;
  std::unique_ptr<ThreadPool> long_pool_;
  std::thread thread_;
  // Owned by the accepting thread: connections still sending their request.
  std::unordered_map<int, ConnectionPtr> reading_;
  std::chrono::steady_clock::time_point accept_paused_until_{};
  std::chrono::steady_clock::time_point last_refusal_log_{};
  uint64_t refusals_unlogged_ = 0;
};

// Client side: sends `request` to the socket and returns the final reply,
// handing progress lines to `on_progress` if given. Non-UTF-8 strings in the
// request are encoded; the reply comes back as sent (encoded): apply
// DecodeJsonPaths before using its paths as bytes. `silence` is the longest
// wait for a line (long work sends progress every few seconds).
Result<nlohmann::json> ControlCall(const std::string& socket_path, const nlohmann::json& request,
                                   const std::function<void(const nlohmann::json&)>& on_progress = nullptr,
                                   std::chrono::milliseconds silence = std::chrono::minutes(10));

// Connects to a control socket (blocking, close-on-exec); the error names it.
Result<UniqueFd> ConnectControlSocket(const std::string& socket_path);
// ControlCall on a connection made already (whose peer the caller may have
// checked first): `encoded` is the request with its paths encoded.
Result<nlohmann::json> ControlExchange(int fd, const std::string& socket_path, const nlohmann::json& encoded,
                                       const std::function<void(const nlohmann::json&)>& on_progress,
                                       std::chrono::milliseconds silence);
// Whether a server listens on `socket_path` now (a connection is accepted
// into its backlog), as opposed to a socket file left by a dead one.
bool ControlSocketAnswers(const std::string& socket_path);

}  // namespace ckptfs
