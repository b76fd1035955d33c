// ckptfsctl preload / unpin / evict / stats: the cache tiers of a mount.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "ckptfs/control.h"
#include "ckptfs/control_protocol.h"
#include "progress.h"
#include "ctl.h"

namespace ckptfs::ctl {

using namespace protocol;  // the reply keys

namespace {

std::string Prom(const std::string& name, const std::string& labels, uint64_t v) {
  return "ckptfs_" + name + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(v) + "\n";
}

// The node's counters (root and the mount's owner only: kNodeCounters).
std::string NodeMetrics(const nlohmann::json& j, const std::string& mnt) {
  std::string out;
  struct Metric {
    const char* key;
    const char* name;
    const char* type;
    const char* help;
  } metrics[] = {
      {kCapacity, "cache_capacity_bytes", "gauge", "Capacity of the cache tier."},
      {kUsed, "cache_used_bytes", "gauge", "Bytes held by the cache tier."},
      {kPinned, "cache_pinned_bytes", "gauge", "Bytes pinned in the cache tier."},
      {kHits, "cache_hits_total", "counter", "Lookups served by the tier."},
      {kMisses, "cache_misses_total", "counter", "Lookups the tier could not serve."},
      {kFills, "cache_fills_total", "counter", "Files or chunks put into the tier."},
      {kEvictions, "cache_evictions_total", "counter", "Files or chunks evicted from the tier."},
  };
  for (const auto& m : metrics) {
    out += std::string("# HELP ckptfs_") + m.name + " " + m.help + "\n# TYPE ckptfs_" + m.name + " " + m.type + "\n";
    for (const auto& [tier, t] : j[kTiers].items()) {
      out += Prom(m.name, mnt + ",tier=\"" + tier + "\"", t[m.key].get<uint64_t>());
    }
  }
  struct Counter {
    const char* key;
    const char* name;
    const char* help;
  } counters[] = {
      {kVerificationFailures, "verification_failures_total", "Chunks that did not match the index."},
      {kReadaheadFills, "readahead_fills_total", "Chunks filled ahead of a sequential reader."},
      {kReadaheadHits, "readahead_hits_total", "Chunks filled ahead of a reader and then read."},
      {kPreloadFills, "preload_fills_total", "Chunks filled by ckptfsctl preload."},
      {kSourceBytesRead, "source_read_bytes_total", "Bytes read from source files."},
      {kBytesServed, "served_bytes_total", "Bytes returned to readers."},
      {kFailedReads, "failed_reads_total", "Read requests answered with an error."},
  };
  for (const auto& c : counters) {
    out += std::string("# HELP ckptfs_") + c.name + " " + c.help + "\n# TYPE ckptfs_" + c.name + " counter\n";
    out += Prom(c.name, mnt, j[c.key].get<uint64_t>());
  }
  out += "# HELP ckptfs_held_by_readers_bytes Evicted host-tier copies that readers (open files, mappings) still hold, within the capacity.\n"
         "# TYPE ckptfs_held_by_readers_bytes gauge\n" +
         Prom("held_by_readers_bytes", mnt, j[kHeldByReaders].get<uint64_t>());
  out += "# HELP ckptfs_fill_bytes_total Bytes copied into the host tier.\n# TYPE ckptfs_fill_bytes_total counter\n" +
         Prom("fill_bytes_total", mnt, j[kFills][kBytes].get<uint64_t>());
  out += "# HELP ckptfs_opens_total Opens of files, by how they were served.\n# TYPE ckptfs_opens_total counter\n";
  for (const auto& [how, n] : j[kOpens].items()) out += Prom("opens_total", mnt + ",how=\"" + how + "\"", n.get<uint64_t>());
  return out;
}

// The text exposition format, for node_exporter's textfile collector.
void PrintPrometheus(const nlohmann::json& j, const std::string& mountpoint) {
  std::string out;
  const std::string mnt = "mountpoint=\"" + mountpoint + "\"";
  if (j.value(kNodeCounters, true)) out += NodeMetrics(j, mnt);
  out += "# HELP ckptfs_checkpoint_resident_bytes Bytes of a checkpoint held by a cache tier.\n"
         "# TYPE ckptfs_checkpoint_resident_bytes gauge\n";
  for (const auto& cp : j[kCheckpoints]) {
    const std::string l = mnt + ",checkpoint=\"" + cp[kName].get<std::string>() + "\"";
    for (const char* tier : {kTierHost, kTierChunks}) {
      out += Prom("checkpoint_resident_bytes", l + ",tier=\"" + tier + "\"", cp[tier].get<uint64_t>());
    }
  }
  out += "# HELP ckptfs_checkpoint_pinned_bytes Bytes of a checkpoint pinned in the cache.\n"
         "# TYPE ckptfs_checkpoint_pinned_bytes gauge\n";
  for (const auto& cp : j[kCheckpoints]) {
    out += Prom("checkpoint_pinned_bytes", mnt + ",checkpoint=\"" + cp[kName].get<std::string>() + "\"",
                cp[kPinned].get<uint64_t>());
  }
  std::fputs(out.c_str(), stdout);
}

// The host tier of whole files: passthrough, how opens were served, fills,
// memory held by readers after eviction, huge pages.
void PrintHostTier(const nlohmann::json& j) {
  std::printf("passthrough %s: %s\n", j[kPassthrough][kMode].get<std::string>().c_str(),
              j[kPassthrough][kReason].get<std::string>().c_str());
  std::string opens;
  for (const auto& [how, n] : j[kOpens].items()) {
    opens += (opens.empty() ? "" : ", ") + how + " " + std::to_string(n.get<uint64_t>());
  }
  std::printf("opens       %s\n", opens.empty() ? "none yet" : opens.c_str());
  const auto& f = j[kFills];
  std::printf("fills       %llu (%s at %s/s), %llu abandoned, %llu skipped; fill=%s, depth %u\n",
              static_cast<unsigned long long>(f[kFillsCompleted].get<uint64_t>()),
              FormatBytes(f[kBytes].get<uint64_t>()).c_str(), FormatBytes(f[kBytesPerSecond].get<uint64_t>()).c_str(),
              static_cast<unsigned long long>(f[kFillsAbandoned].get<uint64_t>()),
              static_cast<unsigned long long>(f[kFillsSkipped].get<uint64_t>()),
              f[kFillPolicy].get<std::string>().c_str(),
              f[kFillDepth].get<unsigned>());
  if (f.contains("from_indexing")) {
    const auto& x = f["from_indexing"];
    std::printf("            of which %llu (%s) at indexing, %llu skipped (no free room), %llu abandoned; "
                "fill_on_index=%s\n",
                static_cast<unsigned long long>(x[kFillsCompleted].get<uint64_t>()),
                FormatBytes(x[kBytes].get<uint64_t>()).c_str(),
                static_cast<unsigned long long>(x[kFillsSkipped].get<uint64_t>()),
                static_cast<unsigned long long>(x[kFillsAbandoned].get<uint64_t>()),
                x[kFillPolicy].get<std::string>().c_str());
  }
  if (f.contains("streamed_reads") && f.contains("header_scan_opens")) {
    std::printf("            %llu reads served from copies being made; %llu opens began their copy without "
                "waiting (a loader reading every shard's header first)\n",
                static_cast<unsigned long long>(f["streamed_reads"].get<uint64_t>()),
                static_cast<unsigned long long>(f["header_scan_opens"].get<uint64_t>()));
  }
  const auto& huge = j[kMemory][kHugePages];
  std::printf("memory      %s held by readers of evicted files; %s; huge pages: %s (shmem_enabled=%s, %s mapped)\n",
              FormatBytes(j[kHeldByReaders].get<uint64_t>()).c_str(),
              j[kMemory][kLocked].get<bool>() ? "pinned memory locked" : "pinned memory NOT locked",
              huge[kUsed].get<std::string>().c_str(), huge[kShmemEnabled].get<std::string>().c_str(),
              FormatBytes(huge[kMappedBytes].get<uint64_t>()).c_str());
  const nlohmann::json reserve = j[kMemory].value("page_reserve", nlohmann::json::object());
  if (reserve.value("on", false)) {
    const uint64_t grown = reserve["grown_bytes"].get<uint64_t>();
    const double seconds = reserve["grow_seconds"].get<double>();
    std::printf(
        "            page reserve %s of %s (%s promised to fills); took %s at %s/s, gave %s; %s copied "
        "into its pages at indexing\n",
        FormatBytes(reserve["bytes"].get<uint64_t>()).c_str(), FormatBytes(reserve["limit"].get<uint64_t>()).c_str(),
        FormatBytes(reserve["promised"].get<uint64_t>()).c_str(), FormatBytes(grown).c_str(),
        FormatBytes(seconds > 0 ? static_cast<uint64_t>(static_cast<double>(grown) / seconds) : 0).c_str(),
        FormatBytes(reserve["given_bytes"].get<uint64_t>()).c_str(),
        FormatBytes(f.contains("from_indexing") ? f["from_indexing"].value("reserve_bytes", uint64_t{0}) : 0).c_str());
  }
}

void PrintNodeCounters(const nlohmann::json& j) {
  std::printf("%-6s %11s %11s %11s %10s %10s %10s %10s\n", "TIER", "CAPACITY", "USED", "PINNED", "HITS", "MISSES",
              "FILLS", "EVICTIONS");
  for (const auto& [tier, t] : j[kTiers].items()) {
    std::printf("%-6s %11s %11s %11s %10llu %10llu %10llu %10llu\n", tier.c_str(),
                FormatBytes(t[kCapacity].get<uint64_t>()).c_str(), FormatBytes(t[kUsed].get<uint64_t>()).c_str(),
                FormatBytes(t[kPinned].get<uint64_t>()).c_str(),
                static_cast<unsigned long long>(t[kHits].get<uint64_t>()),
                static_cast<unsigned long long>(t[kMisses].get<uint64_t>()),
                static_cast<unsigned long long>(t[kFills].get<uint64_t>()),
                static_cast<unsigned long long>(t[kEvictions].get<uint64_t>()));
  }
  std::printf("\nverification failures %llu   read-ahead fills %llu, hits %llu   preload fills %llu   source read %s"
              "   served %s\n",
              static_cast<unsigned long long>(j[kVerificationFailures].get<uint64_t>()),
              static_cast<unsigned long long>(j[kReadaheadFills].get<uint64_t>()),
              static_cast<unsigned long long>(j[kReadaheadHits].get<uint64_t>()),
              static_cast<unsigned long long>(j[kPreloadFills].get<uint64_t>()),
              FormatBytes(j[kSourceBytesRead].get<uint64_t>()).c_str(),
              FormatBytes(j[kBytesServed].get<uint64_t>()).c_str());
  PrintHostTier(j);
}

void PrintStatsTable(const nlohmann::json& j) {
  if (j.value(kNodeCounters, true)) {
    PrintNodeCounters(j);
  } else {
    std::printf(
        "passthrough %s: %s\n(the node's counters, of every user's files, are shown to root and the mount's "
        "owner only)\n",
        j[kPassthrough][kMode].get<std::string>().c_str(), j[kPassthrough][kReason].get<std::string>().c_str());
  }
  std::printf("\n%-71s %11s %11s %11s  %s\n", "CHECKPOINT", "HOST", "CHUNKS", "PINNED", "BY-NAME");
  for (const auto& cp : j[kCheckpoints]) {
    std::string by_name;
    for (const auto& p : cp[kByName]) by_name += (by_name.empty() ? "" : ", ") + p.get<std::string>();
    std::printf("%-71s %11s %11s %11s  %s\n", cp[kName].get<std::string>().c_str(),
                FormatBytes(cp[kTierHost].get<uint64_t>()).c_str(),
                FormatBytes(cp[kTierChunks].get<uint64_t>()).c_str(), FormatBytes(cp[kPinned].get<uint64_t>()).c_str(),
                by_name.c_str());
  }
}

}  // namespace

int RunCacheCommand(const CacheArgs& args) {
  if (args.tier != protocol::kTierHost) {
    PrintError(args.tier == protocol::kRemovedTierGpu ? protocol::kRemovedTierGpuWhy
                                                      : "--tier " + args.tier + ": host is the only tier");
    return kExitFatal;
  }
  auto where = LocateInMount(args.path);
  if (!where.ok()) {
    PrintError(where.status().message());
    return kExitFatal;
  }
  const auto& [mountpoint, rel] = *where;
  const nlohmann::json request = args.command == protocol::kPreload
                                     ? protocol::PreloadRequest(rel, args.tier, args.pin)
                                     : protocol::PathRequest(args.command, rel);
  uint64_t last = 0;
  ProgressBar bar("preloading", args.command == protocol::kPreload && ::isatty(STDERR_FILENO) == 1);
  auto reply = CallMount(mountpoint, request, [&](const nlohmann::json& p) {
    const uint64_t done = p.value(kProgress, uint64_t{0});
    bar.SetTotal(p.value(kTotal, uint64_t{0}));
    bar.Add(done - last);
    last = done;
  });
  if (!reply.ok()) {
    PrintError(args.path + ": " + reply.status().message());
    return kExitFailure;
  }
  const uint64_t bytes = reply->value(kBytes, uint64_t{0});
  if (args.command == protocol::kPreload) {
    // Where the files went, as the daemon says: whole into the host tier, or
    // as chunks on a fill=off mount (printed from fixed words only).
    const auto went = reply->find(kTier);
    const bool as_chunks = went != reply->end() && went->is_string() && *went == protocol::kTierChunks;
    std::printf("preloaded %s (%llu file(s), %s) into the %s tier%s\n", args.path.c_str(),
                static_cast<unsigned long long>(reply->value(kFiles, uint64_t{0})), FormatBytes(bytes).c_str(),
                as_chunks ? "chunk" : "host", args.pin ? ", pinned" : "");
  } else {
    std::printf("%s %s of %s\n", args.command == protocol::kUnpin ? "unpinned" : "evicted", FormatBytes(bytes).c_str(),
                args.path.c_str());
  }
  return kExitOk;
}

int RunStats(const StatsArgs& args) {
  nlohmann::json j;
  MountPath where;
  if (auto done = QueryRowsUnder(args.path, protocol::kStats, &j, &where)) return *done;
  if (auto done = PrintJsonOrDecode(args.path, args.json, j, j)) return *done;
  if (args.prometheus) PrintPrometheus(j, where.mountpoint);
  else PrintStatsTable(j);
  return kExitOk;
}

}  // namespace ckptfs::ctl
