#include "ckptfs/indexer.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <thread>

#include "ckptfs/source_reader.h"
#include "ckptfs/stamped_size.h"
#include "ckptfs/thread_pool.h"

namespace ckptfs {

namespace {

using InodeKey = std::pair<uint64_t, uint64_t>;

// One distinct file to be resolved to hashes.
struct FileJob {
  std::string open_path;
  FileStamp stamp;
  Ownership owner;  // as the walk saw it
  std::optional<FileHashes> hashes;
  bool from_index = false;
  std::optional<std::string> error;
  bool unsettled = false;
  bool unindexed = false;
  bool safetensors = false;  // some member names it *.safetensors
  std::optional<uint64_t> stamped_size;
};

bool NamedSafetensors(const std::string& rel_path) {
  constexpr std::string_view kExt = ".safetensors";
  return rel_path.size() > kExt.size() && rel_path.compare(rel_path.size() - kExt.size(), kExt.size(), kExt) == 0;
}

// The served size under stamp_headers of every *.safetensors file, from the
// index or, when it has none and reading is allowed, from the file's header
// chunks (verified against the chunk table just computed), stored for next
// time. Done at indexing so that stat never reads a header.
void FindStampedSizes(Index* index, const IndexerOptions& options, const std::string& real_root,
                      std::map<InodeKey, FileJob>& jobs, IndexReport& report) {
  if (index == nullptr || options.ignore_index) return;
  SourceReader reader(real_root);
  for (auto& [key, job] : jobs) {
    if (!job.safetensors || !job.hashes) continue;
    if ((job.stamped_size = index->LookupStampedSize(job.hashes->sha256))) continue;
    if (options.lookup_only || (options.cancel != nullptr && options.cancel->load())) continue;
    auto size = ServedStampedSize(reader, job.open_path, job.stamp, job.hashes->chunks);
    if (!size.ok()) {
      // Not fatal: stat then reads the header itself, as the reads will.
      report.warnings.push_back(job.open_path + ": cannot read its safetensors header: " + size.status().message());
      continue;
    }
    job.stamped_size = *size;
    if (Status s = index->PutStampedSize(job.hashes->sha256, *size); !s.ok()) report.warnings.push_back(s.message());
  }
}

}  // namespace

IndexReport Indexer::Run(const CatalogScan& scan) {
  IndexReport report;

  // Distinct files across every valid checkpoint.
  std::map<InodeKey, FileJob> jobs;
  for (const auto& cp : scan.checkpoints) {
    if (!cp.valid()) continue;
    for (const auto& m : cp.members) {
      auto key = InodeKey{m.stamp.dev, m.stamp.ino};
      auto [it, added] = jobs.try_emplace(key);
      if (added) {
        it->second.open_path = m.open_path;
        it->second.stamp = m.stamp;
        it->second.owner = m.owner;
      }
      if (NamedSafetensors(m.rel_path)) it->second.safetensors = true;
    }
  }

  std::vector<FileJob*> to_hash;
  uint64_t bytes_to_hash = 0;
  for (auto& [key, job] : jobs) {
    if (!options_.ignore_index && index_ != nullptr) {
      if (auto h = index_->LookupFile(job.stamp)) {
        job.hashes = std::move(*h);
        job.from_index = true;
        ++report.files_from_index;
        continue;
      }
    }
    if (options_.lookup_only) {
      job.error = job.open_path + ": not in the index yet";
      job.unindexed = true;
      continue;
    }
    to_hash.push_back(&job);
    bytes_to_hash += job.stamp.size;
  }
  // Largest first, so the long files start early and the small ones fill in.
  std::sort(to_hash.begin(), to_hash.end(),
            [](const FileJob* a, const FileJob* b) { return a->stamp.size > b->stamp.size; });
  if (options_.on_plan) options_.on_plan(bytes_to_hash);

  const unsigned threads = EffectiveThreads(options_.threads);
  ThreadPool chunk_pool(threads);
  FileHasher hasher(&chunk_pool);
  hasher.set_source_root(scan.real_root);
  hasher.set_cancel(options_.cancel);
  if (options_.on_bytes) hasher.set_progress(options_.on_bytes);
  if (options_.chunk_read_hook) hasher.set_chunk_read_hook(options_.chunk_read_hook);

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> files_hashed{0}, bytes_hashed{0};
  std::mutex warn_mu;

  auto worker = [&] {
    for (size_t i = next++; i < to_hash.size(); i = next++) {
      if (options_.cancel != nullptr && options_.cancel->load()) {
        to_hash[i]->error = to_hash[i]->open_path + ": not hashed (the daemon is stopping)";
        continue;
      }
      FileJob& job = *to_hash[i];
      if (options_.before_hash) options_.before_hash(job.open_path);
      for (int attempt = 1;; ++attempt) {
        struct stat seen {};
        seen.st_ino = 0;
        auto result = hasher.Hash(job.open_path, job.stamp, &seen);
        if (result.ok()) {
          job.hashes = std::move(*result);
          ++files_hashed;
          bytes_hashed += job.stamp.size;
          if (!options_.ignore_index && index_ != nullptr) {
            if (Status s = index_->PutFile(job.stamp, job.open_path, *job.hashes); !s.ok()) {
              std::lock_guard lock(warn_mu);
              report.warnings.push_back(s.message());
            }
          }
          break;
        }
        if (!result.status().is_changed()) {
          job.error = result.status().message();
          break;
        }
        // Changed under us. Try again only if the path still leads to the
        // same file, as it was listed (owner and mode included): anything
        // else (a link or another file swapped in, a chmod) sends the whole
        // checkpoint back to the catalog, whose walk alone decides what a
        // path is and who may read it.
        const FileStamp now = FileStamp::FromStat(seen);
        if (seen.st_ino == 0 || now.dev != job.stamp.dev || now.ino != job.stamp.ino ||
            !(Ownership::FromStat(seen) == job.owner)) {
          job.error = result.status().message() + "; will be walked again";
          job.unsettled = true;
          break;
        }
        job.stamp = now;
        if (attempt >= options_.attempts) {
          job.error = result.status().message() + " (gave up after " + std::to_string(attempt) + " attempts)";
          job.unsettled = true;
          break;
        }
      }
    }
  };
  {
    std::vector<std::thread> workers;
    const unsigned n = std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(to_hash.size(), 1)));
    for (unsigned t = 0; t < n; ++t) workers.emplace_back(worker);
    for (auto& w : workers) w.join();
  }
  report.files_hashed = files_hashed;
  report.bytes_hashed = bytes_hashed;
  FindStampedSizes(index_, options_, scan.real_root, jobs, report);

  for (const auto& cp : scan.checkpoints) {
    IndexedCheckpoint out;
    out.rel_path = cp.rel_path;
    out.abs_path = cp.abs_path;
    if (!cp.valid()) {
      out.error = *cp.invalid_reason;
      report.checkpoints.push_back(std::move(out));
      continue;
    }
    std::vector<ManifestEntry> entries;
    for (const auto& m : cp.members) {
      const FileJob& job = jobs.at({m.stamp.dev, m.stamp.ino});
      if (job.error) {
        out.error = out.error ? *out.error + "; " + *job.error : *job.error;
        out.unsettled = out.unsettled || job.unsettled;
        out.unindexed = out.unindexed || job.unindexed;
        continue;
      }
      MemberFile hashed = m;
      hashed.stamp = job.stamp;
      entries.push_back({m.rel_path, job.hashes->sha256, job.stamp.size});
      out.files.push_back({std::move(hashed), *job.hashes, job.from_index, job.stamped_size});
      out.total_size += job.stamp.size;
    }
    if (!out.error) {
      out.manifest = CanonicalManifest(entries);
      out.name = CheckpointName(out.manifest);
      if (!options_.ignore_index && index_ != nullptr) {
        Status s = index_->PutCheckpoint(out.name, out.manifest, out.total_size, out.files.size());
        if (s.ok()) s = index_->PutSource(scan.real_root, cp.rel_path, out.name);
        if (!s.ok()) report.warnings.push_back(s.message());
      }
    } else {
      out.files.clear();
      out.total_size = 0;
    }
    report.checkpoints.push_back(std::move(out));
  }
  return report;
}

}  // namespace ckptfs
