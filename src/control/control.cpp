#include "ckptfs/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "ckptfs/fair_pool.h"
#include "ckptfs/hashes.h"
#include "ckptfs/json_path.h"
#include "ckptfs/mutex.h"
#include "ckptfs/thread_pool.h"

namespace ckptfs {

namespace {

using Clock = std::chrono::steady_clock;

// How long accepting pauses when no descriptor is left even to refuse a
// client: the listening socket stays readable, and retrying at once would
// spin a core.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// How long Start waits for an unmounting daemon of the same mount point to
// let go of the control socket.
constexpr auto kUnmountingPredecessorWait = std::chrono::seconds(5);
// One line in this long about refused clients, with the count since the last.
constexpr auto kRefusalLogEvery = std::chrono::seconds(10);

// Writes all of `data` to a non-blocking socket by `deadline`, waiting for
// room in between; a client that has not taken it all by then is given up.
Status WriteAllBy(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::FromErrno("control socket write", errno);
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      return Status::Error("the client took no more than " + std::to_string(done) + " of " +
                           std::to_string(data.size()) + " bytes of its reply in time; closing");
    }
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000))) < 0 && errno != EINTR) {
      return Status::FromErrno("control socket poll", errno);
    }
  }
  return Status::Ok();
}

// A blocking client's write (ckptfsctl's request).
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

// The peer's supplementary groups, as the kernel recorded them at connect;
// nullopt when they cannot be read (then a decision that depends on them
// grants only what any groups would: ckptfs/ownership.h).
std::optional<std::vector<gid_t>> PeerGroups(int fd) {
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
  return std::nullopt;
}

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size() + 1, sizeof addr.sun_path));
  return addr;
}

nlohmann::json ErrorReply(const std::string& why) { return {{"ok", false}, {"error", why}}; }

// `message` as one line of JSON, paths encoded. Never throws for want of
// UTF-8: a message that still cannot be written becomes an error line.
std::string DumpLine(nlohmann::json message) {
  std::string why;
  try {
    if (Status s = EncodeJsonPaths(message); !s.ok()) {
      why = s.message();
    } else {
      return message.dump() + "\n";
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  spdlog::error("control: a reply cannot be sent as JSON: {}", why);
  return ErrorReply("internal error: the reply cannot be sent as JSON: " + DisplayBytes(why))
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

// A short line to a client about to be closed, without waiting for it.
void SendNow(int fd, const std::string& why) {
  const std::string line = DumpLine(ErrorReply(why));
  if (::send(fd, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    spdlog::debug("control: cannot tell a client '{}': {}", why, std::strerror(errno));
  }
}

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

// Root and the user who mounted: they may change the mount, and have
// threads of their own.
bool IsPrivileged(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

}  // namespace

// Counts open connections per uid and of unprivileged clients in all; a
// Ticket holds one place and gives it back when the connection closes.
class ControlServer::Admissions {
 public:
  class Ticket {
   public:
    Ticket(Admissions* owner, uid_t uid, bool in_total) : owner_(owner), uid_(uid), in_total_(in_total) {}
    Ticket(Ticket&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), uid_(o.uid_), in_total_(o.in_total_) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket() {
      if (owner_ != nullptr) owner_->Release(uid_, in_total_);
    }

   private:
    Admissions* owner_;
    uid_t uid_;
    bool in_total_;
  };

  explicit Admissions(const ControlLimits& limits) : limits_(limits) {}

  Result<Ticket> Admit(uid_t uid, bool privileged) {
    MutexLock lock(mu_);
    const auto it = per_uid_.find(uid);
    if (it != per_uid_.end() && it->second >= limits_.per_uid) {
      return Status::Error("too many control connections from uid " + std::to_string(uid) + " (limit " +
                           std::to_string(limits_.per_uid) + "); closing");
    }
    if (!privileged && total_ >= limits_.total) {
      return Status::Error("too many control connections (limit " + std::to_string(limits_.total) + "); closing");
    }
    ++per_uid_[uid];
    if (!privileged) ++total_;
    return Ticket(this, uid, !privileged);
  }

 private:
  void Release(uid_t uid, bool in_total) {
    MutexLock lock(mu_);
    if (auto it = per_uid_.find(uid); it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
    if (in_total) --total_;
  }

  const ControlLimits limits_;
  Mutex mu_;
  std::map<uid_t, size_t> per_uid_ GUARDED_BY(mu_);
  size_t total_ GUARDED_BY(mu_) = 0;
};

struct ControlServer::Connection {
  UniqueFd fd;
  ucred peer{};
  Clock::time_point deadline;
  std::string in;  // the request as read so far
  Admissions::Ticket ticket;
  std::optional<std::vector<gid_t>> groups;  // the peer's supplementary groups, at connect
};

std::string ControlSocketPath(const std::string& canonical_mountpoint, const std::string& state_dir) {
  const std::string name = ToHex(Sha256Of(canonical_mountpoint)).substr(0, 16) + ".sock";
  if (::geteuid() == 0) return "/run/ckptfs/" + name;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/ckptfs/" + name;
  }
  return state_dir + "/" + name;
}

Result<rlim_t> RaiseOpenFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return Status::FromErrno("getrlimit(RLIMIT_NOFILE)", errno);
  rlim_t target = lim.rlim_max;
  if (target == RLIM_INFINITY) {
    // No descriptor table grows past fs.nr_open; asking for more fails.
    target = 1 << 20;
    if (std::FILE* f = std::fopen("/proc/sys/fs/nr_open", "re")) {
      unsigned long long v = 0;
      if (std::fscanf(f, "%llu", &v) == 1 && v > 0) target = static_cast<rlim_t>(v);
      std::fclose(f);
    }
  }
  if (lim.rlim_cur >= target) return lim.rlim_cur;
  lim.rlim_cur = target;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    return Status::FromErrno("setrlimit(RLIMIT_NOFILE) to " + std::to_string(target), errno);
  }
  return lim.rlim_cur;
}

ControlServer::ControlServer(std::string path, Handler handler, ControlLimits limits)
    : path_(std::move(path)),
      handler_(std::move(handler)),
      limits_(std::move(limits)),
      admissions_(std::make_unique<Admissions>(limits_)) {}

ControlServer::~ControlServer() { Stop(); }

Status ControlServer::Start(bool take_over) {
  if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::Error("control socket path too long: " + path_);
  }
  const std::string dir = path_.substr(0, path_.rfind('/'));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::FromErrno("cannot create " + dir, errno);
  }
  listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_.valid()) return Status::FromErrno("socket", errno);
  // A socket left by a killed daemon of this mount point is replaced; one
  // that a live server answers on is another mount's (or, when taking
  // over, the predecessor's, which stops listening once it drains).
  // A daemon of this mount point that is unmounting answers until it has
  // let go of its socket: a mount right after an unmount (a remount, or a
  // restart by hand) waits for that, a short while, rather than coming up
  // with no control socket.
  for (auto waited = std::chrono::milliseconds(0);
       !take_over && waited < kUnmountingPredecessorWait && ControlSocketAnswers(path_);
       waited += std::chrono::milliseconds(50)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!take_over && ControlSocketAnswers(path_)) {
    listen_.reset();
    return Status::Error("control socket " + path_ + " is in use by another live daemon (another mount of the same "
                         "mount point?); leaving it alone");
  }
  ::unlink(path_.c_str());
  sockaddr_un addr = Address(path_);
  if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno("cannot bind control socket " + path_, errno);
  }
  // Everyone may connect; what they may do is decided per request.
  ::chmod(path_.c_str(), 0666);
  struct stat bound {};
  if (::stat(path_.c_str(), &bound) == 0) bound_ino_ = bound.st_ino;
  if (::listen(listen_.get(), 128) != 0) return Status::FromErrno("listen " + path_, errno);
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  reserve_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!wake_.valid() || !epoll_.valid() || !reserve_.valid()) {
    return Status::FromErrno("control socket " + path_ + ": eventfd, epoll or /dev/null", errno);
  }
  for (int fd : {listen_.get(), wake_.get()}) {
    epoll_event ev{EPOLLIN, {.fd = fd}};
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl " + path_, errno);
  }
  const unsigned query_threads = std::max(1u, limits_.query_threads);
  // Never every query thread for one uid, when there is more than one.
  const unsigned per_uid = std::clamp(limits_.per_uid_threads, 1u, std::max(1u, query_threads - 1));
  query_pool_ = std::make_unique<FairPool>(query_threads, per_uid);
  privileged_pool_ = std::make_unique<ThreadPool>(std::max(1u, limits_.privileged_threads));
  long_pool_ = std::make_unique<ThreadPool>(std::max(1u, limits_.long_threads));
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void ControlServer::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
  }
  thread_.join();  // closes the connections still sending requests
  // Queued requests are answered "stopping"; running handlers watch stop_.
  query_pool_.reset();
  privileged_pool_.reset();
  long_pool_.reset();
  // A daemon that handed the mount over leaves the successor's socket alone.
  struct stat now {};
  if (::stat(path_.c_str(), &now) == 0 && now.st_ino == bound_ino_) ::unlink(path_.c_str());
}

void ControlServer::Run() {
  while (!stop_) {
    try {
      RunOnce();
    } catch (const std::exception& e) {  // bad_alloc and the like: keep serving
      spdlog::error("control socket {}: {}", path_, e.what());
      std::this_thread::sleep_for(kAcceptPause);
    }
  }
  reading_.clear();
}

void ControlServer::RunOnce() {
  epoll_event events[64];
  const int n = ::epoll_wait(epoll_.get(), events, 64, NextTimeoutMs());
  if (n < 0 && errno != EINTR) {
    spdlog::error("control socket {}: epoll_wait: {}", path_, std::strerror(errno));
    std::this_thread::sleep_for(kAcceptPause);
  }
  for (int i = 0; i < n && !stop_; ++i) {
    const int fd = events[i].data.fd;
    try {
      if (fd == listen_.get()) {
        AcceptAll();
      } else if (fd != wake_.get()) {
        ReadRequest(fd);
      }
    } catch (const std::exception& e) {  // drop the one connection it happened on
      spdlog::error("control socket {}: {}", path_, e.what());
      if (fd != listen_.get()) reading_.erase(fd);
    }
  }
  ExpireIdle();
  if (accept_paused_until_ != Clock::time_point{} && Clock::now() >= accept_paused_until_) {
    accept_paused_until_ = {};
    epoll_event ev{EPOLLIN, {.fd = listen_.get()}};
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listen_.get(), &ev);
  }
}

// Until the earliest request deadline or the end of an accept pause.
int ControlServer::NextTimeoutMs() const {
  Clock::time_point next = accept_paused_until_;
  for (const auto& [fd, c] : reading_) {
    if (next == Clock::time_point{} || c->deadline < next) next = c->deadline;
  }
  if (next == Clock::time_point{}) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 60000));
}

void ControlServer::AcceptAll() {
  for (int k = 0; k < 64; ++k) {  // then let the others' requests be read
    int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Admit(UniqueFd(fd));
      continue;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EMFILE || err == ENFILE) {
      if (RefuseWithReserveFd()) continue;  // one client told why; more may wait
      if (reserve_.valid()) return;         // nobody was waiting after all
    } else {
      LogRefusal("accept: " + std::string(std::strerror(err)));
    }
    // Nothing to accept with: stop watching the socket for a moment.
    accept_paused_until_ = Clock::now() + kAcceptPause;
    epoll_event ev{0, {.fd = listen_.get()}};
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listen_.get(), &ev);
    return;
  }
}

// Out of descriptors: gives up the reserve for a moment to accept one client
// and tell it why it is refused. True when a client was refused and the
// reserve is back.
bool ControlServer::RefuseWithReserveFd() {
  if (!reserve_.valid()) {
    reserve_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return false;
  }
  reserve_.reset();
  UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  const bool refused = fd.valid();
  if (refused) {
    const std::string why = "the daemon is out of file descriptors; try again later";
    SendNow(fd.get(), why);
    LogRefusal(why);
  }
  fd.reset();
  reserve_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return refused && reserve_.valid();
}

// One line per kRefusalLogEvery about refused clients, with a count: a flood
// must not become a flood of log lines.
void ControlServer::LogRefusal(const std::string& why) {
  ++refusals_unlogged_;
  if (Clock::now() - last_refusal_log_ < kRefusalLogEvery) return;
  spdlog::warn("control socket {}: {} ({} client(s) refused since the last such line)", path_, why,
               refusals_unlogged_);
  last_refusal_log_ = Clock::now();
  refusals_unlogged_ = 0;
}

void ControlServer::Admit(UniqueFd fd) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) return;
  auto ticket = admissions_->Admit(peer.uid, IsPrivileged(peer.uid));
  if (!ticket.ok()) {
    SendNow(fd.get(), ticket.status().message());
    LogRefusal(ticket.status().message());
    return;
  }
  const int raw = fd.get();
  std::optional<std::vector<gid_t>> groups = PeerGroups(fd.get());
  auto c = std::make_shared<Connection>(Connection{std::move(fd), peer, Clock::now() + limits_.request_timeout, {},
                                                   std::move(*ticket), std::move(groups)});
  epoll_event ev{EPOLLIN | EPOLLRDHUP, {.fd = raw}};
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) {
    spdlog::error("control socket {}: epoll_ctl: {}", path_, std::strerror(errno));
    return;
  }
  reading_.emplace(raw, std::move(c));
}

void ControlServer::ReadRequest(int fd) {
  auto it = reading_.find(fd);
  if (it == reading_.end()) return;
  Connection& c = *it->second;
  char buf[16384];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) reading_.erase(it);
    return;
  }
  if (n == 0) {  // the client is done sending: what came is the request
    if (c.in.empty()) {
      reading_.erase(it);
    } else {
      Dispatch(fd, std::move(c.in));
    }
    return;
  }
  c.in.append(buf, static_cast<size_t>(n));
  if (const size_t nl = c.in.find('\n'); nl != std::string::npos && nl <= limits_.max_request) {
    c.in.resize(nl);
    Dispatch(fd, std::move(c.in));
  } else if (c.in.size() > limits_.max_request) {
    Drop(fd, "control request longer than " + std::to_string(limits_.max_request) + " bytes; closing");
  }
}

// Tells the client why and closes its connection.
void ControlServer::Drop(int fd, const std::string& why) {
  SendNow(fd, why);
  reading_.erase(fd);
}

void ControlServer::ExpireIdle() {
  const auto now = Clock::now();
  std::vector<int> late;
  for (const auto& [fd, c] : reading_) {
    if (c->deadline <= now) late.push_back(fd);
  }
  for (int fd : late) {
    Drop(fd, "no complete request within " + Millis(limits_.request_timeout) + "; closing");
  }
}

// Hands a whole request to a pool: long commands to their own, so that they
// cannot take every thread that answers queries; root's and the owner's
// queries to theirs, so that nobody else's can delay them; everyone else's
// to the shared pool, no uid holding more than its share of it.
void ControlServer::Dispatch(int fd, std::string line) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  ConnectionPtr c = std::move(reading_.at(fd));
  reading_.erase(fd);
  nlohmann::json body = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const bool is_long = body.is_object() && body.contains("cmd") && body["cmd"].is_string() &&
                       std::ranges::find(limits_.long_commands, body["cmd"].get<std::string>()) !=
                           limits_.long_commands.end();
  auto serve = [this, c, body = std::move(body)]() mutable { Serve(*c, std::move(body)); };
  // Long commands change the mount: only root's and the owner's can run
  // long; anyone else's are refused at once, from the shared pool.
  const bool privileged = IsPrivileged(c->peer.uid);
  if (is_long && privileged) {
    long_pool_->Submit(std::move(serve));
  } else if (privileged) {
    privileged_pool_->Submit(std::move(serve));
  } else {
    query_pool_->Submit(c->peer.uid, std::move(serve));
  }
}

void ControlServer::Serve(Connection& c, nlohmann::json body) {
  try {
    // The whole reply has reply_timeout to reach the client, however it
    // reads, so a thread is never held longer than that by one client.
    nlohmann::json reply = Answer(c, std::move(body));
    if (Status s = WriteAllBy(c.fd.get(), DumpLine(std::move(reply)), Clock::now() + limits_.reply_timeout); !s.ok()) {
      spdlog::debug("control: uid {}: {}", c.peer.uid, s.message());
    }
  } catch (const std::exception& e) {
    spdlog::error("control socket {}: uid {}: {}", path_, c.peer.uid, e.what());
  } catch (...) {
    spdlog::error("control socket {}: uid {}: unknown exception", path_, c.peer.uid);
  }
}

nlohmann::json ControlServer::Answer(Connection& c, nlohmann::json body) {
  if (stop_) return ErrorReply("the daemon is stopping");
  if (body.is_discarded() || !body.is_object() || !body.contains("cmd") || !body["cmd"].is_string()) {
    return ErrorReply("malformed request: expected a JSON object with a string \"cmd\"");
  }
  if (Status s = DecodeJsonPaths(body); !s.ok()) return ErrorReply("malformed request: " + s.message());
  const std::string cmd = DisplayBytes(body.value("cmd", std::string()));
  Request req;
  req.body = std::move(body);
  req.peer_uid = c.peer.uid;
  req.peer_gid = c.peer.gid;
  req.peer_groups = c.groups;
  req.privileged = IsPrivileged(c.peer.uid);
  req.stopping = &stop_;
  const int fd = c.fd.get();
  const auto timeout = limits_.reply_timeout;
  req.progress = [fd, timeout](const nlohmann::json& p) { return WriteAllBy(fd, DumpLine(p), Clock::now() + timeout).ok(); };
  try {
    return handler_(req);
  } catch (const std::exception& e) {
    spdlog::error("control: {} from uid {} failed: {}", cmd, c.peer.uid, e.what());
    return ErrorReply(std::string("internal error: ") + e.what());
  } catch (...) {
    spdlog::error("control: {} from uid {} failed: unknown exception", cmd, c.peer.uid);
    return ErrorReply("internal error: unknown exception");
  }
}

Result<UniqueFd> ConnectControlSocket(const std::string& socket_path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno("socket", errno);
  sockaddr_un addr = Address(socket_path);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno("cannot connect to the control socket " + socket_path, errno);
  }
  return fd;
}

bool ControlSocketAnswers(const std::string& socket_path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return false;
  sockaddr_un addr = Address(socket_path);
  // Non-blocking: a live server with a full backlog answers EAGAIN, which
  // is as alive as an accepted connection; a dead one's file ECONNREFUSED.
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return true;
  return errno == EAGAIN || errno == EINPROGRESS;
}

Result<nlohmann::json> ControlCall(const std::string& socket_path, const nlohmann::json& request,
                                   const std::function<void(const nlohmann::json&)>& on_progress,
                                   std::chrono::milliseconds silence) {
  nlohmann::json encoded = request;
  if (Status s = EncodeJsonPaths(encoded); !s.ok()) return Status::Error("cannot encode the request: " + s.message());
  auto fd = ConnectControlSocket(socket_path);
  if (!fd.ok()) return fd.status();
  return ControlExchange(fd->get(), socket_path, encoded, on_progress, silence);
}

Result<nlohmann::json> ControlExchange(int fd, const std::string& socket_path, const nlohmann::json& encoded,
                                       const std::function<void(const nlohmann::json&)>& on_progress,
                                       std::chrono::milliseconds silence) {
  // A server that refuses the connection (too many from this uid) says why
  // and closes, perhaps before the request is written: read its line anyway.
  const Status sent = WriteAll(fd, encoded.dump() + "\n");
  std::string pending;
  const int wait_ms = static_cast<int>(std::clamp<int64_t>(silence.count(), 1, INT32_MAX));
  for (;;) {
    auto line = ReadLine(fd, 64 << 20, sent.ok() ? wait_ms : 1000, pending);
    if (!line.ok()) return sent.ok() ? line.status() : sent;
    auto reply = nlohmann::json::parse(*line, nullptr, false);
    if (reply.is_discarded() || !reply.is_object()) return Status::Error("malformed reply from " + socket_path);
    if (reply.contains("progress")) {
      if (on_progress) on_progress(reply);
      continue;
    }
    return reply;
  }
}

}  // namespace ckptfs
