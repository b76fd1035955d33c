// Finding a mount's control socket and talking to it.
#include <sys/xattr.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ckptfs/control.h"
#include "ckptfs/control_protocol.h"
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
  return Status::Error(path + " is not a ckptfs mount nor inside one");
}

Result<nlohmann::json> CallMount(const std::string& mountpoint, const nlohmann::json& request,
                                 const std::function<void(const nlohmann::json&)>& on_progress) {
  auto socket = ReadXattr(mountpoint, "user.ckptfs.control");
  if (!socket.ok()) {
    const int err = socket.status().error_number();
    if (err == ENODATA || err == ENOTSUP) return Status::Error("not a ckptfs mount (no user.ckptfs.control attribute)");
    return socket.status();
  }
  auto reply = ControlCall(*socket, request, on_progress);
  if (!reply.ok()) return reply.status();
  if (!reply->value(protocol::kOk, false)) {
    // The error may name a path: print its exact bytes (json_path.h).
    nlohmann::json exact = *reply;
    std::string why = "request refused";
    if (DecodeJsonPaths(exact).ok() && exact.contains(protocol::kError) && exact[protocol::kError].is_string()) {
      why = exact[protocol::kError];
    }
    return Status::Error(why);
  }
  return reply;
}

}  // namespace ckptfs::ctl

namespace ckptfs::ctl {

std::optional<int> QueryMount(const std::string& path, std::string_view cmd, nlohmann::json* reply, MountPath* where_out) {
  auto where = LocateInMount(path);
  if (!where.ok()) {
    PrintError(where.status().message());
    return kExitFatal;
  }
  auto r = CallMount(where->first, protocol::Request(cmd));
  if (!r.ok()) {
    PrintError(path + ": " + r.status().message());
    return kExitFatal;
  }
  *reply = std::move(*r);
  if (where_out != nullptr) *where_out = {where->first, where->second};
  return std::nullopt;
}

// Prints `reply` as JSON (paths still encoded: valid JSON, exact in the
// _b64 members), or decodes its paths for printing as bytes; an exit code
// once the command is settled (JSON printed, or a malformed reply).
std::optional<int> PrintJsonOrDecode(const std::string& path, bool json, nlohmann::json& reply,
                                     const nlohmann::json& printed) {
  if (json) {
    std::printf("%s\n", printed.dump(2).c_str());
    return kExitOk;
  }
  if (Status s = DecodeJsonPaths(reply); !s.ok()) {
    PrintError(path + ": malformed reply: " + s.message());
    return kExitFatal;
  }
  return std::nullopt;
}

bool RowUnder(const nlohmann::json& row, const std::string& rel) {
  if (rel.empty()) return true;
  const std::string first = rel.substr(0, rel.find('/'));
  if (first.rfind("sha256-", 0) == 0) return row.value(protocol::kName, std::string()) == first;
  if (!row.contains(protocol::kByName)) return false;
  for (const auto& p : row[protocol::kByName]) {
    const std::string by_name = p.is_string() ? p.get<std::string>() : std::string();
    if (by_name == rel || by_name.rfind(rel + "/", 0) == 0) return true;
  }
  return false;
}

Status KeepRowsUnder(nlohmann::json& reply, const std::string& rel) {
  if (rel.empty() || !reply.contains(protocol::kCheckpoints)) return Status::Ok();
  nlohmann::json exact = reply[protocol::kCheckpoints];
  nlohmann::json wrapper = {{"rows", exact}};
  if (Status s = DecodeJsonPaths(wrapper); !s.ok()) return s;
  nlohmann::json kept = nlohmann::json::array();
  for (size_t i = 0; i < wrapper["rows"].size(); ++i) {
    if (RowUnder(wrapper["rows"][i], rel)) kept.push_back(reply[protocol::kCheckpoints][i]);
  }
  reply[protocol::kCheckpoints] = std::move(kept);
  return Status::Ok();
}

std::optional<int> QueryRowsUnder(const std::string& path, std::string_view cmd, nlohmann::json* reply, MountPath* where) {
  if (auto done = QueryMount(path, cmd, reply, where)) return done;
  if (Status s = KeepRowsUnder(*reply, where->rel); !s.ok()) {
    PrintError(path + ": malformed reply: " + s.message());
    return kExitFatal;
  }
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
