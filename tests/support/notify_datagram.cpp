#include "notify_datagram.h"

#include <sys/socket.h>

#include <cstring>

namespace ckptfs::testing {

std::optional<NotifyDatagram> ReceiveNotifyDatagram(int sock) {
  char text[4096] = {};
  char control[CMSG_SPACE(sizeof(int) * 8)] = {};
  iovec iov{text, sizeof text - 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return std::nullopt;
  NotifyDatagram d;
  d.text.assign(text, static_cast<size_t>(n));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const size_t at = d.fds.size();
    d.fds.resize(at + count);
    std::memcpy(d.fds.data() + at, CMSG_DATA(c), count * sizeof(int));
  }
  return d;
}

}  // namespace ckptfs::testing
