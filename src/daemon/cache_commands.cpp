#include "cache_commands.h"

#include <chrono>
#include <set>

namespace ckptfs::daemon {

namespace {

nlohmann::json Refuse(const std::string& why) { return {{"ok", false}, {"error", why}}; }

// The files a request's "path" names: a digest directory, a directory in it,
// a file, or a by-name directory that is itself a checkpoint (run7/ holding
// checkpoint-500/), which stands for its own digest directory. The client
// resolves by-name links before asking. Errors leave the path out: the
// client says which path it asked about.
Result<std::vector<View::NodePtr>> FilesOf(FsContext& ctx, const ControlServer::Request& r) {
  if (!r.body.contains("path") || !r.body["path"].is_string()) return Status::Error("missing \"path\"");
  const std::string path = r.body["path"];
  auto node = ctx.view->Resolve(path);
  if (node && !node->own_digest.empty()) node = ctx.view->Resolve(node->own_digest);
  if (!node) return Status::Error("no such file or directory in the mount");
  if (node->digest.empty()) {
    return Status::Error("not a checkpoint nor inside a digest directory (give sha256-<hex>[/FILE], a by-name link "
                         "or a by-name directory of a checkpoint)");
  }
  return ctx.view->FilesUnder(node);
}

nlohmann::json TierJson(const TierStats& t) {
  return {{"capacity", t.capacity}, {"used", t.used},         {"pinned", t.pinned},  {"hits", t.hits},
          {"misses", t.misses},     {"fills", t.fills},       {"evictions", t.evictions}};
}

}  // namespace

nlohmann::json HandlePreload(FsContext& ctx, const ControlServer::Request& r) {
  if (!r.privileged) return Refuse("preload is for root or the mount's owner");
  auto files = FilesOf(ctx, r);
  if (!files.ok()) return Refuse(files.status().message());
  const std::string tier_name = r.body.value("tier", std::string("host"));
  if (tier_name != "host" && tier_name != "gpu") return Refuse("tier must be host or gpu, not " + tier_name);
  const Tier tier = tier_name == "gpu" ? Tier::kGpu : Tier::kHost;
  const bool pin = r.body.value("pin", false);

  uint64_t total = 0, done = 0;
  for (const auto& f : *files) total += f->size;
  auto last_progress = std::chrono::steady_clock::now();
  for (const auto& f : *files) {
    for (uint64_t c = 0; c < ChunkCount(f->size); ++c) {
      if (r.stopping->load()) return Refuse("the daemon is stopping");
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, f->size - c * kChunkSize));
      Status s = ctx.cache->Load(
          {f->sha256, static_cast<uint32_t>(c)}, len,
          [&](uint8_t* dst, size_t n) { return ctx.reader->ReadChunk(f->source_path, f->stamp, *f->chunks, c, dst, n); },
          tier, pin);
      if (!s.ok()) {
        ReportSourceFailure(ctx, *f, s);
        return Refuse("preload stopped after " + std::to_string(done) + " bytes: " + s.message());
      }
      done += len;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_progress > std::chrono::milliseconds(200)) {
        last_progress = now;
        if (!r.progress({{"progress", done}, {"total", total}})) return Refuse("client went away");
      }
    }
  }
  return {{"ok", true}, {"files", files->size()}, {"bytes", done}, {"tier", tier_name}, {"pinned", pin}};
}

namespace {

// Applies `drop` (Unpin or Evict) once to every distinct file under the
// request's path; answers with the bytes it reports.
nlohmann::json ForEachFile(FsContext& ctx, const ControlServer::Request& r, const char* what,
                           uint64_t (ChunkCache::*drop)(const Sha256Digest&)) {
  if (!r.privileged) return Refuse(std::string(what) + " is for root or the mount's owner");
  auto files = FilesOf(ctx, r);
  if (!files.ok()) return Refuse(files.status().message());
  uint64_t bytes = 0;
  std::set<Sha256Digest> seen;
  for (const auto& f : *files) {
    if (seen.insert(f->sha256).second) bytes += (ctx.cache->*drop)(f->sha256);
  }
  return {{"ok", true}, {"bytes", bytes}};
}

}  // namespace

nlohmann::json HandleUnpin(FsContext& ctx, const ControlServer::Request& r) {
  return ForEachFile(ctx, r, "unpin", &ChunkCache::Unpin);
}

nlohmann::json HandleEvict(FsContext& ctx, const ControlServer::Request& r) {
  return ForEachFile(ctx, r, "evict", &ChunkCache::Evict);
}

nlohmann::json HandleStats(FsContext& ctx, const std::map<std::string, std::vector<std::string>>& by_name) {
  CacheStats s = ctx.cache->Stats();
  nlohmann::json per = nlohmann::json::array();
  const auto resident = ctx.cache->ResidencyByFile();
  auto root = ctx.view->Get(FUSE_ROOT_ID);
  for (const auto& [name, ino] : root->children) {
    const auto visible = by_name.find(name);
    if (name.rfind("sha256-", 0) != 0 || visible == by_name.end()) continue;
    uint64_t host = 0, gpu = 0, pinned = 0;
    std::set<Sha256Digest> seen;
    for (const auto& f : ctx.view->FilesUnder(ctx.view->Get(ino))) {
      if (!seen.insert(f->sha256).second) continue;
      auto it = resident.find(f->sha256);
      if (it == resident.end()) continue;
      const auto& res = it->second;
      host += res.host;
      gpu += res.gpu;
      pinned += res.pinned;
    }
    per.push_back({{"name", name}, {"by_name", visible->second}, {"host", host}, {"gpu", gpu}, {"pinned", pinned}});
  }
  nlohmann::json tiers = {{"host", TierJson(s.host)}};
  if (s.gpu_enabled) tiers["gpu"] = TierJson(s.gpu);
  return {{"ok", true},
          {"tiers", tiers},
          {"verification_failures", s.verification_failures},
          {"readahead_fills", s.readahead_fills},
          {"readahead_hits", s.readahead_hits},
          {"preload_fills", s.preload_fills},
          {"uncached_reads", s.uncached_reads},
          {"source_bytes_read", ctx.reader->bytes_read()},
          {"source_chunks_read", ctx.reader->chunks_read()},
          {"read_requests", ctx.reads.load()},
          {"bytes_served", ctx.bytes_read.load()},
          {"failed_reads", ctx.failed_reads.load()},
          {"checkpoints", per}};
}

}  // namespace ckptfs::daemon
