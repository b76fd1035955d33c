#include "ckptfs/control.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "ckptfs/hashes.h"

namespace ckptfs {

namespace {

constexpr size_t kMaxRequest = 64 * 1024;

Status WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("control socket write", errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads one '\n'-terminated line (without it), at most `limit` bytes;
// `pending` keeps what was read past the line for the next call.
Result<std::string> ReadLine(int fd, size_t limit, int timeout_ms, std::string& pending) {
  std::string& line = pending;
  char buf[4096];
  for (;;) {
    if (auto nl = line.find('\n'); nl != std::string::npos) {
      std::string out = line.substr(0, nl);
      line.erase(0, nl + 1);
      return out;
    }
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r == 0) return Status::Error("timed out waiting for the control socket");
    if (r < 0 && errno != EINTR) return Status::FromErrno("control socket", errno);
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("control socket read", errno);
    }
    if (n == 0) return line.empty() ? Result<std::string>(Status::Error("control socket closed")) : line;
    line.append(buf, static_cast<size_t>(n));
    if (line.size() > limit && line.find('\n') == std::string::npos) return Status::Error("control message too long");
  }
}

// The peer's supplementary groups, as the kernel recorded them at connect.
std::vector<gid_t> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t) + 1);
  }
  return {};  // unknown: judged as in no supplementary group
}

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size() + 1, sizeof addr.sun_path));
  return addr;
}

}  // namespace

std::string ControlSocketPath(const std::string& canonical_mountpoint, const std::string& state_dir) {
  const std::string name = ToHex(Sha256Of(canonical_mountpoint)).substr(0, 16) + ".sock";
  if (::geteuid() == 0) return "/run/ckptfs/" + name;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/ckptfs/" + name;
  }
  return state_dir + "/" + name;
}

ControlServer::~ControlServer() { Stop(); }

Status ControlServer::Start() {
  if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::Error("control socket path too long: " + path_);
  }
  const std::string dir = path_.substr(0, path_.rfind('/'));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::FromErrno("cannot create " + dir, errno);
  }
  listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_.valid()) return Status::FromErrno("socket", errno);
  ::unlink(path_.c_str());  // a stale socket of a killed daemon for the same mount point
  sockaddr_un addr = Address(path_);
  if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno("cannot bind control socket " + path_, errno);
  }
  // Everyone may connect; what they may do is decided per request.
  ::chmod(path_.c_str(), 0666);
  if (::listen(listen_.get(), 16) != 0) return Status::FromErrno("listen " + path_, errno);
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void ControlServer::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
  }
  thread_.join();
  std::unique_lock lock(conn_mu_);
  conn_cv_.wait(lock, [this] { return connections_ == 0; });  // handlers watch stop_
  ::unlink(path_.c_str());
}

void ControlServer::Run() {
  while (!stop_) {
    pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents & POLLIN) break;
    if (!(fds[0].revents & POLLIN)) continue;
    int conn = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    {
      std::lock_guard lock(conn_mu_);
      ++connections_;
    }
    std::thread([this, conn] {
      UniqueFd owned(conn);
      Serve(owned.get());
      std::lock_guard lock(conn_mu_);
      --connections_;
      conn_cv_.notify_all();
    }).detach();
  }
}

void ControlServer::Serve(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
  nlohmann::json reply;
  std::string pending;
  auto line = ReadLine(fd, kMaxRequest, 5000, pending);
  if (!line.ok()) {
    reply = {{"ok", false}, {"error", line.status().message()}};
  } else {
    Request req;
    req.body = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
    req.peer_uid = cred.uid;
    req.peer_gid = cred.gid;
    req.peer_groups = PeerGroups(fd);
    req.privileged = cred.uid == 0 || cred.uid == ::geteuid();
    req.stopping = &stop_;
    req.progress = [fd](const nlohmann::json& p) { return WriteAll(fd, p.dump() + "\n").ok(); };
    if (req.body.is_discarded() || !req.body.is_object() || !req.body.contains("cmd") ||
        !req.body["cmd"].is_string()) {
      reply = {{"ok", false}, {"error", "malformed request: expected a JSON object with a string \"cmd\""}};
    } else {
      try {
        reply = handler_(req);
      } catch (const std::exception& e) {
        reply = {{"ok", false}, {"error", std::string("internal error: ") + e.what()}};
      }
    }
  }
  if (Status s = WriteAll(fd, reply.dump() + "\n"); !s.ok()) spdlog::debug("{}", s.message());
}

Result<nlohmann::json> ControlCall(const std::string& socket_path, const nlohmann::json& request,
                                   const std::function<void(const nlohmann::json&)>& on_progress) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno("socket", errno);
  sockaddr_un addr = Address(socket_path);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno("cannot connect to the control socket " + socket_path, errno);
  }
  if (Status s = WriteAll(fd.get(), request.dump() + "\n"); !s.ok()) return s;
  std::string pending;
  for (;;) {
    // Long work sends progress at least every few seconds; silence this long means trouble.
    auto line = ReadLine(fd.get(), 64 << 20, 600000, pending);
    if (!line.ok()) return line.status();
    auto reply = nlohmann::json::parse(*line, nullptr, false);
    if (reply.is_discarded()) return Status::Error("malformed reply from " + socket_path);
    if (reply.contains("progress")) {
      if (on_progress) on_progress(reply);
      continue;
    }
    return reply;
  }
}

}  // namespace ckptfs
