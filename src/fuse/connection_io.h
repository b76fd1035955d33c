// ConnectionIo: every byte between libfuse and /dev/fuse goes through here
// (fuse_session_custom_io), so that a FUSE connection can outlive the
// process that serves it (README, "Restart and upgrade").
//
//   INIT      the kernel sends INIT once per connection. The first daemon
//             reads it for real and hands a copy of the request to
//             `on_init_request` (the supervisor keeps it). A daemon that
//             takes over a connection whose INIT was answered long ago
//             (`adopted_init`) gets that copy back as its first read, so
//             that libfuse 3.14, which has no API for an initialized
//             connection, negotiates exactly what was negotiated; its INIT
//             reply is swallowed, since the kernel is not waiting for one.
//             Until INIT is done, no other read reaches the device: libfuse
//             answers EIO to a request that comes before INIT. Nor until
//             Admit(): the predecessor's open inodes must be inherited
//             first (a hand-over), or known to be none (a crash).
//   passthrough  the INIT request and reply are shown to KernelPassthrough,
//             which asks for passthrough in the reply (libfuse < 3.17).
//   drain     on a hand-over the old daemon stops reading without taking a
//             request it would then drop: reads wait in poll() on the device
//             and on an eventfd, and read the device without blocking (the
//             supervisor sets O_NONBLOCK on the shared open file, so
//             several processes can read it and none blocks in read()).
//   channels  a supervised daemon's threads each read from a channel of
//             their own, a clone of the connection the supervisor made and
//             holds (include/ckptfs/fuse_channels.h), in blocking read()s as
//             an unsupervised daemon's do: the kernel then wakes one reader
//             per request, where a poll() on one shared descriptor wakes
//             them all. A reply goes back on the channel its request came
//             from (the kernel looks it up there). To drain, the readers
//             blocked in read() are woken by a signal, repeated until every
//             one has seen that the daemon drains.
//   resend    FUSE_NOTIFY_RESEND (protocol 7.40, Linux 6.9+) puts every
//             request that was read but never answered back in the queue:
//             sent by a daemon that took over once its predecessor is gone,
//             it turns what the dead daemon held into retried requests
//             instead of hung ones.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "ckptfs/mutex.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs::fuse {

class KernelPassthrough;

class ConnectionIo {
 public:
  struct Options {
    // The INIT request of the connection being taken over; empty for a
    // connection this process mounted (or the first daemon of a supervisor).
    std::vector<uint8_t> adopted_init;
    // Poll-and-read without blocking (the device is shared with a
    // supervisor, which set O_NONBLOCK); false: plain blocking reads.
    bool shared_device = false;
    // The connection's per-thread channels (blocking); when there are any,
    // requests are read from them only, never from the shared descriptor.
    std::vector<UniqueFd> channels;
    // Called with the INIT request the kernel sent (first daemon only).
    std::function<void(const std::vector<uint8_t>&)> on_init_request;
    // The passthrough shim, shown INIT (may be null).
    KernelPassthrough* passthrough = nullptr;
  };

  explicit ConnectionIo(Options options);
  ~ConnectionIo();

  // Installs the custom io on `se` for descriptor `fd` (the session's own
  // after fuse_session_mount, or an inherited one). The session's userdata
  // must be the FsContext that points here.
  Status Install(fuse_session* se, int fd);

  // Stops reading: every read returns ENODEV from now on, which ends the
  // session loop once the requests in hand are answered.
  void Drain();
  // A connection taken over: requests may be read from now on.
  void Admit();
  // FUSE_NOTIFY_RESEND; fails on kernels without it.
  Status Resend();
  // The kernel offered FUSE_HAS_RESEND (and protocol 7.40) in its INIT.
  bool kernel_has_resend() const { return has_resend_.load(); }
  // The INIT request as the kernel sent it (empty until seen).
  std::vector<uint8_t> init_request() const;

  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, struct iovec* iov, int count);

  // The channel this thread reads requests from (-1: none), to be carried
  // with a request answered on another thread (a pool's, FsContext::
  // source_reads), whose reply then goes straight to it (ReplyVia) rather
  // than being tried on every channel in turn.
  static int ChannelOfThisThread();
  // While alive, replies written on this thread go first to `channel`, when
  // it is one of the connection's.
  class ReplyVia {
   public:
    explicit ReplyVia(int channel);
    ~ReplyVia();
    ReplyVia(const ReplyVia&) = delete;
    ReplyVia& operator=(const ReplyVia&) = delete;

   private:
    int previous_;
  };

 private:
  struct Reader;  // a thread's registration (connection_io.cpp)

  ssize_t ReadDevice(int fd, void* buf, size_t len);
  ssize_t ReadChannel(void* buf, size_t len);
  ssize_t WriteReply(struct iovec* iov, int count);
  static Reader& ThisThreadsReader();
  Reader& ThisThread();    // registered as a reader of this connection first
  Reader* Registered();    // null if this thread does not read this connection
  void Forget(Reader& reader);
  void WakeReaders();
  void SeeInitRequest(const uint8_t* p, size_t n);
  void InitDone();

  Options options_;
  int fd_ = -1;
  UniqueFd drain_;  // eventfd: readable once draining
  std::atomic<bool> draining_{false};
  std::atomic<bool> adopted_handed_{false};  // the adopted INIT went to libfuse
  std::atomic<bool> has_resend_{false};
  std::atomic<uint64_t> init_unique_{0};
  std::atomic<bool> init_replied_{false};  // init_done_, read without the lock on every reply
  std::atomic<size_t> next_channel_{0};     // handed to threads in turn
  Mutex readers_mu_;
  std::vector<Reader*> readers_ GUARDED_BY(readers_mu_);  // threads that read channels, to wake
  std::thread waker_;  // started by Drain when there are channels
  std::atomic<bool> destroying_{false};
  mutable Mutex mu_;
  CondVar init_cv_;
  bool init_done_ GUARDED_BY(mu_) = false;
  bool admitted_ GUARDED_BY(mu_) = false;
  std::vector<uint8_t> init_request_ GUARDED_BY(mu_);
};

}  // namespace ckptfs::fuse
