// Finding a mount's control socket and talking to it.
#include <sys/xattr.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ckptfs/control.h"
#include "ckptfs/json_path.h"
#include "ctl.h"

namespace ckptfs::ctl {

Result<std::string> ReadXattr(const std::string& path, const char* name) {
  char buf[4096];
  const ssize_t n = ::getxattr(path.c_str(), name, buf, sizeof buf);
  if (n < 0) {
    const int err = errno;
    return Status::FromErrno(std::string("cannot read ") + name, err);
  }
  return std::string(buf, static_cast<size_t>(n));
}

// Resolves PATH (a digest directory, a by-name link, or a file under a
// mount) to its mount point and its path below it.
Result<std::pair<std::string, std::string>> LocateInMount(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return Status::FromErrno(path, errno);
  const std::string real = buf;
  // realpath gives "/" or "/a/b": each shorter prefix ending before a slash
  // is an ancestor, and "/" the last.
  for (size_t end = real.size();;) {
    const std::string dir = end == 0 ? std::string("/") : real.substr(0, end);
    if (::getxattr(dir.c_str(), "user.ckptfs.control", nullptr, 0) > 0) {
      std::string rel = real.size() > dir.size() ? real.substr(dir.size() + (dir == "/" ? 0 : 1)) : "";
      return std::make_pair(dir, rel);
    }
    if (end == 0 || dir == "/") break;
    end = real.rfind('/', end - 1);
  }
  return Status::Error(path + " is not inside a ckptfs mount");
}

Result<nlohmann::json> CallMount(const std::string& mountpoint, const nlohmann::json& request,
                                 const std::function<void(const nlohmann::json&)>& on_progress) {
  char buf[4096];
  ssize_t n = ::getxattr(mountpoint.c_str(), "user.ckptfs.control", buf, sizeof buf);
  if (n < 0) {
    const int err = errno;
    if (err == ENODATA || err == ENOTSUP) {
      return Status::Error(mountpoint + " is not a ckptfs mount (it has no user.ckptfs.control attribute)");
    }
    return Status::FromErrno(mountpoint, err);
  }
  auto reply = ControlCall(std::string(buf, static_cast<size_t>(n)), request, on_progress);
  if (!reply.ok()) return reply.status();
  if (!reply->value("ok", false)) {
    // The error may name a path: print its exact bytes (json_path.h).
    nlohmann::json exact = *reply;
    std::string why = "request refused";
    if (DecodeJsonPaths(exact).ok() && exact.contains("error") && exact["error"].is_string()) why = exact["error"];
    return Status::Error(mountpoint + ": " + why);
  }
  return reply;
}

}  // namespace ckptfs::ctl

namespace ckptfs::ctl {

std::optional<int> QueryMount(const std::string& mountpoint, const char* cmd, bool json, nlohmann::json* reply) {
  auto r = CallMount(mountpoint, {{"cmd", cmd}});
  if (!r.ok()) {
    PrintError(r.status().message());
    return kExitFatal;
  }
  if (json) {
    std::printf("%s\n", r->dump(2).c_str());  // still encoded: valid JSON, paths exact in the _b64 members
    return kExitOk;
  }
  if (Status s = DecodeJsonPaths(*r); !s.ok()) {  // the exact bytes of paths, for printing
    PrintError(mountpoint + ": malformed reply: " + s.message());
    return kExitFatal;
  }
  *reply = std::move(*r);
  return std::nullopt;
}

int RunResolve(const std::string& path) {
  auto where = LocateInMount(path);
  if (!where.ok()) {
    PrintError(where.status().message());
    return kExitFatal;
  }
  const auto& [mountpoint, rel] = *where;
  const std::string first = rel.substr(0, rel.find('/'));
  if (first.rfind("sha256-", 0) == 0) {
    std::printf("%s/%s\n", mountpoint.c_str(), rel.c_str());
    return kExitOk;
  }
  // A by-name directory that is itself a checkpoint (run7/ holding
  // checkpoint-500/) names its own digest in user.ckptfs.digest.
  const std::string here = rel.empty() ? mountpoint : mountpoint + "/" + rel;
  auto digest = ReadXattr(here, "user.ckptfs.digest");
  if (digest.ok()) {
    std::printf("%s/%s\n", mountpoint.c_str(), digest->c_str());
    return kExitOk;
  }
  if (digest.status().error_number() != ENODATA) {
    PrintError(path + ": " + digest.status().message());
    return kExitFailure;
  }
  // Name where a link led only when it led somewhere else.
  PrintError(path + (here == path ? std::string() : " leads to " + here + ", which") +
             " is neither a checkpoint nor inside a digest directory (a by-name link or by-name directory of a "
             "checkpoint resolves to MOUNTPOINT/sha256-<hex>)");
  return kExitFailure;
}

}  // namespace ckptfs::ctl
