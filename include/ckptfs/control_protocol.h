// The control protocol's vocabulary, shared by the daemon (src/daemon,
// src/control) and its client ckptfsctl (src/ctl): the command names and the
// JSON keys of requests and of the replies' envelope. The wire format is
// described in control.h; the bodies of `status` and `stats` replies are
// documented field by field in ckptfsctl(8).
//
// One place for the names means a command or key renamed on one side cannot
// silently stop matching the other.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ckptfs::protocol {

// Commands. Queries are open to everyone who can reach the socket; changes
// (preload, unpin, evict, rescan) are for root and the mount's owner.
inline constexpr std::string_view kStatus = "status";
inline constexpr std::string_view kLs = "ls";
inline constexpr std::string_view kStats = "stats";
inline constexpr std::string_view kPreload = "preload";
inline constexpr std::string_view kUnpin = "unpin";
inline constexpr std::string_view kEvict = "evict";
inline constexpr std::string_view kRescan = "rescan";
inline constexpr std::string_view kRestart = "restart";  // hand the mount to a new daemon

struct CommandInfo {
  std::string_view name;
  bool needs_owner;  // a change: root or the mount's owner only
};
inline constexpr std::array<CommandInfo, 8> kCommands = {{{kStatus, false},
                                                          {kLs, false},
                                                          {kStats, false},
                                                          {kPreload, true},
                                                          {kUnpin, true},
                                                          {kEvict, true},
                                                          {kRescan, true},
                                                          {kRestart, true}}};

// Whether `command` is a change (unknown commands are treated as one).
constexpr bool NeedsOwner(std::string_view command) {
  for (const auto& c : kCommands) {
    if (c.name == command) return c.needs_owner;
  }
  return true;
}

// Request keys.
inline constexpr char kCmd[] = "cmd";
inline constexpr char kPath[] = "path";  // preload, unpin, evict: a path below the mount point
inline constexpr char kTier[] = "tier";  // preload: "host" or "gpu"
inline constexpr char kPin[] = "pin";    // preload: keep it resident until unpinned

inline constexpr char kTierHost[] = "host";
inline constexpr char kTierGpu[] = "gpu";

// Reply envelope: every final reply has "ok", and "error" when it is false;
// progress lines of long work have "progress" (done) and "total".
inline constexpr char kOk[] = "ok";
inline constexpr char kError[] = "error";
inline constexpr char kProgress[] = "progress";
inline constexpr char kTotal[] = "total";

// Reply keys shared by several commands.
inline constexpr char kBytes[] = "bytes";    // preload, unpin, evict
inline constexpr char kFiles[] = "files";    // preload; ls rows
inline constexpr char kPinned[] = "pinned";  // preload
inline constexpr char kCheckpoints[] = "checkpoints";  // status, ls, stats: rows
inline constexpr char kName[] = "name";                // a row's digest directory
inline constexpr char kByName[] = "by_name";           // a row's by-name paths

// Requests as ckptfsctl sends them: a command alone (status, ls, stats,
// rescan), one about a path below the mount point (unpin, evict), a preload.
inline nlohmann::json Request(std::string_view command) { return {{kCmd, std::string(command)}}; }
inline nlohmann::json PathRequest(std::string_view command, const std::string& path) {
  return {{kCmd, std::string(command)}, {kPath, path}};
}
inline nlohmann::json PreloadRequest(const std::string& path, const std::string& tier, bool pin) {
  return {{kCmd, std::string(kPreload)}, {kPath, path}, {kTier, tier}, {kPin, pin}};
}
inline nlohmann::json ErrorReply(const std::string& why) { return {{kOk, false}, {kError, why}}; }
inline nlohmann::json OkReply() { return {{kOk, true}}; }
inline nlohmann::json ProgressLine(uint64_t done, uint64_t total) { return {{kProgress, done}, {kTotal, total}}; }

}  // namespace ckptfs::protocol
