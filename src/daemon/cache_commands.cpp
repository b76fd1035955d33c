#include "cache_commands.h"

#include <chrono>
#include <fstream>
#include <set>

#include "ckptfs/control_protocol.h"
#include "ckptfs/file_server.h"

namespace ckptfs::daemon {

namespace {

nlohmann::json Refuse(const std::string& why) { return protocol::ErrorReply(why); }

// The files a request's "path" names: a digest directory, a directory in it,
// a file, or a by-name directory that is itself a checkpoint (run7/ holding
// checkpoint-500/), which stands for its own digest directory. The client
// resolves by-name links before asking. Errors leave the path out: the
// client says which path it asked about.
Result<std::vector<View::NodePtr>> FilesOf(fuse::FsContext& ctx, const ControlServer::Request& r) {
  if (!r.body.contains(protocol::kPath) || !r.body[protocol::kPath].is_string()) return Status::Error("missing \"path\"");
  const std::string path = r.body[protocol::kPath];
  auto node = ctx.view->Resolve(path);
  if (node && !node->own_digest.empty()) node = ctx.view->Resolve(node->own_digest);
  if (!node) return Status::Error("no such file or directory in the mount");
  if (node->digest.empty()) {
    return Status::Error("not a checkpoint nor inside a digest directory (give sha256-<hex>[/FILE], a by-name link "
                         "or a by-name directory of a checkpoint)");
  }
  return ctx.view->FilesUnder(node);
}

nlohmann::json ChunkTierJson(const ChunkTierStats& t) {
  using namespace protocol;
  return {{kCapacity, t.capacity}, {kUsed, t.used},   {kPinned, t.pinned},        {kHits, t.hits},
          {kMisses, t.misses},     {kFills, t.fills}, {kEvictions, t.evictions},
          {"fills_from_host_copy", t.fills_from_host_copy}, {"fill_waits", t.fill_waits}};
}

}  // namespace

namespace {

// The chunk-cache preload (fill=off): every chunk of `files` into the chunk
// cache. It copies a chunk of a file resident in the host tier from there
// (those bytes were verified at fill); `fill` reads the source only for the
// others.
nlohmann::json PreloadChunks(fuse::FsContext& ctx, const ControlServer::Request& r, const std::vector<View::NodePtr>& files,
                             bool pin, uint64_t total) {
  uint64_t done = 0;
  auto last_progress = std::chrono::steady_clock::now();
  for (const auto& f : files) {
    for (uint64_t c = 0; c < ChunkCount(f->size); ++c) {
      if (r.stopping->load()) return Refuse("the daemon is stopping");
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, f->size - c * kChunkSize));
      Status s = ctx.server->parts().cache->Load(
          {f->sha256, static_cast<uint32_t>(c)}, len,
          [&](uint8_t* dst, size_t n) { return ctx.server->ReadVerifiedChunk(f, c, dst, n); }, pin);
      if (!s.ok()) {  // a source failure was reported by ReadVerifiedChunk
        return Refuse("preload stopped after " + std::to_string(done) + " bytes: " + s.message());
      }
      done += len;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_progress > std::chrono::milliseconds(200)) {
        last_progress = now;
        if (!r.progress(protocol::ProgressLine(done, total))) return Refuse("client went away");
      }
    }
  }
  return {{protocol::kOk, true}, {protocol::kBytes, done}};
}

// The host-tier preload: every file copied whole into a sealed memfd.
nlohmann::json PreloadFiles(fuse::FsContext& ctx, const ControlServer::Request& r, const std::vector<View::NodePtr>& files,
                            bool pin, uint64_t total) {
  uint64_t done = 0;
  for (const auto& f : files) {
    auto filled = ctx.server->Fill(f, pin, [&](uint64_t bytes) {
      return !r.stopping->load() && r.progress(protocol::ProgressLine(done + bytes, total));
    });
    if (!filled.ok()) {
      return Refuse("preload stopped after " + std::to_string(done) + " bytes: " + f->source_path + ": " +
                    filled.status().message());
    }
    done += f->size;
    if (!r.progress(protocol::ProgressLine(done, total))) return Refuse("client went away");
  }
  return {{protocol::kOk, true}, {protocol::kBytes, done}};
}

}  // namespace

nlohmann::json HandlePreload(fuse::FsContext& ctx, const ControlServer::Request& r) {
  const std::string tier_name = r.body.value(protocol::kTier, std::string(protocol::kTierHost));
  if (tier_name == protocol::kRemovedTierGpu) return Refuse(protocol::kRemovedTierGpuWhy);
  if (tier_name != protocol::kTierHost) return Refuse("tier must be host, not " + tier_name);
  auto files = FilesOf(ctx, r);
  if (!files.ok()) return Refuse(files.status().message());
  const bool pin = r.body.value(protocol::kPin, false);
  uint64_t total = 0;
  for (const auto& f : *files) total += f->size;
  const bool whole_files = ctx.server->options().fill != FillPolicy::kOff && ctx.server->fills_whole_files();
  nlohmann::json out =
      whole_files ? PreloadFiles(ctx, r, *files, pin, total) : PreloadChunks(ctx, r, *files, pin, total);
  if (out[protocol::kOk] != true) return out;
  out[protocol::kFiles] = files->size();
  // The tier the files went into: whole into the host tier, or as chunks.
  out[protocol::kTier] = whole_files ? protocol::kTierHost : protocol::kTierChunks;
  out[protocol::kPinned] = pin;
  return out;
}

namespace {

// Applies `drop` (Unpin or Evict) in every tier, once to every distinct
// file under the request's path; answers with the bytes they report.
nlohmann::json ForEachFile(fuse::FsContext& ctx, const ControlServer::Request& r,
                           uint64_t (CacheTier::*drop)(const Sha256Digest&)) {
  auto files = FilesOf(ctx, r);
  if (!files.ok()) return Refuse(files.status().message());
  uint64_t bytes = 0;
  std::set<Sha256Digest> seen;
  for (const auto& f : *files) {
    if (!seen.insert(f->sha256).second) continue;
    for (CacheTier* tier : ctx.server->tiers()) bytes += (tier->*drop)(f->sha256);
  }
  return {{protocol::kOk, true}, {protocol::kBytes, bytes}};
}

// The first "Key: N kB" line of a /proc file, in bytes (0 when absent).
uint64_t ProcKib(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

// The kernel's setting for 2 MiB pages in shmem (memfds); how much of the
// daemon's mappings of them the kernel maps with huge pages now (the daemon
// maps each copy but reads only what it serves itself without passthrough,
// so this is often 0); and the machine's shmem held in huge pages (the
// copies' pages, with any other program's huge shmem: /proc/meminfo has no
// finer count).
nlohmann::json HugePages() {
  const std::string setting = SealedCopy::ShmemHugePages();
  const uint64_t pmd_mapped = ProcKib("/proc/self/smaps_rollup", "ShmemPmdMapped");
  const uint64_t machine_huge = ProcKib("/proc/meminfo", "ShmemHugePages");
  const char* use = setting == "never" || setting == "deny"
                        ? "no: shmem_enabled forbids them (see the shmem_huge= option)"
                    : SealedCopy::FreshMemoryIsSlow()
                        ? "no: this VM reports free pages to its host, where a fresh 2 MiB page is slower to touch "
                          "than 512 small ones; copies are written through a mapping of 4 KiB pages, but for the "
                          "2 MiB pages the page reserve hands to fills (page_reserve=)"
                    : setting == "advise" ? "asked for: copies are written through a MADV_HUGEPAGE mapping"
                                          : "as shmem_enabled decides";
  return {{protocol::kShmemEnabled, setting},
          {"free_page_reporting", SealedCopy::FreshMemoryIsSlow()},
          {protocol::kUsed, use},
          {protocol::kMappedBytes, pmd_mapped},
          {"machine_shmem_huge_bytes", machine_huge}};
}

nlohmann::json HostTierJson(const FileCache::Stats& f) {
  using namespace protocol;
  return {{kCapacity, f.capacity},   {kUsed, f.used},     {kPinned, f.pinned},    {kHits, f.hits},
          {kMisses, f.misses},       {kFills, f.fills},   {kEvictions, f.evictions}, {kFiles, f.files},
          {"filling", f.filling},    {kHeldByReaders, f.held_by_readers}, {"registered", f.registered},
          // memfds held by the tier (resident copies and fills), of the most
          // it may hold; files kept in the daemon's memory hold none
          {"descriptors", f.descriptors},
          {"descriptor_budget", f.descriptor_budget},
          {"in_memory", f.in_memory}};
}

// Per digest directory: bytes of its distinct files held by each tier
// (under the tier's name: whole files in the host tier, chunks), and pinned.
// Only the digests in `by_name` (those the caller may see), with their
// by-name paths.
nlohmann::json PerCheckpoint(fuse::FsContext& ctx, const std::map<std::string, std::vector<std::string>>& by_name) {
  struct TierResidency {
    const char* name;
    std::map<Sha256Digest, CacheTier::Residency> files;
  };
  std::vector<TierResidency> tiers;
  for (const CacheTier* tier : ctx.server->tiers()) tiers.push_back({tier->name(), tier->ResidencyByFile()});
  nlohmann::json per = nlohmann::json::array();
  auto root = ctx.view->Get(FUSE_ROOT_ID);
  for (const auto& [name, ino] : root->children) {
    const auto visible = by_name.find(name);
    if (name.rfind("sha256-", 0) != 0 || visible == by_name.end()) continue;
    // Both tiers' keys, whichever tiers this server has.
    nlohmann::json entry = {{protocol::kName, name},
                            {protocol::kByName, visible->second},
                            {protocol::kTierHost, 0},
                            {protocol::kTierChunks, 0}};
    std::set<Sha256Digest> distinct;
    for (const auto& f : ctx.view->FilesUnder(ctx.view->Get(ino))) distinct.insert(f->sha256);
    uint64_t pinned = 0;
    for (const TierResidency& tier : tiers) {
      uint64_t held = 0;
      for (const Sha256Digest& file : distinct) {
        if (auto it = tier.files.find(file); it != tier.files.end()) {
          held += it->second.bytes;
          pinned += it->second.pinned;
        }
      }
      entry[tier.name] = held;
    }
    entry[protocol::kPinned] = pinned;
    per.push_back(std::move(entry));
  }
  return per;
}

// Copies made as files were hashed (fill_on_index), counted apart from the
// fills above, which they are among.
nlohmann::json IndexFillsJson(const HostTierFill* index_fill) {
  const HostTierFill::Stats s = index_fill != nullptr ? index_fill->GetStats() : HostTierFill::Stats{};
  const auto policy = index_fill != nullptr ? index_fill->policy() : HostTierFill::Policy::kOff;
  using namespace protocol;
  return {{kFillPolicy, WordOf(kFillOnIndexWords, policy)},
          {kFillsCompleted, s.fills},
          {kBytes, s.bytes},
          {kFillsSkipped, s.skipped},
          {kFillsAbandoned, s.abandoned},
          // of the bytes copied, those written into 2 MiB pages the page reserve freed for them
          {"reserve_bytes", s.reserve_bytes}};
}

// page_reserve=: the 2 MiB pages the host tier keeps for its next copies
// (within cache_size, beside the copies: see FileCache), what it was lent
// and may hold at most, what is promised to fills in flight, the pages it
// took (and the seconds that took: fresh memory is the slow part) and
// freed (for copies, or for room).
nlohmann::json PageReserveJson(const FileCache::Stats& f) {
  if (!f.page_reserve) return {{"on", false}};
  const PageReserve::Stats& r = f.reserve;
  constexpr uint64_t kPage = PageReserve::kPageBytes;
  return {{"on", true},
          {"bytes", r.pages * kPage},
          {"target", r.target * kPage},
          {"limit", r.limit * kPage},
          {"promised", f.reserve_promised},
          {"grown_bytes", r.grown * kPage},
          {"grow_seconds", r.grow_seconds},
          {"given_bytes", r.given * kPage},
          {"refused", r.refused}};
}

nlohmann::json FillsJson(FileServer& server, const FileCache::Stats& f, const HostTierFill* index_fill) {
  const FileServer::FillStats fills = server.GetFillStats();
  const double rate = f.fill_seconds > 0 ? static_cast<double>(f.fill_bytes) / f.fill_seconds : 0;
  using namespace protocol;
  return {{kFillPolicy, WordOf(kFillPolicyWords, server.options().fill)},
          {kFillDepth, fills.depth},
          {kFillsCompleted, f.fills},
          {kBytes, f.fill_bytes},
          {"seconds", f.fill_seconds},
          {kBytesPerSecond, static_cast<uint64_t>(rate)},
          {kFillsAbandoned, f.fills_abandoned},
          {"failed", fills.failed},
          {kFillsSkipped, fills.skipped},
          // reads served from a copy while it was being made (its verified chunks)
          {"streamed_reads", fills.streamed_reads},
          // copies sealed only once their SHA-256 passed, chunk by chunk
          // against the file's chain or whole (verify=sha256; under auto,
          // copies read from a source not only root's and the mount owner's)
          {"proven", fills.proven},
          // fill=wait opens that began their copy without waiting for it,
          // because their opener was reading the shards' headers first
          {"header_scan_opens", fills.header_scan_opens},
          // what fills and chunk reads check (verify=), and the files whose
          // index rows have no SHA-256 chain and whose chain a pass over the
          // whole file proved, held for the chunk path
          {"verify", WordOf(kVerifyWords, server.options().verify)},
          {"proven_files", server.parts().proven != nullptr ? server.parts().proven->tables() : 0},
          {"from_indexing", IndexFillsJson(index_fill)},
          // How fills read the source (fill_io=), the bytes read with O_DIRECT,
          // and the direct reads that had to be buffered (a filesystem that
          // refuses O_DIRECT, a copy not aligned for it).
          {"io", WordOf(kSourceIoWords, fills.io)},
          {"direct_bytes", server.parts().reader->direct_bytes_read()},
          {"cached_bytes", server.parts().reader->cached_bytes_read()},
          {"direct_refused", server.parts().reader->direct_reads_refused()}};
}

}  // namespace

nlohmann::json HandleUnpin(fuse::FsContext& ctx, const ControlServer::Request& r) {
  return ForEachFile(ctx, r, &CacheTier::Unpin);
}

nlohmann::json HandleEvict(fuse::FsContext& ctx, const ControlServer::Request& r) {
  return ForEachFile(ctx, r, &CacheTier::Evict);
}

nlohmann::json HandleStats(fuse::FsContext& ctx, const HostTierFill* index_fill,
                           const std::map<std::string, std::vector<std::string>>& by_name, bool node_counters) {
  using namespace protocol;
  const auto [mode, reason] = fuse::PassthroughState(ctx);
  if (!node_counters) {
    // The node's counters move with every user's opens and fills: another
    // user could read the exact size of a private file from their deltas,
    // and when its owner loads it (found attacking the daemon).
    return {{kOk, true},
            {kNodeCounters, false},
            {kPassthrough, {{kMode, mode}, {kReason, reason}}},
            {kCheckpoints, PerCheckpoint(ctx, by_name)}};
  }
  FileServer& server = *ctx.server;
  CacheStats s = server.parts().cache->Stats();
  const FileCache::Stats f = server.parts().files != nullptr ? server.parts().files->GetStats() : FileCache::Stats{};
  nlohmann::json tiers = {{kTierHost, HostTierJson(f)}, {kTierChunks, ChunkTierJson(s.slots)}};
  nlohmann::json opens = nlohmann::json::object();
  for (const auto& [how, n] : ctx.opens.Get()) opens[how] = n;
  return {{kOk, true},
          {kNodeCounters, true},
          {kPassthrough, {{kMode, mode}, {kReason, reason}}},
          {kOpens, opens},
          {"open_inodes", ctx.open_modes.inodes()},
          {"kernel_held_nodes", ctx.view->KernelHeldNodes()},
          {"lookups_not_found", ctx.lookups_not_found.load()},
          {kTiers, tiers},
          {kHeldByReaders, f.held_by_readers},
          {kFills, FillsJson(server, f, index_fill)},
          {kMemory,
           {{kLocked, f.locked_memory && s.slots_pinned_memory},
            {kHugePages, HugePages()},
            {"page_reserve", PageReserveJson(f)}}},
          {kVerificationFailures, s.verification_failures},
          {kReadaheadFills, s.readahead_fills},
          {kReadaheadHits, s.readahead_hits},
          {kPreloadFills, s.preload_fills},
          {"uncached_reads", s.uncached_reads},
          {kSourceBytesRead, server.parts().reader->bytes_read()},
          {"source_chunks_read", server.parts().reader->chunks_read()},
          // opens of source files by path, and those kept open between chunks now
          {"source_opens", server.parts().reader->source_opens()},
          {"source_files_open", server.parts().reader->source_files_open()},
          {"read_requests", server.reads()},
          {kBytesServed, server.bytes_read()},
          {kFailedReads, server.failed_reads()},
          {kCheckpoints, PerCheckpoint(ctx, by_name)}};
}

}  // namespace ckptfs::daemon
