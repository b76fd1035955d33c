#include "query_commands.h"

#include <unistd.h>

#include <map>

#include "cache_sizing.h"
#include "ckptfs/control_protocol.h"
#include "ckptfs/thread_pool.h"
#include "query_filter.h"

namespace ckptfs::daemon {

namespace {

nlohmann::json CheckpointRow(const CheckpointState& s) {
  using namespace protocol;
  nlohmann::json j{{kPath, s.path}, {kState, PhaseName(s.phase)}, {kFiles, s.files}, {kSize, s.size}};
  if (!s.name.empty()) j[kName] = s.name;
  // Changed in SRC and being verified again: `name` is served meanwhile.
  if (s.revalidating) j["revalidating"] = true;
  if (!s.reason.empty()) j[kReason] = s.reason;
  if (s.phase == CheckpointState::Phase::kIndexing || !s.hashing.empty()) {
    j[kBytesDone] = s.bytes_done;
    j[kBytesTotal] = s.bytes_total;
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : s.hashing) {
      nlohmann::json row{{kBytesDone, f.done}, {kSize, f.size}};
      if (!f.path.empty()) row[kPath] = f.path;
      files.push_back(std::move(row));
    }
    j[kHashing] = std::move(files);
  }
  if (s.indexed_at) j[kIndexedAt] = s.indexed_at;
  return j;
}

nlohmann::json OptionsJson(const MountOptions& o, const std::string& log_destination) {
  using namespace protocol;
  return {{kOptionRescan, o.rescan_s},
          {kOptionSettle, o.settle_s},
          {kOptionSymlinks, WordOf(kSymlinkPolicyWords, o.symlinks)},
          {kOptionThreads, EffectiveThreads(o.threads)},
          {kOptionReadahead, o.readahead},
          {kOptionAllowOther, o.allow_other},
          {"stamp_headers", o.stamp_headers},
          {"passthrough", WordOf(kPassthroughWords, o.passthrough)},
          {kOptionFill, WordOf(kFillPolicyWords, o.fill)},
          {"fill_on_index", WordOf(kFillOnIndexWords, o.fill_on_index)},
          {kOptionFillDepth, FillDepth(o)},
          {"fill_io", WordOf(kSourceIoWords, o.fill_io)},
          {"shmem_huge", WordOf(kShmemHugeWords, o.shmem_huge_advise)},
          {"page_reserve", o.page_reserve_off          ? nlohmann::json("off")
                           : o.page_reserve_bytes == 0 ? nlohmann::json("auto")
                                                       : nlohmann::json(o.page_reserve_bytes)},
          {kOptionLog, WordOf(kLogLevelWords, o.log_level)},
          {kOptionLogFile, log_destination},
          {kOptionHandoverTimeout, o.handover_timeout_s}};
}

nlohmann::json LastScanJson(const CatalogWatcher::ScanStats& s) {
  return {{"seconds", s.seconds},
          {"incremental", s.incremental},
          {"dirs_reused", s.dirs_reused},
          {"checkpoints", s.checkpoints},
          {"checkpoints_kept", s.checkpoints_kept},
          {"files_looked_up", s.files_looked_up},
          {"directories", s.directories},
          {"watched_directories", s.watched_directories},
          {"nodes_built", s.nodes.built},
          {"nodes_reused", s.nodes.reused}};
}

}  // namespace

nlohmann::json StatusJson(const std::vector<CheckpointState>& visible, const CatalogWatcher& watcher,
                          const MountFacts& mount, const fuse::FsContext& ctx, bool node_counters) {
  nlohmann::json list = nlohmann::json::array();
  size_t counts[4] = {0, 0, 0, 0};
  for (const auto& s : visible) {
    ++counts[static_cast<int>(s.phase)];
    list.push_back(CheckpointRow(s));
  }
  const MountOptions& o = *mount.options;
  const auto [mode, reason] = fuse::PassthroughState(ctx);
  using namespace protocol;
  nlohmann::json status = {{kOk, true},
                           {kSource, o.source},
                           {kMountpoint, o.mountpoint},
                           {"state_dir", mount.state_dir},
                           {kIndex, mount.index_path},
                           {kPid, ::getpid()},
                           {"scans", watcher.scans_completed()},
                           {"scan_pending", watcher.scan_pending()},
                           {"last_scan", LastScanJson(watcher.LastScan())},
                           {kCounts,
                            {{kStateExposed, counts[0]},
                             {kStateIndexing, counts[1]},
                             {kStatePending, counts[2]},
                             {kStateInvalid, counts[3]}}},
                           {kOptions, OptionsJson(o, mount.log_destination)},
                           {kPassthrough, {{kMode, mode}, {kReason, reason}}},
                           {"reads",
                            {{"requests", ctx.server->reads()},
                             {"bytes", ctx.server->bytes_read()},
                             {"failed", ctx.server->failed_reads()}}},
                           // Opens that did not wait for their copy: half the FUSE threads
                           // waited for copies already (FileServer::Options::max_waiting_opens).
                           {"opens_not_waiting", ctx.server->opens_not_waiting()},
                           // Access decisions taken without the caller's supplementary groups
                           // (fuse_ops.h): nonzero means some users may be refused what their
                           // groups grant them, and others what a group keeps out.
                           {"callers_without_groups", ctx.callers_without_groups.load()},
                           {kCache,
                            {{kTierHost, ctx.server->parts().files->GetStats().capacity},
                             {kTierChunks, ctx.server->parts().cache->Stats().slots.capacity},
                             {kPinnedMemory, ctx.server->parts().cache->Stats().slots_pinned_memory &&
                                                 ctx.server->parts().files->GetStats().locked_memory}}},
                           {kCheckpoints, list}};
  if (!node_counters) {
    // Counters of every user's files (stats keeps them to the same users).
    for (const char* key : {"reads", "last_scan", "opens_not_waiting", "callers_without_groups"}) status.erase(key);
    status[kNodeCounters] = false;
  }
  return status;
}

nlohmann::json LsJson(const std::vector<CheckpointState>& visible, const View& view, const std::string& source) {
  const auto by_name = VisibleByName(visible, view, source);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& s : visible) {
    if (!s.Serves()) continue;
    auto& row = rows[s.name];
    if (row.is_null()) {
      row = {{protocol::kName, s.name},         {protocol::kFiles, s.files},
             {protocol::kSize, s.size},         {protocol::kIndexedAt, s.indexed_at},
             {protocol::kSources, nlohmann::json::array()}, {protocol::kByName, by_name.at(s.name)}};
    }
    row[protocol::kSources].push_back(s.path);
  }
  nlohmann::json list = nlohmann::json::array();
  for (auto& [name, row] : rows) list.push_back(std::move(row));
  return {{protocol::kOk, true}, {protocol::kCheckpoints, list}};
}

}  // namespace ckptfs::daemon
