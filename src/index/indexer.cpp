#include "ckptfs/indexer.h"

#include <sys/stat.h>

#include <algorithm>
#include <functional>
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
  bool from_manifest = false;
  std::optional<std::string> error;
  bool unsettled = false;
  bool unindexed = false;
  bool safetensors = false;  // some member names it *.safetensors
  std::optional<uint64_t> stamped_size;
};

// PATH relative to ROOT, or nothing when PATH does not lie below ROOT (a link
// followed out of the tree under symlinks=follow: no record names it).
std::optional<std::string> PathBelow(const std::string& root, const std::string& path) {
  if (root.empty() || path.size() <= root.size() || path.compare(0, root.size(), root) != 0) return std::nullopt;
  if (root == "/") return path.substr(1);
  if (path[root.size()] != '/') return std::nullopt;
  return path.substr(root.size() + 1);
}

// Runs fn(i) for i in [0, n) on up to `threads` threads.
void ParallelFor(size_t n, unsigned threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> workers;
  const unsigned count = std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(n, 1)));
  for (unsigned t = 1; t < count; ++t) workers.emplace_back(worker);
  worker();
  for (auto& w : workers) w.join();
}

// Looks the index's misses up in the manifest store, several at a time: on a
// network filesystem each is a round trip to the server. Files found are
// remembered in the index under their local stamp.
void TakeFromManifests(ManifestStore& store, Index* index, const std::string& root, unsigned threads,
                       std::vector<FileJob*>& misses, IndexReport& report) {
  std::mutex mu;
  ParallelFor(misses.size(), threads, [&](size_t i) {
    FileJob& job = *misses[i];
    auto rel = PathBelow(root, job.open_path);
    if (!rel) return;
    auto found = store.Lookup(*rel, job.stamp);
    std::lock_guard lock(mu);
    if (!found.ok()) {
      if (found.status().code() != Status::Code::kNotFound) report.warnings.push_back(found.status().message());
      return;
    }
    job.hashes = std::move(*found);
    job.from_manifest = true;
    ++report.files_from_manifests;
    if (index != nullptr) {
      if (Status s = index->PutFile(job.stamp, job.open_path, *job.hashes); !s.ok()) report.warnings.push_back(s.message());
    }
  });
  std::erase_if(misses, [](const FileJob* job) { return job->from_manifest; });
}

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
    auto stored = index->LookupStampedSize(job.hashes->sha256);
    if (!stored.ok()) {
      report.warnings.push_back(job.open_path + ": " + stored.status().message());
      continue;  // stat reads the header itself, as without an index
    }
    if ((job.stamped_size = *stored)) continue;
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


// Distinct files across every valid checkpoint, by device and inode.
std::map<InodeKey, FileJob> DistinctFiles(const CatalogScan& scan) {
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
  return jobs;
}

// Resolves the files the index (or the manifest store) knows; returns the
// others.
std::vector<FileJob*> LookUpKnown(Index* index, const IndexerOptions& options, const std::string& real_root,
                                  unsigned threads, std::map<InodeKey, FileJob>& jobs, IndexReport& report) {
  std::vector<FileJob*> misses;
  for (auto& [key, job] : jobs) {
    if (!options.ignore_index && index != nullptr) {
      auto h = index->LookupFile(job.stamp);
      if (!h.ok()) {
        // An index that cannot be read is reported, not taken for empty:
        // hashing everything again in silence would hide it.
        job.error = job.open_path + ": " + h.status().message();
        continue;
      }
      if (*h) {
        job.hashes = std::move(**h);
        job.from_index = true;
        ++report.files_from_index;
        continue;
      }
    }
    misses.push_back(&job);
  }
  if (!options.ignore_index && options.manifests != nullptr) {
    // Lookups wait on the file server, not the CPU: more of them in flight.
    constexpr unsigned kLookupsInFlight = 16;
    TakeFromManifests(*options.manifests, index, real_root, std::max(threads, kLookupsInFlight), misses, report);
  }
  return misses;
}

// Hashes files on `threads` workers, each one file at a time, largest first
// (the long files start early and the small ones fill in), and records each
// in the index and, when it can sign, in the manifest store.
class HashingRun {
 public:
  HashingRun(Index* index, const IndexerOptions& options, const std::string& real_root, IndexReport& report)
      : index_(index), options_(options), real_root_(real_root), report_(report) {}

  void Run(std::vector<FileJob*> to_hash, unsigned threads) {
    std::sort(to_hash.begin(), to_hash.end(),
              [](const FileJob* a, const FileJob* b) { return a->stamp.size > b->stamp.size; });
    ThreadPool chunk_pool(threads);
    FileHasher hasher(&chunk_pool);
    hasher.set_source_root(real_root_);
    hasher.set_cancel(options_.cancel);
    if (options_.on_bytes) hasher.set_progress(options_.on_bytes);
    if (options_.chunk_read_hook) hasher.set_chunk_read_hook(options_.chunk_read_hook);
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i = next++; i < to_hash.size(); i = next++) {
        if (options_.cancel != nullptr && options_.cancel->load()) {
          to_hash[i]->error = to_hash[i]->open_path + ": not hashed (the daemon is stopping)";
          continue;
        }
        if (options_.between_files) options_.between_files();
        if (options_.before_hash) options_.before_hash(to_hash[i]->open_path);
        HashOne(hasher, *to_hash[i]);
      }
    };
    std::vector<std::thread> workers;
    const unsigned n = std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(to_hash.size(), 1)));
    for (unsigned t = 0; t < n; ++t) workers.emplace_back(worker);
    for (auto& w : workers) w.join();
    report_.files_hashed = files_hashed_;
    report_.records_published = records_published_;
    report_.bytes_hashed = bytes_hashed_;
  }

 private:
  void HashOne(FileHasher& hasher, FileJob& job) {
    for (int attempt = 1;; ++attempt) {
      struct stat seen {};
      seen.st_ino = 0;
      auto result = hasher.Hash(job.open_path, job.stamp, &seen);
      if (result.ok()) {
        job.hashes = std::move(*result);
        ++files_hashed_;
        bytes_hashed_ += job.stamp.size;
        Record(job);
        return;
      }
      if (!result.status().is_changed()) {
        job.error = result.status().message();
        return;
      }
      // Changed under us. Try again only if the path still leads to the
      // same file, as it was listed (owner and mode included): anything
      // else (a link or another file swapped in, a chmod) sends the whole
      // checkpoint back to the catalog, whose walk alone decides what a
      // path is and who may read it.
      const FileStamp now = FileStamp::FromStat(seen);
      if (seen.st_ino == 0 || now.dev != job.stamp.dev || now.ino != job.stamp.ino ||
          !Ownership::FromStat(seen).SameModeAs(job.owner)) {
        job.error = result.status().message() + "; will be walked again";
        job.unsettled = true;
        return;
      }
      job.stamp = now;
      if (attempt >= options_.attempts) {
        job.error = result.status().message() + " (gave up after " + std::to_string(attempt) + " attempts)";
        job.unsettled = true;
        return;
      }
    }
  }

  // In the index, and shared with other nodes when this one can sign
  // (ignore_index: verify and the like record nothing).
  void Record(const FileJob& job) {
    if (options_.ignore_index) return;
    if (index_ != nullptr) {
      if (Status s = index_->PutFile(job.stamp, job.open_path, *job.hashes); !s.ok()) Warn(s.message());
    }
    if (options_.manifests == nullptr || !options_.manifests->can_sign()) return;
    auto rel = PathBelow(real_root_, job.open_path);
    if (!rel) return;
    Status s = options_.manifests->Publish(*rel, job.stamp, *job.hashes);
    if (s.ok()) ++records_published_;
    else Warn(s.message());
  }

  void Warn(const std::string& warning) {
    std::lock_guard lock(warn_mu_);
    report_.warnings.push_back(warning);
  }

  Index* index_;
  const IndexerOptions& options_;
  const std::string& real_root_;
  IndexReport& report_;
  std::mutex warn_mu_;
  std::atomic<uint64_t> files_hashed_{0}, bytes_hashed_{0}, records_published_{0};
};

// A checkpoint's digest from its members' hashes (recorded in the index), or
// the errors of the members that have none.
IndexedCheckpoint Assemble(Index* index, const IndexerOptions& options, const std::string& real_root,
                           const CheckpointSource& cp, const std::map<InodeKey, FileJob>& jobs, IndexReport& report) {
  IndexedCheckpoint out;
  out.rel_path = cp.rel_path;
  out.abs_path = cp.abs_path;
  if (!cp.valid()) {
    out.error = *cp.invalid_reason;
    return out;
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
    out.files.push_back({std::move(hashed), *job.hashes, job.from_index, job.from_manifest, job.stamped_size});
    out.total_size += job.stamp.size;
  }
  if (out.error) {
    out.files.clear();
    out.total_size = 0;
    return out;
  }
  out.manifest = CanonicalManifest(entries);
  out.name = CheckpointName(out.manifest);
  if (!options.ignore_index && index != nullptr) {
    Status s = index->PutCheckpoint(out.name, out.manifest, out.total_size, out.files.size());
    if (s.ok()) s = index->PutSource(real_root, cp.rel_path, out.name);
    if (!s.ok()) report.warnings.push_back(s.message());
  }
  return out;
}

}  // namespace

IndexReport Indexer::Run(const CatalogScan& scan) {
  IndexReport report;
  std::map<InodeKey, FileJob> jobs = DistinctFiles(scan);
  const unsigned threads = EffectiveThreads(options_.threads);
  std::vector<FileJob*> to_hash;
  uint64_t bytes_to_hash = 0;
  for (FileJob* miss : LookUpKnown(index_, options_, scan.real_root, threads, jobs, report)) {
    if (options_.lookup_only) {
      miss->error = miss->open_path + ": not in the index yet";
      miss->unindexed = true;
      continue;
    }
    to_hash.push_back(miss);
    bytes_to_hash += miss->stamp.size;
  }
  if (options_.on_plan) options_.on_plan(bytes_to_hash);
  HashingRun(index_, options_, scan.real_root, report).Run(std::move(to_hash), threads);
  FindStampedSizes(index_, options_, scan.real_root, jobs, report);
  for (const auto& cp : scan.checkpoints) {
    report.checkpoints.push_back(Assemble(index_, options_, scan.real_root, cp, jobs, report));
  }
  return report;
}

}  // namespace ckptfs
