// Finding a mount's control socket and talking to it.
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>

#include "ckptfs/control.h"
#include "ctl.h"

namespace ckptfs::ctl {

Result<nlohmann::json> CallMount(const std::string& mountpoint, const nlohmann::json& request) {
  char buf[4096];
  ssize_t n = ::getxattr(mountpoint.c_str(), "user.ckptfs.control", buf, sizeof buf);
  if (n < 0) {
    const int err = errno;
    if (err == ENODATA || err == ENOTSUP) {
      return Status::Error(mountpoint + " is not a ckptfs mount (it has no user.ckptfs.control attribute)");
    }
    return Status::FromErrno(mountpoint, err);
  }
  auto reply = ControlCall(std::string(buf, static_cast<size_t>(n)), request);
  if (!reply.ok()) return reply.status();
  if (!reply->value("ok", false)) {
    return Status::Error(mountpoint + ": " + reply->value("error", std::string("request refused")));
  }
  return reply;
}

}  // namespace ckptfs::ctl
