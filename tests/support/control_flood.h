// Floods of connections to a control socket, for the tests of issue 11
// item 4 and issue 21 item 3: a child process opens many connections as
// some uid and holds them until the test is done with it, sending nothing
// (IdleConnectionFlood), or sending a request and reading its reply a
// little at a time (SlowReaderFlood).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ckptfs::testing {

// Entries of a /proc directory (task/ for threads, fd/ for descriptors).
inline size_t CountEntries(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

inline sockaddr_un UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  return addr;
}

// A connected client socket, or -1. A server that stopped accepting would
// leave connect() blocked on a full backlog: it gives up after a second.
inline int ConnectUnix(const sockaddr_un& addr) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// In a forked child: drops root for `uid`, and lifts the soft limit on open
// files that a test may have lowered for the server in the parent. Only
// async-signal-safe calls, because the parent has threads.
inline void BecomeInChild(uid_t uid) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  if (uid == 0) return;
  if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) {
    ::_exit(120);
  }
}

// A connection queued without waiting on the server: while the backlog is
// full it retries for 20 ms, then gives up. A flood must be in place at once:
// a server that stopped accepting would otherwise stall it until the server's
// own timeouts had freed what the test means to look at.
inline bool ConnectWithoutWaiting(const sockaddr_un& addr) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) return true;
    if (errno != EAGAIN) break;
    timespec ms{0, 1000000};
    ::nanosleep(&ms, nullptr);
  }
  ::close(fd);
  return false;
}

// Sets this process's soft limit on open files for as long as it lives
// (never above the hard limit, so the old one can be restored); a child
// started meanwhile inherits it.
class SoftFdLimit {
 public:
  explicit SoftFdLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lim = saved_;
    lim.rlim_cur = soft < saved_.rlim_max ? soft : saved_.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  ~SoftFdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  SoftFdLimit(const SoftFdLimit&) = delete;
  SoftFdLimit& operator=(const SoftFdLimit&) = delete;

 private:
  rlimit saved_{};
};

// The child that holds the connections; killed and reaped when this dies.
class IdleConnectionFlood {
 public:
  // Returns once `count` connections have been tried.
  IdleConnectionFlood(const std::string& socket, uid_t uid, int count) {
    const sockaddr_un addr = UnixAddress(socket);
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) RunChild(addr, uid, count, ready[1]);
    ::close(ready[1]);
    pollfd p{ready[0], POLLIN, 0};
    if (pid_ > 0 && ::poll(&p, 1, 60000) == 1 && ::read(ready[0], &opened_, sizeof opened_) != sizeof opened_) {
      opened_ = -1;
    }
    ::close(ready[0]);
  }
  ~IdleConnectionFlood() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  IdleConnectionFlood(const IdleConnectionFlood&) = delete;
  IdleConnectionFlood& operator=(const IdleConnectionFlood&) = delete;

  // How many connect() calls succeeded (the server may have closed some since).
  int opened() const { return opened_; }

 private:
  [[noreturn]] static void RunChild(const sockaddr_un& addr, uid_t uid, int count, int ready) {
    BecomeInChild(uid);
    int opened = 0;
    for (int i = 0; i < count; ++i) opened += ConnectWithoutWaiting(addr);
    if (::write(ready, &opened, sizeof opened) != sizeof opened) ::_exit(121);
    for (;;) ::pause();
  }

  pid_t pid_ = -1;
  int opened_ = 0;
};

// Connections of one uid that each send `request` and then read the reply
// `chunk` bytes every `interval`: slowly, but never so slowly that a single
// write to them would time out. Each connection that the server closes
// before a whole reply line arrived is reported; the child runs until this
// dies.
class SlowReaderFlood {
 public:
  SlowReaderFlood(const std::string& socket, uid_t uid, int count, const std::string& request, size_t chunk,
                  int interval_ms) {
    const sockaddr_un addr = UnixAddress(socket);
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(cuts_, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) RunChild(addr, uid, count, request, chunk, interval_ms, ready[1], cuts_[1]);
    ::close(ready[1]);
    ::close(cuts_[1]);
    cuts_[1] = -1;
    pollfd p{ready[0], POLLIN, 0};
    if (pid_ > 0 && ::poll(&p, 1, 60000) == 1 && ::read(ready[0], &opened_, sizeof opened_) != sizeof opened_) {
      opened_ = -1;
    }
    ::close(ready[0]);
  }
  ~SlowReaderFlood() {
    if (cuts_[0] >= 0) ::close(cuts_[0]);
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  SlowReaderFlood(const SlowReaderFlood&) = delete;
  SlowReaderFlood& operator=(const SlowReaderFlood&) = delete;

  int opened() const { return opened_; }
  bool alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }
  // Waits up to `timeout_ms` for the server to cut a connection off before
  // its reply was whole.
  bool WaitForACut(int timeout_ms) {
    pollfd p{cuts_[0], POLLIN, 0};
    char c;
    return ::poll(&p, 1, timeout_ms) == 1 && ::read(cuts_[0], &c, 1) == 1;
  }

 private:
  [[noreturn]] static void RunChild(const sockaddr_un& addr, uid_t uid, int count, const std::string& request,
                                    size_t chunk, int interval_ms, int ready, int cuts) {
    BecomeInChild(uid);
    constexpr int kMax = 64;
    int fds[kMax];
    bool whole[kMax] = {};
    int opened = 0;
    for (int i = 0; i < count && i < kMax; ++i) {
      const int fd = ConnectUnix(addr);
      if (fd < 0) continue;
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) {
        ::close(fd);
        continue;
      }
      fds[opened++] = fd;
    }
    if (::write(ready, &opened, sizeof opened) != sizeof opened) ::_exit(121);
    static char buf[1 << 20];
    const size_t take = chunk < sizeof buf ? chunk : sizeof buf;
    for (;;) {
      const timespec pause{interval_ms / 1000, (interval_ms % 1000) * 1000000L};
      ::nanosleep(&pause, nullptr);
      for (int i = 0; i < opened; ++i) {
        if (fds[i] < 0) continue;
        const ssize_t n = ::recv(fds[i], buf, take, MSG_DONTWAIT);
        if (n > 0) {
          whole[i] = whole[i] || std::memchr(buf, '\n', static_cast<size_t>(n)) != nullptr;
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        // Closed (or reset) by the server: a cut if the reply was not whole.
        if (!whole[i] && ::write(cuts, "x", 1) != 1) ::_exit(122);
        ::close(fds[i]);
        fds[i] = -1;
      }
    }
  }

  pid_t pid_ = -1;
  int opened_ = 0;
  int cuts_[2] = {-1, -1};
};

}  // namespace ckptfs::testing
