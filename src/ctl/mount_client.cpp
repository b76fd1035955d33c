// Finding a mount's control socket and talking to it.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ckptfs/control.h"
#include "ckptfs/control_protocol.h"
#include "ckptfs/json_path.h"
#include "ckptfs/mount_table.h"
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
// mount) to its mount point and its path below it. Only a real ckptfs mount
// counts (issue 21 item 12): the mount that holds PATH must be of type
// fuse.ckptfs in the mount table, PATH's device must be that mount's, and
// statfs must say FUSE; anyone can set user.ckptfs.* on their own files.
Result<std::pair<std::string, std::string>> LocateInMount(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return Status::FromErrno(path, errno);
  const std::string real = buf;
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) return Status::FromErrno(path, errno);
  const auto mount = MountHolding(real);
  if (!mount || mount->fstype != kCkptfsMountType || mount->device != st.st_dev) {
    std::string on = mount ? " (it is on the " + mount->fstype + " mount at " + mount->mount_point + ")" : "";
    return Status::Error(path + " is not a ckptfs mount nor inside one" + on);
  }
  struct statfs sfs {};
  if (::statfs(mount->mount_point.c_str(), &sfs) != 0 || sfs.f_type != kFuseSuperMagic) {
    return Status::Error(path + " is not a ckptfs mount nor inside one (" + mount->mount_point +
                         " is listed as one, but is not a FUSE filesystem)");
  }
  const std::string& dir = mount->mount_point;
  std::string rel = real.size() > dir.size() ? real.substr(dir.size() + (dir == "/" ? 0 : 1)) : "";
  return std::make_pair(dir, rel);
}

Result<MountControl> OpenMountControl(const std::string& mountpoint) {
  const auto mount = MountAt(mountpoint);
  if (!mount || mount->fstype != kCkptfsMountType) return Status::Error("not a ckptfs mount");
  const auto owner = SuperOption(*mount, "user_id");
  if (!owner) return Status::Error("the mount table names no owner (user_id=) of " + mountpoint);
  auto socket = ReadXattr(mountpoint, "user.ckptfs.control");
  if (!socket.ok()) {
    const int err = socket.status().error_number();
    if (err == ENODATA || err == ENOTSUP) return Status::Error("not a ckptfs mount (no user.ckptfs.control attribute)");
    return socket.status();
  }
  return MountControl{mountpoint, *socket, static_cast<uid_t>(*owner)};
}

namespace {

// Whoever listens on the socket must be the mount's daemon, which runs as
// the user who mounted (the mount table's user_id): a socket file that
// someone else bound in its place (the daemon died, or the path is theirs)
// is not believed.
Status CheckPeerIsTheDaemon(int fd, const MountControl& m) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Status::FromErrno("cannot learn who serves the control socket " + m.socket, errno);
  }
  if (peer.uid == m.owner_uid) return Status::Ok();
  return Status::Error("the control socket " + m.socket + " is served by uid " + std::to_string(peer.uid) +
                       " (pid " + std::to_string(peer.pid) + "), not by the daemon of " + m.mountpoint +
                       ", which runs as uid " + std::to_string(m.owner_uid) + "; not believed");
}

void MakePrintable(nlohmann::json& j) {
  if (j.is_string()) {
    j = Printable(j.get_ref<const std::string&>());
  } else if (j.is_array()) {
    for (auto& v : j) MakePrintable(v);
  } else if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      MakePrintable(it.value());
      out[Printable(it.key())] = std::move(it.value());
    }
    j = std::move(out);
  }
}

// The reply with every string made printable (paths decoded for it, then
// encoded again, so that the caller sees the usual form).
Result<nlohmann::json> PrintableReply(nlohmann::json reply, const std::string& socket) {
  if (Status s = DecodeJsonPaths(reply); !s.ok()) return Status::Error("malformed reply from " + socket + ": " + s.message());
  MakePrintable(reply);
  if (Status s = EncodeJsonPaths(reply); !s.ok()) return Status::Error("malformed reply from " + socket + ": " + s.message());
  return reply;
}

}  // namespace

Result<nlohmann::json> CallControl(const MountControl& m, const nlohmann::json& request,
                                   const std::function<void(const nlohmann::json&)>& on_progress,
                                   std::chrono::milliseconds silence) {
  nlohmann::json encoded = request;
  if (Status s = EncodeJsonPaths(encoded); !s.ok()) return Status::Error("cannot encode the request: " + s.message());
  auto fd = ConnectControlSocket(m.socket);
  if (!fd.ok()) return fd.status();
  if (Status s = CheckPeerIsTheDaemon(fd->get(), m); !s.ok()) return s;
  auto raw = ControlExchange(fd->get(), m.socket, encoded, on_progress, silence);
  if (!raw.ok()) return Status::Error(Printable(raw.status().message()));
  auto reply = PrintableReply(std::move(*raw), m.socket);
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

Result<nlohmann::json> CallMount(const std::string& mountpoint, const nlohmann::json& request,
                                 const std::function<void(const nlohmann::json&)>& on_progress) {
  auto control = OpenMountControl(mountpoint);
  if (!control.ok()) return control.status();
  return CallControl(*control, request, on_progress);
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
    // The rows' strings are Printable (CallControl); so must the path be.
    if (RowUnder(wrapper["rows"][i], Printable(rel))) kept.push_back(reply[protocol::kCheckpoints][i]);
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

namespace {

// "sha256-" and 64 lowercase hex digits, as section 1 of DESIGN.md names a checkpoint.
bool IsDigestName(const std::string& name) {
  constexpr std::string_view kPrefix = "sha256-";
  if (name.size() != kPrefix.size() + 64 || name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
  }
  return true;
}

}  // namespace

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
    if (!IsDigestName(*digest)) {
      PrintError(path + ": user.ckptfs.digest is not a digest name (sha256-<64 hex>): " + Printable(*digest));
      return kExitFailure;
    }
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
