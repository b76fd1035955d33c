// Receiving one sd_notify-style datagram (text plus descriptors passed with
// SCM_RIGHTS), for the tests and the stand-in service manager that play
// systemd's side of the notification socket.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ckptfs::testing {

struct NotifyDatagram {
  std::string text;
  std::vector<int> fds;  // received with O_CLOEXEC; the caller owns them
};

// The next datagram waiting on `sock`, without blocking; nullopt when none is.
std::optional<NotifyDatagram> ReceiveNotifyDatagram(int sock);

}  // namespace ckptfs::testing
