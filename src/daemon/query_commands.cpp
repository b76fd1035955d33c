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
  nlohmann::json j{{"path", s.path}, {"state", PhaseName(s.phase)}, {protocol::kFiles, s.files}, {"size", s.size}};
  if (!s.name.empty()) j[protocol::kName] = s.name;
  if (!s.reason.empty()) j["reason"] = s.reason;
  if (s.phase == CheckpointState::Phase::kIndexing) {
    j["bytes_done"] = s.bytes_done;
    j["bytes_total"] = s.bytes_total;
  }
  if (s.indexed_at) j["indexed_at"] = s.indexed_at;
  return j;
}

nlohmann::json OptionsJson(const MountOptions& o, const std::string& log_destination) {
  return {{"rescan", o.rescan_s},
          {"settle", o.settle_s},
          {"symlinks", o.symlinks == SymlinkPolicy::kFollow ? "follow" : "contained"},
          {"threads", EffectiveThreads(o.threads)},
          {"readahead", o.readahead},
          {"allow_other", o.allow_other},
          {"stamp_headers", o.stamp_headers},
          {"passthrough", o.passthrough ? "auto" : "off"},
          {"fill", o.fill},
          {"fill_depth", FillDepth(o)},
          {"fill_io", o.fill_direct ? "direct" : "buffered"},
          {"shmem_huge", o.shmem_huge_advise ? "advise" : "keep"},
          {"log", o.log_level},
          {"log_file", log_destination}};
}

nlohmann::json LastScanJson(const CatalogWatcher::ScanStats& s) {
  return {{"seconds", s.seconds},
          {"incremental", s.incremental},
          {"dirs_reused", s.dirs_reused},
          {"checkpoints", s.checkpoints},
          {"checkpoints_kept", s.checkpoints_kept},
          {"files_looked_up", s.files_looked_up},
          {"nodes_built", s.nodes.built},
          {"nodes_reused", s.nodes.reused}};
}

}  // namespace

nlohmann::json StatusJson(const std::vector<CheckpointState>& visible, const CatalogWatcher& watcher,
                          const MountFacts& mount, const FsContext& ctx) {
  nlohmann::json list = nlohmann::json::array();
  size_t counts[4] = {0, 0, 0, 0};
  for (const auto& s : visible) {
    ++counts[static_cast<int>(s.phase)];
    list.push_back(CheckpointRow(s));
  }
  const MountOptions& o = *mount.options;
  const auto [mode, reason] = PassthroughState(ctx);
  return {{protocol::kOk, true},
          {"source", o.source},
          {"mountpoint", o.mountpoint},
          {"state_dir", mount.state_dir},
          {"index", mount.index_path},
          {"pid", ::getpid()},
          {"scans", watcher.scans_completed()},
          {"last_scan", LastScanJson(watcher.LastScan())},
          {"counts",
           {{"exposed", counts[0]}, {"indexing", counts[1]}, {"pending", counts[2]}, {"invalid", counts[3]}}},
          {"options", OptionsJson(o, mount.log_destination)},
          {"passthrough", {{"mode", mode}, {"reason", reason}}},
          {"reads", {{"requests", ctx.reads.load()}, {"bytes", ctx.bytes_read.load()}, {"failed", ctx.failed_reads.load()}}},
          {"cache",
           {{"host", ctx.files->GetStats().capacity},
            {"chunks", ctx.cache->Stats().host.capacity},
            {"gpu", ctx.cache->Stats().gpu.capacity},
            {"pinned_memory", ctx.cache->Stats().host_pinned_memory && ctx.files->GetStats().locked_memory}}},
          {protocol::kCheckpoints, list}};
}

nlohmann::json LsJson(const std::vector<CheckpointState>& visible, const View& view, const std::string& source) {
  const auto by_name = VisibleByName(visible, view, source);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& s : visible) {
    if (s.phase != CheckpointState::Phase::kExposed) continue;
    auto& row = rows[s.name];
    if (row.is_null()) {
      row = {{protocol::kName, s.name}, {protocol::kFiles, s.files}, {"size", s.size}, {"indexed_at", s.indexed_at},
             {"sources", nlohmann::json::array()}, {protocol::kByName, by_name.at(s.name)}};
    }
    row["sources"].push_back(s.path);
  }
  nlohmann::json list = nlohmann::json::array();
  for (auto& [name, row] : rows) list.push_back(std::move(row));
  return {{protocol::kOk, true}, {protocol::kCheckpoints, list}};
}

}  // namespace ckptfs::daemon
