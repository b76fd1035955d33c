#include "connection_io.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include <spdlog/spdlog.h>

#include "ckptfs/fuse_ops.h"
#include "ckptfs/mutex.h"
#include "passthrough_shim.h"

namespace ckptfs::fuse {

namespace {

// The kernel ABI, include/uapi/linux/fuse.h (offsets of the packed structs).
constexpr uint32_t kOpInit = 26;
constexpr size_t kInHeaderSize = 40;     // struct fuse_in_header
constexpr size_t kOutHeaderSize = 16;    // struct fuse_out_header
constexpr size_t kInitInMinor = 4;       // fuse_init_in.minor
constexpr size_t kInitInFlags = 12;      // fuse_init_in.flags
constexpr size_t kInitInFlags2 = 16;     // fuse_init_in.flags2
constexpr uint32_t kInitExt = 1u << 30;  // FUSE_INIT_EXT
constexpr uint32_t kHasResendFlags2 = 1u << (39 - 32);  // FUSE_HAS_RESEND
constexpr int32_t kNotifyResend = 7;     // FUSE_NOTIFY_RESEND
constexpr std::chrono::seconds kAdmitTimeout{30};
constexpr auto kWakeEvery = std::chrono::milliseconds(5);

// The signal that wakes a reader blocked in read() on a channel: its handler
// does nothing, and it is installed without SA_RESTART, so the read returns
// EINTR. It is sent only to a thread that is in (or about to enter) that
// read; one that has just left it to serve a request may still get it, so
// the request path's calls into the source retry on EINTR (retry_eintr.h;
// its reads loop on it too).
int WakeSignal() { return SIGRTMIN + 2; }
void IgnoreWake(int) {}
void InstallWakeHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = IgnoreWake;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(WakeSignal(), &sa, nullptr);
  });
}

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

ConnectionIo& IoOf(void* userdata) { return *static_cast<FsContext*>(userdata)->connection; }
ssize_t IoRead(int fd, void* buf, size_t len, void* userdata) { return IoOf(userdata).Read(fd, buf, len); }
ssize_t IoWritev(int fd, struct iovec* iov, int count, void* userdata) { return IoOf(userdata).Writev(fd, iov, count); }

}  // namespace

// A thread that reads requests from a channel. Only the session loop's
// threads read, and they end before the connection does, so a registration
// never outlives its ConnectionIo; the destructor still clears `io`.
struct ConnectionIo::Reader {
  std::atomic<ConnectionIo*> io{nullptr};
  pthread_t thread{};
  int channel = -1;
  std::atomic<bool> in_read{false};
  uint64_t unique = 0;  // of the last request it read: its reply goes back on `channel`
  ~Reader() {
    if (ConnectionIo* owner = io.load()) owner->Forget(*this);
  }
};

ConnectionIo::ConnectionIo(Options options) : options_(std::move(options)) {
  if (!options_.channels.empty()) InstallWakeHandler();
}

ConnectionIo::~ConnectionIo() {
  destroying_ = true;
  if (waker_.joinable()) waker_.join();
  MutexLock lock(readers_mu_);
  for (Reader* r : readers_) r->io = nullptr;
}

namespace {
thread_local int reply_via = -1;  // ConnectionIo::ReplyVia
}  // namespace

int ConnectionIo::ChannelOfThisThread() {
  Reader& me = ThisThreadsReader();
  return me.io.load() != nullptr ? me.channel : -1;
}

ConnectionIo::ReplyVia::ReplyVia(int channel) : previous_(reply_via) { reply_via = channel; }
ConnectionIo::ReplyVia::~ReplyVia() { reply_via = previous_; }

ConnectionIo::Reader& ConnectionIo::ThisThreadsReader() {
  thread_local Reader reader;
  return reader;
}

ConnectionIo::Reader& ConnectionIo::ThisThread() {
  Reader& reader = ThisThreadsReader();
  if (reader.io.load() != this) {
    if (ConnectionIo* before = reader.io.load()) before->Forget(reader);
    reader.thread = ::pthread_self();
    reader.channel = options_.channels[next_channel_++ % options_.channels.size()].get();
    MutexLock lock(readers_mu_);
    reader.io = this;
    readers_.push_back(&reader);
  }
  return reader;
}

void ConnectionIo::Forget(Reader& reader) {
  MutexLock lock(readers_mu_);
  std::erase(readers_, &reader);
  reader.io = nullptr;
}

ConnectionIo::Reader* ConnectionIo::Registered() {
  Reader& me = ThisThreadsReader();
  return me.io.load() == this ? &me : nullptr;
}

// Each reader in read() is signalled, again and again (the signal may come
// just before it enters the read) until none is: a reader not in read()
// now sees draining_ before its next one (it sets in_read before it looks,
// Drain sets draining_ before this runs; both sequentially consistent).
void ConnectionIo::WakeReaders() {
  while (!destroying_.load()) {
    bool any = false;
    {
      MutexLock lock(readers_mu_);
      for (Reader* r : readers_) {
        if (!r->in_read.load()) continue;
        any = true;
        ::pthread_kill(r->thread, WakeSignal());
      }
    }
    if (!any) return;
    std::this_thread::sleep_for(kWakeEvery);
  }
}

Status ConnectionIo::Install(fuse_session* se, int fd) {
  fd_ = fd;
  drain_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!drain_.valid()) return Status::FromErrno("eventfd for the FUSE connection", errno);
  fuse_custom_io io{};
  io.read = IoRead;
  io.writev = IoWritev;
  if (int rc = fuse_session_custom_io(se, &io, fd); rc != 0) {
    return Status::Error("libfuse refused the custom io of the FUSE connection: " + std::string(std::strerror(-rc)));
  }
  return Status::Ok();
}

void ConnectionIo::Admit() {
  MutexLock lock(mu_);
  admitted_ = true;
  init_cv_.NotifyAll();
}

void ConnectionIo::Drain() {
  draining_ = true;
  uint64_t one = 1;
  if (::write(drain_.get(), &one, sizeof one) < 0) {
    // The eventfd cannot be full after one write; draining_ is set anyway.
  }
  {
    MutexLock lock(mu_);
    init_cv_.NotifyAll();
  }
  if (!options_.channels.empty() && !waker_.joinable()) waker_ = std::thread([this] { WakeReaders(); });
}

Status ConnectionIo::Resend() {
  // struct fuse_out_header: len, error (the notify code), unique 0.
  uint8_t msg[kOutHeaderSize] = {};
  const uint32_t len = kOutHeaderSize;
  std::memcpy(msg, &len, 4);
  std::memcpy(msg + 4, &kNotifyResend, 4);
  if (::write(fd_, msg, sizeof msg) != static_cast<ssize_t>(sizeof msg)) {
    return Status::FromErrno("FUSE_NOTIFY_RESEND (it needs Linux 6.9+)", errno);
  }
  return Status::Ok();
}

std::vector<uint8_t> ConnectionIo::init_request() const {
  MutexLock lock(mu_);
  return init_request_;
}

void ConnectionIo::SeeInitRequest(const uint8_t* p, size_t n) {
  init_unique_ = Load64(p + 8);
  if (n >= kInHeaderSize + kInitInFlags2 + 4) {
    const uint32_t minor = Load32(p + kInHeaderSize + kInitInMinor);
    const uint32_t flags = Load32(p + kInHeaderSize + kInitInFlags);
    const uint32_t flags2 = (flags & kInitExt) ? Load32(p + kInHeaderSize + kInitInFlags2) : 0;
    has_resend_ = minor >= 40 && (flags2 & kHasResendFlags2) != 0;
  }
  if (options_.passthrough != nullptr) options_.passthrough->OnInitRequest(p, n);
  {
    MutexLock lock(mu_);
    init_request_.assign(p, p + n);
  }
  if (options_.adopted_init.empty() && options_.on_init_request) options_.on_init_request(init_request());
}

void ConnectionIo::InitDone() {
  MutexLock lock(mu_);
  init_done_ = true;
  init_replied_ = true;
  init_cv_.NotifyAll();
}

ssize_t ConnectionIo::Read(int fd, void* buf, size_t len) {
  const auto& adopted = options_.adopted_init;
  if (!adopted.empty()) {
    if (!adopted_handed_.exchange(true)) {
      if (len < adopted.size()) {
        errno = EINVAL;
        return -1;
      }
      std::memcpy(buf, adopted.data(), adopted.size());
      SeeInitRequest(adopted.data(), adopted.size());
      return static_cast<ssize_t>(adopted.size());
    }
    // libfuse answers EIO to anything read before INIT is processed. A
    // supervisor that never admits (it died) must not leave us deaf for
    // ever: after a while we serve anyway.
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + kAdmitTimeout;
    bool admitted = true;
    while (!((init_done_ && admitted_) || draining_.load())) {
      if (!init_cv_.WaitUntil(mu_, deadline)) {
        admitted = (init_done_ && admitted_) || draining_.load();
        break;
      }
    }
    if (!admitted && !admitted_) {
      admitted_ = true;
      spdlog::warn("the supervisor did not admit this daemon within {} s; serving anyway", kAdmitTimeout.count());
    }
    while (!init_done_ && !draining_.load()) init_cv_.Wait(mu_);
  }
  return options_.channels.empty() ? ReadDevice(fd, buf, len) : ReadChannel(buf, len);
}

ssize_t ConnectionIo::ReadChannel(void* buf, size_t len) {
  Reader& me = ThisThread();
  for (;;) {
    me.in_read = true;
    if (draining_) {  // after in_read: a Drain from now on signals this thread
      me.in_read = false;
      errno = ENODEV;
      return -1;
    }
    const ssize_t n = ::read(me.channel, buf, len);
    const int err = errno;
    me.in_read = false;
    if (n < 0 && err == EINTR) continue;
    if (n >= static_cast<ssize_t>(kInHeaderSize)) {
      const auto* p = static_cast<const uint8_t*>(buf);
      me.unique = Load64(p + 8);
      if (init_unique_.load(std::memory_order_relaxed) == 0 && Load32(p + 4) == kOpInit) {
        SeeInitRequest(p, static_cast<size_t>(n));
      }
    }
    errno = err;
    return n;
  }
}

// A reply goes to the channel its request was read from: the thread's own,
// when it answers what it read last, or the one a pool's thread was handed
// with the request (ReplyVia); else, as the kernel answers ENOENT on a
// channel that does not hold the request, it is tried on each of the others.
ssize_t ConnectionIo::WriteReply(struct iovec* iov, int count) {
  const uint64_t unique = Load64(static_cast<const uint8_t*>(iov[0].iov_base) + 8);
  int first = -1;
  // libfuse answers an interrupt with its unique, the request's | 1
  // (FUSE_INT_REQ_BIT), from the thread that read the request.
  if (Reader* me = Registered(); me != nullptr && (unique & ~uint64_t{1}) == me->unique) first = me->channel;
  if (first < 0 && reply_via >= 0) {
    for (const UniqueFd& c : options_.channels) {
      if (c.get() == reply_via) first = reply_via;  // only one of this connection's
    }
  }
  if (first >= 0) {
    const ssize_t n = ::writev(first, iov, count);
    if (n >= 0 || errno != ENOENT) return n;
  }
  ssize_t n = -1;
  errno = ENOENT;
  for (const UniqueFd& c : options_.channels) {
    if (c.get() == first) continue;
    n = ::writev(c.get(), iov, count);
    if (n >= 0 || errno != ENOENT) return n;
  }
  return n;
}

ssize_t ConnectionIo::ReadDevice(int fd, void* buf, size_t len) {
  for (;;) {
    if (draining_) {
      errno = ENODEV;  // libfuse ends the session loop on it
      return -1;
    }
    if (options_.shared_device) {
      pollfd p[2] = {{fd, POLLIN, 0}, {drain_.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) return -1;  // EINTR: libfuse reads again
      if (p[1].revents != 0) continue;
    }
    const ssize_t n = ::read(fd, buf, len);
    if (n < 0 && errno == EAGAIN && options_.shared_device) continue;  // another reader took it
    if (n >= static_cast<ssize_t>(kInHeaderSize) && init_unique_.load(std::memory_order_relaxed) == 0 &&
        Load32(static_cast<const uint8_t*>(buf) + 4) == kOpInit) {
      SeeInitRequest(static_cast<const uint8_t*>(buf), static_cast<size_t>(n));
    }
    return n;
  }
}

ssize_t ConnectionIo::Writev(int fd, struct iovec* iov, int count) {
  const bool init_pending = !init_replied_.load() && init_unique_.load() != 0;
  if (!init_pending || count < 1 || iov[0].iov_len < kOutHeaderSize ||
      Load64(static_cast<const uint8_t*>(iov[0].iov_base) + 8) != init_unique_.load()) {
    // A notification (unique 0) may go on any descriptor of the connection.
    const bool reply = count >= 1 && iov[0].iov_len >= kOutHeaderSize &&
                       Load64(static_cast<const uint8_t*>(iov[0].iov_base) + 8) != 0;
    return reply && !options_.channels.empty() ? WriteReply(iov, count) : ::writev(fd, iov, count);
  }
  // The INIT reply, copied so that libfuse's own buffer is left as it was.
  std::vector<uint8_t> reply;
  for (int i = 0; i < count; ++i) {
    const auto* b = static_cast<const uint8_t*>(iov[i].iov_base);
    reply.insert(reply.end(), b, b + iov[i].iov_len);
  }
  const size_t total = reply.size();
  if (options_.passthrough != nullptr) options_.passthrough->PatchInitReply(reply);
  const bool adopted = !options_.adopted_init.empty();
  // An adopted connection was initialized long ago: the kernel expects no reply.
  iovec whole{reply.data(), reply.size()};
  const ssize_t n = adopted                      ? static_cast<ssize_t>(reply.size())
                    : options_.channels.empty() ? ::writev(fd, &whole, 1)
                                                : WriteReply(&whole, 1);
  if (n != static_cast<ssize_t>(reply.size())) return n;
  if (options_.passthrough != nullptr) options_.passthrough->AfterInitReply(adopted);
  InitDone();
  return static_cast<ssize_t>(total);
}

}  // namespace ckptfs::fuse
