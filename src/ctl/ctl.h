// Shared by the ckptfsctl commands: the global options and the scan-and-index
// pipeline with its progress bar.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/index.h"
#include "ckptfs/indexer.h"

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
IndexReport IndexWithProgress(Index* index, const CatalogScan& scan, const GlobalOptions& g, bool ignore_index,
                              const char* label);

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

// Sends a request to the daemon serving `mountpoint`; fails unless it says
// ok. Progress lines of long work go to `on_progress`.
Result<nlohmann::json> CallMount(const std::string& mountpoint, const nlohmann::json& request,
                                 const std::function<void(const nlohmann::json&)>& on_progress = nullptr);

// Asks the mount for `cmd`. Returns an exit code when that already settles
// the command (the request failed, or --json printed the answer); otherwise
// fills `reply` for the caller to print.
std::optional<int> QueryMount(const std::string& mountpoint, const char* cmd, bool json, nlohmann::json* reply);

struct MountArgs {
  std::string mountpoint;
  bool json = false;
};
int RunStatus(const MountArgs& args);
int RunLs(const MountArgs& args);
int RunRescan(const MountArgs& args);

struct CacheArgs {
  std::string command;  // preload, unpin or evict
  std::string path;
  std::string tier = "host";
  bool pin = false;
};
int RunCacheCommand(const CacheArgs& args);

struct StatsArgs {
  std::string mountpoint;
  bool json = false;
  bool prometheus = false;
};
int RunStats(const StatsArgs& args);

}  // namespace ckptfs::ctl
