// Shared by the ckptfsctl commands: the global options and the scan-and-index
// pipeline with its progress bar.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/index.h"
#include "ckptfs/indexer.h"
#include "ckptfs/printable.h"

#include <nlohmann/json.hpp>

namespace ckptfs::ctl {

// Exit codes, documented in --help and the man page.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // some checkpoint or file failed; the rest were reported
inline constexpr int kExitUsage = 2;    // bad arguments
inline constexpr int kExitFatal = 3;    // nothing could be done (bad source, no checkpoints, no index)

struct GlobalOptions {
  std::string state_dir;  // empty: DefaultStateDir()
  unsigned threads = 0;
  std::string symlinks = "contained";
  bool quiet = false;
};

void PrintError(const std::string& message);
void PrintWarning(const std::string& message);

// Opens the index, printing any repair as a warning; null after printing why.
std::unique_ptr<Index> OpenIndexOrReport(const GlobalOptions& g);

// Scans `dir`; on failure prints why and returns false.
bool ScanOrReport(const std::string& dir, const GlobalOptions& g, CatalogScan* scan);

// Drops from `scan` every checkpoint but `dir` itself (those nested below
// it); false, after saying so, when `dir` is not a checkpoint.
bool KeepOnlyTheDirItself(const std::string& dir, CatalogScan* scan);

// Runs the indexer with a progress bar when standard error is a terminal.
// `index` may be null (nothing remembered locally); with `manifests`, files
// are looked up in it first and what is hashed is published there.
IndexReport IndexWithProgress(Index* index, const CatalogScan& scan, const GlobalOptions& g, bool ignore_index,
                              const char* label, ManifestStore* manifests = nullptr);

struct DigestArgs {
  std::vector<std::string> dirs;
  bool manifest = false;
  bool json = false;
  bool verbose = false;
  bool stamped = false;  // DIRs are *.safetensors files: print their stamped headers
  bool no_nested = false;  // only the checkpoint each DIR is, not those below it
};
int RunDigest(const GlobalOptions& g, const DigestArgs& args);
int RunDigestStamped(const GlobalOptions& g, const DigestArgs& args);

struct VerifyArgs {
  std::vector<std::string> dirs;
  bool json = false;
};
int RunVerify(const GlobalOptions& g, const VerifyArgs& args);

// The mount point that holds PATH (after resolving links) and PATH's
// canonical path below it.
Result<std::pair<std::string, std::string>> LocateInMount(const std::string& path);
// An extended attribute's value; the error keeps the errno (ENODATA: none).
Result<std::string> ReadXattr(const std::string& path, const char* name);
int RunResolve(const std::string& path);

// A mount's control socket, found once: its path (user.ckptfs.control of
// the mount point) and the uid its daemon must run as (the mount's owner).
struct MountControl {
  std::string mountpoint;
  std::string socket;
  uid_t owner_uid = 0;
};
// For `mountpoint` as LocateInMount found it (a real ckptfs mount).
Result<MountControl> OpenMountControl(const std::string& mountpoint);
// Sends a request on `m`'s socket once its peer proved to be the mount's
// daemon (SO_PEERCRED); fails unless the reply says ok. Every string of the
// reply, and the error, is Printable. Waits at most `silence` for a line.
Result<nlohmann::json> CallControl(const MountControl& m, const nlohmann::json& request,
                                   const std::function<void(const nlohmann::json&)>& on_progress = nullptr,
                                   std::chrono::milliseconds silence = std::chrono::minutes(10));

// Printable applied to every string and key of `j` (paths decoded; its
// depth already bounded by DecodeJsonPaths).
void MakePrintable(nlohmann::json& j);

// Sends a request to the daemon serving `mountpoint` (OpenMountControl,
// then CallControl); fails unless it says ok. Progress lines of long work go to `on_progress`. The error is the
// daemon's reason or what failed on the way, without the path the user gave
// (the caller prefixes it).
Result<nlohmann::json> CallMount(const std::string& mountpoint, const nlohmann::json& request,
                                 const std::function<void(const nlohmann::json&)>& on_progress = nullptr);

// A path inside a mount: the mount point, and the path's canonical form
// below it ("" for the mount point itself).
struct MountPath {
  std::string mountpoint;
  std::string rel;
};

// Asks the mount that holds PATH (the mount point or any path inside it)
// for `cmd`. Returns an exit code after printing why when the request
// failed; otherwise fills `reply` (paths still encoded, json_path.h) and,
// if given, `where`.
std::optional<int> QueryMount(const std::string& path, std::string_view cmd, nlohmann::json* reply,
                              MountPath* where = nullptr);

// Prints `printed` (part of `reply`) as JSON, paths still encoded (valid
// JSON, exact in the _b64 members), or decodes `reply`'s paths for printing
// as bytes. Returns an exit code when that settles the command (JSON
// printed, or a malformed reply, reported naming PATH).
std::optional<int> PrintJsonOrDecode(const std::string& path, bool json, nlohmann::json& reply,
                                     const nlohmann::json& printed);

// Whether an `ls` or `stats` row (paths decoded) belongs to `rel`, a path
// below the mount root: "" takes every row; a path in a digest directory
// that digest's row; a by-name path the checkpoints at or below it.
bool RowUnder(const nlohmann::json& row, const std::string& rel);
// Keeps the rows of reply["checkpoints"] (paths still encoded) that belong to `rel`.
Status KeepRowsUnder(nlohmann::json& reply, const std::string& rel);
// QueryMount, then KeepRowsUnder the path asked about (`ls`, `stats`).
std::optional<int> QueryRowsUnder(const std::string& path, std::string_view cmd, nlohmann::json* reply, MountPath* where);

struct MountArgs {
  std::string path;  // the mount point or any path inside the mount
  bool json = false;
};
int RunStatus(const MountArgs& args);
int RunLs(const MountArgs& args);
int RunRescan(const MountArgs& args);

struct RestartArgs {
  std::string path;    // the mount point or any path inside the mount
  std::string binary;  // the new daemon; empty: the binary the supervisor runs now
  bool json = false;
};
int RunRestart(const RestartArgs& args);

struct CacheArgs {
  std::string command;  // preload, unpin or evict
  std::string path;
  std::string tier = "host";
  bool pin = false;
};
int RunCacheCommand(const CacheArgs& args);

struct KeygenArgs {
  std::string key_path;  // the private key; the public one goes to KEY.pub
  bool force = false;    // overwrite existing files
};
int RunKeygen(const KeygenArgs& args);

struct PublishArgs {
  std::string source;
  std::string manifests;  // --manifests DIR
  std::string sign;       // --sign KEY
  std::string keys;       // --keys FILE: also reuse records signed by these keys
  bool json = false;
};
int RunPublish(const GlobalOptions& g, const PublishArgs& args);

struct StatsArgs {
  std::string path;  // the mount point or any path inside the mount
  bool json = false;
  bool prometheus = false;
};
int RunStats(const StatsArgs& args);

}  // namespace ckptfs::ctl
