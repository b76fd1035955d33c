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
// preload: the tier asked for ("host", the only one), and in the reply the
// tier the files went into: "host", or "chunks" on a fill=off mount.
inline constexpr char kTier[] = "tier";
inline constexpr char kPin[] = "pin";    // preload: keep it resident until unpinned
inline constexpr char kBinary[] = "binary";  // restart: the new daemon's executable ("" for the same)

inline constexpr char kTierHost[] = "host";
// The GPU chunk tier's name, refused since the tier was removed, with why.
inline constexpr char kRemovedTierGpu[] = "gpu";
inline constexpr char kRemovedTierGpuWhy[] =
    "preload --tier gpu is gone: the GPU chunk tier was removed (its reads copied device memory back to the host, "
    "slower than the host tier); preload --pin registers the host tier's copy with the gpu= device for DMA";

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
// stats: false when the reply holds only the caller's checkpoints, not the
// node's counters (tiers, opens, fills), which tell of every user's files
// and are for root and the mount's owner.
inline constexpr char kNodeCounters[] = "node_counters";
inline constexpr char kName[] = "name";                // a row's digest directory
inline constexpr char kByName[] = "by_name";           // a row's by-name paths

// Keys of the `status` reply that ckptfsctl reads (ckptfsctl(8) documents
// every field). Checkpoint rows have kPath, kState, kFiles, kSize, kName,
// kReason, kIndexedAt, and while indexing kBytesDone and kBytesTotal.
inline constexpr char kSource[] = "source";
inline constexpr char kMountpoint[] = "mountpoint";
inline constexpr char kStateDir[] = "state_dir";
inline constexpr char kIndex[] = "index";  // the index database's path
inline constexpr char kPid[] = "pid";
inline constexpr char kState[] = "state";
inline constexpr char kSize[] = "size";
inline constexpr char kReason[] = "reason";
inline constexpr char kIndexedAt[] = "indexed_at";
inline constexpr char kBytesDone[] = "bytes_done";
// While indexing: the files being hashed, each {kPath (relative to the
// checkpoint; absent where the caller could not list it), kBytesDone, kSize}.
inline constexpr char kHashing[] = "hashing";
inline constexpr char kBytesTotal[] = "bytes_total";
inline constexpr char kSources[] = "sources";  // ls rows: the source paths of a digest
// A checkpoint row's states, as the daemon's PhaseName() spells them; also
// the keys of "counts".
inline constexpr char kCounts[] = "counts";
inline constexpr char kStateExposed[] = "exposed";
inline constexpr char kStateIndexing[] = "indexing";
inline constexpr char kStatePending[] = "pending";
inline constexpr char kStateInvalid[] = "invalid";
// "options": the mount's options as the daemon applies them.
inline constexpr char kOptions[] = "options";
inline constexpr char kOptionRescan[] = "rescan";
inline constexpr char kOptionSettle[] = "settle";
inline constexpr char kOptionSymlinks[] = "symlinks";
inline constexpr char kOptionThreads[] = "threads";
inline constexpr char kOptionReadahead[] = "readahead";
inline constexpr char kOptionAllowOther[] = "allow_other";
inline constexpr char kOptionFill[] = "fill";
inline constexpr char kOptionFillDepth[] = "fill_depth";
inline constexpr char kOptionLog[] = "log";
inline constexpr char kOptionLogFile[] = "log_file";
inline constexpr char kOptionHandoverTimeout[] = "handover_timeout";
// "cache": the capacities of the tiers (kTierHost, kTierChunks).
inline constexpr char kCache[] = "cache";
inline constexpr char kPinnedMemory[] = "pinned_memory";
// "daemon": the serving daemon, and its supervisor's record of it.
inline constexpr char kDaemon[] = "daemon";
inline constexpr char kVersion[] = "version";
inline constexpr char kStartedAt[] = "started_at";
inline constexpr char kRestarts[] = "restarts";
inline constexpr char kLastExit[] = "last_exit";
inline constexpr char kSupervised[] = "supervised";
inline constexpr char kSupervisorPid[] = "supervisor_pid";
inline constexpr char kHandoverFailures[] = "handover_failures";  // restarts whose successor did not take over
inline constexpr char kLastHandoverError[] = "last_handover_error";
inline constexpr char kStartedAs[] = "started_as";          // first, successor or replacement (handover_protocol.h)
inline constexpr char kPredecessorPid[] = "predecessor_pid";  // a successor's: the daemon it took over from
// Supervised: inodes whose open files changed and the supervisor was not told yet.
inline constexpr char kOpenInodeReportsWaiting[] = "open_inode_reports_waiting";
inline constexpr char kHandoverTimeout[] = "handover_timeout";  // seconds a successor has to report ready
// "source_filesystem": how changes in SRC are found.
inline constexpr char kSourceFilesystem[] = "source_filesystem";
inline constexpr char kFsType[] = "type";
inline constexpr char kFsInotify[] = "inotify";
inline constexpr char kFsChangesFoundBy[] = "changes_found_by";
inline constexpr char kFsRescan[] = "rescan";
// "manifests": the shared manifest store, when there is one.
inline constexpr char kManifests[] = "manifests";
inline constexpr char kManifestDir[] = "dir";
inline constexpr char kTrustedKeys[] = "trusted_keys";
inline constexpr char kSigningKey[] = "signing_key";
inline constexpr char kRecordsUsed[] = "records_used";
inline constexpr char kRecordsIgnored[] = "records_ignored";
inline constexpr char kRecordsPublished[] = "records_published";
inline constexpr char kRecordsDistrusted[] = "records_distrusted";

// "passthrough" (status and stats): {kMode, kReason}.
inline constexpr char kPassthrough[] = "passthrough";
inline constexpr char kMode[] = "mode";

// Keys of the `stats` reply that ckptfsctl reads. "tiers" maps a tier's
// name to its counters; checkpoint rows have kName, kByName, the bytes held
// by each tier (kTierHost, kTierChunks) and kPinned.
inline constexpr char kTiers[] = "tiers";
inline constexpr char kTierChunks[] = "chunks";  // the chunk tier (kTierHost: whole files)
inline constexpr char kCapacity[] = "capacity";
inline constexpr char kUsed[] = "used";
inline constexpr char kHits[] = "hits";
inline constexpr char kMisses[] = "misses";
inline constexpr char kFills[] = "fills";  // a tier's count, and the host tier's fill record
inline constexpr char kEvictions[] = "evictions";
inline constexpr char kOpens[] = "opens";  // how opens were served: name -> count
inline constexpr char kHeldByReaders[] = "held_by_readers";
inline constexpr char kVerificationFailures[] = "verification_failures";
inline constexpr char kReadaheadFills[] = "readahead_fills";
inline constexpr char kReadaheadHits[] = "readahead_hits";
inline constexpr char kPreloadFills[] = "preload_fills";
inline constexpr char kSourceBytesRead[] = "source_bytes_read";
inline constexpr char kBytesServed[] = "bytes_served";
inline constexpr char kFailedReads[] = "failed_reads";
// "fills": kFillPolicy, kFillDepth, kFillsCompleted, kBytes, kBytesPerSecond,
// kFillsAbandoned, kFillsSkipped.
inline constexpr char kFillPolicy[] = "policy";
inline constexpr char kFillDepth[] = "depth";
inline constexpr char kFillsCompleted[] = "completed";
inline constexpr char kBytesPerSecond[] = "bytes_per_second";
inline constexpr char kFillsAbandoned[] = "abandoned";
inline constexpr char kFillsSkipped[] = "skipped";
// "memory": kLocked, and "huge_pages" {kUsed, kShmemEnabled, kMappedBytes}.
inline constexpr char kMemory[] = "memory";
inline constexpr char kLocked[] = "locked";
inline constexpr char kHugePages[] = "huge_pages";
inline constexpr char kShmemEnabled[] = "shmem_enabled";
inline constexpr char kMappedBytes[] = "mapped_bytes";

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
