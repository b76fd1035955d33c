// A stand-in for a mount's control socket, for the tests of issue 21 items
// 12 and 15: a child process binds a Unix socket at a path (replacing what
// is there), listens as some uid, and answers each connection's request
// line with a canned reply chosen by the request's "cmd". It counts the
// connections it accepted, so that a test can tell whether a client
// believed it enough to ask.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <string>

#include "control_flood.h"

namespace ckptfs::testing {

class FakeControlServer {
 public:
  // `replies`: "cmd" -> the whole reply line (a '\n' is added); a request
  // whose cmd is not there gets `replies[""]`. The socket is bound as the
  // caller (root, so that it may take any path), then the child becomes
  // `uid` before it listens: listen() records the credentials a client
  // sees with SO_PEERCRED.
  FakeControlServer(const std::string& socket, uid_t uid, std::map<std::string, std::string> replies) {
    accepted_ = static_cast<std::atomic<int>*>(
        ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (accepted_ == MAP_FAILED) {
      accepted_ = nullptr;
      return;
    }
    new (accepted_) std::atomic<int>(0);
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) Serve(socket, uid, replies, ready[1]);
    ::close(ready[1]);
    char ok = 0;
    pollfd p{ready[0], POLLIN, 0};
    listening_ = pid_ > 0 && ::poll(&p, 1, 10000) == 1 && ::read(ready[0], &ok, 1) == 1 && ok == 1;
    ::close(ready[0]);
  }
  ~FakeControlServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (accepted_ != nullptr) ::munmap(accepted_, sizeof(std::atomic<int>));
  }
  FakeControlServer(const FakeControlServer&) = delete;
  FakeControlServer& operator=(const FakeControlServer&) = delete;

  bool listening() const { return listening_; }
  int accepted() const { return accepted_ != nullptr ? accepted_->load() : -1; }

 private:
  [[noreturn]] void Serve(const std::string& socket, uid_t uid, const std::map<std::string, std::string>& replies,
                          int ready) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    const sockaddr_un addr = UnixAddress(socket);
    ::unlink(socket.c_str());
    if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) ::_exit(120);
    if (::chmod(socket.c_str(), 0666) != 0 || ::chown(socket.c_str(), uid, uid) != 0) ::_exit(123);
    BecomeInChild(uid);
    if (::listen(fd, 16) != 0) ::_exit(121);
    const char ok = 1;
    if (::write(ready, &ok, 1) != 1) ::_exit(122);
    for (;;) {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      ++*accepted_;
      std::string request;
      char buf[4096];
      while (request.find('\n') == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      std::string reply = replies.count("") ? replies.at("") : "{\"ok\":false,\"error\":\"?\"}";
      for (const auto& [cmd, line] : replies) {
        if (!cmd.empty() && request.find("\"cmd\":\"" + cmd + "\"") != std::string::npos) reply = line;
      }
      reply += "\n";
      if (::send(c, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) {
        // the client went away; the next one is served all the same
      }
      ::close(c);
    }
  }

  pid_t pid_ = -1;
  bool listening_ = false;
  std::atomic<int>* accepted_ = nullptr;
};

}  // namespace ckptfs::testing
