#include "indexing_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <thread>

#include "ckptfs/checkpoint_digest.h"
#include "ckptfs/mutex.h"
#include "ckptfs/safetensors_name.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/stamped_size.h"

namespace ckptfs::indexing {

namespace {

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
void TakeFromManifests(JobContext& ctx, unsigned threads, std::vector<FileJob*>& misses, IndexReport& report) {
  Mutex mu;
  ParallelFor(misses.size(), threads, [&](size_t i) {
    FileJob& job = *misses[i];
    auto rel = PathBelow(ctx.real_root, job.open_path);
    if (!rel) return;
    auto found = ctx.options.manifests->Lookup(*rel, job.stamp);
    MutexLock lock(mu);
    if (!found.ok()) {
      if (found.status().code() != Status::Code::kNotFound) report.warnings.push_back(found.status().message());
      return;
    }
    job.hashes = std::move(*found);
    job.from_manifest = true;
    ++report.files_from_manifests;
    if (ctx.index != nullptr) ctx.rows->Add({job.stamp, job.open_path, *job.hashes});
  });
  std::erase_if(misses, [](const FileJob* job) { return job->from_manifest; });
}

}  // namespace

void RowBatch::Add(Index::FileRow row) {
  bool due = false;
  {
    MutexLock lock(mu_);
    if (rows_.empty()) oldest_ = std::chrono::steady_clock::now();
    rows_.push_back(std::move(row));
    due = rows_.size() >= kRows || std::chrono::steady_clock::now() - oldest_ >= kAge;
  }
  if (due) (void)Flush();  // a failure is reported by the next flush, which writes these again
}

Status RowBatch::Flush(const std::vector<Index::CheckpointRow>& checkpoints) {
  if (index_ == nullptr) return Status::Ok();
  MutexLock lock(mu_);  // held while writing: rows are never written out of order with their checkpoints
  Status s = index_->PutBatch(rows_, checkpoints);
  if (s.ok()) rows_.clear();
  return s;
}

JobContext::JobContext(Index* index_, IndexerOptions options_, const std::string& real_root_,
                       std::shared_ptr<UniqueFd> root_fd, ThreadPool* io, RowBatch* rows_)
    : index(index_), options(std::move(options_)), real_root(real_root_), hasher(io), rows(rows_) {
  hasher.set_source_root(real_root, std::move(root_fd));
  hasher.set_cancel(options.cancel);
  if (options.on_bytes) hasher.set_progress(options.on_bytes);
  if (options.chunk_read_hook) hasher.set_chunk_read_hook(options.chunk_read_hook);
}

bool FileWork::Advance(const std::function<bool()>& yield) {
  for (;;) {
    if (!task_) {
      if (ctx_->Stopping()) {
        file_.error = file_.open_path + ": not hashed (the daemon is stopping)";
        return true;
      }
      if (ctx_->options.between_files) ctx_->options.between_files();
      if (ctx_->options.before_hash) ctx_->options.before_hash(file_.open_path);
      FileHasher::TaskOptions extra;
      if (ctx_->options.copies != nullptr) extra.copy = ctx_->options.copies->Begin(file_.rel_path, file_.stamp);
      extra.hashed = &file_.hashed;
      extra.cancelled = [f = &file_] { return f->live_waiters.load() <= 0; };
      file_.hashed = 0;
      task_ = ctx_->hasher.Start(file_.open_path, file_.stamp, std::move(extra));
    }
    if (!task_->Run(yield)) return false;
    const struct stat seen = task_->observed();
    Result<FileHashes> result = task_->TakeResult();
    task_.reset();
    if (Finished(std::move(result), seen)) return true;
  }
}

// True when the file is done with (hashed, or given up on); false to try again.
bool FileWork::Finished(Result<FileHashes> result, const struct stat& seen) {
  if (result.ok()) {
    file_.hashes = std::move(*result);
    Record();
    return true;
  }
  if (!result.status().is_changed()) {
    file_.error = result.status().message();
    file_.abandoned = !ctx_->Stopping() && file_.live_waiters.load() <= 0;
    return true;
  }
  // Changed under us. Try again only if the path still leads to the same
  // file, as it was listed (owner and mode included): anything else (a link
  // or another file swapped in, a chmod) sends the whole checkpoint back to
  // the catalog, whose walk alone decides what a path is and who may read it.
  const FileStamp now = FileStamp::FromStat(seen);
  if (seen.st_ino == 0 || now.dev != file_.stamp.dev || now.ino != file_.stamp.ino ||
      !Ownership::FromStat(seen).SameModeAs(file_.owner)) {
    file_.error = result.status().message() + "; will be walked again";
    file_.unsettled = true;
    return true;
  }
  file_.stamp = now;
  if (attempt_ >= ctx_->options.attempts) {
    file_.error = result.status().message() + " (gave up after " + std::to_string(attempt_) + " attempts)";
    file_.unsettled = true;
    return true;
  }
  ++attempt_;
  return false;
}

// In the index, and shared with other nodes when this one can sign
// (ignore_index: verify and the like record nothing).
void FileWork::Record() {
  const IndexerOptions& o = ctx_->options;
  if (o.ignore_index) return;
  if (ctx_->index != nullptr) ctx_->rows->Add({file_.stamp, file_.open_path, *file_.hashes});
  if (o.manifests == nullptr || !o.manifests->can_sign()) return;
  // A record names the file's path, size, times and hashes, and the store
  // is read by every user who can read it (records are 0644, so that every
  // node's daemon can, through NFS root squash too): a file that not every
  // user may read in SRC is hashed on each node instead.
  if (!file_.open_to_everyone.load()) {
    o.manifests->Withheld();
    return;
  }
  auto rel = PathBelow(ctx_->real_root, file_.open_path);
  if (!rel) return;
  Status s = o.manifests->Publish(*rel, file_.stamp, *file_.hashes);
  if (s.ok()) file_.published = true;
  else file_.warnings.push_back(s.message());
}

IndexingJob::IndexingJob(std::shared_ptr<const CatalogScan> scan, std::shared_ptr<JobContext> ctx)
    : scan_(std::move(scan)), ctx_(std::move(ctx)) {}

std::vector<FileJob*> IndexingJob::Prepare(unsigned threads) {
  // Distinct files across every valid checkpoint, by device and inode.
  for (const auto& cp : scan_->checkpoints) {
    if (!cp.valid()) continue;
    for (const auto& m : cp.members) {
      auto [it, added] = files_.try_emplace(InodeKey{m.stamp.dev, m.stamp.ino});
      if (added) {
        it->second.open_path = m.open_path;
        it->second.rel_path = m.rel_path;
        it->second.stamp = m.stamp;
        it->second.owner = m.owner;
      }
      if (IsSafetensorsName(m.rel_path)) it->second.safetensors = true;
      // A record names the file's path: written only where every user could
      // read the file and list every directory down to it.
      if (!it->second.open_to_everyone && OpenToEveryone({m.access}, kWantRead) && EveryoneMayLearnPath(m.access)) {
        it->second.open_to_everyone = true;
      }
    }
  }
  const IndexerOptions& o = ctx_->options;
  const bool use_index = !o.ignore_index && ctx_->index != nullptr;
  if (use_index) {
    // What other jobs hashed must be readable before it is looked for.
    if (Status s = ctx_->rows->Flush(); !s.ok()) report_.warnings.push_back(s.message());
  }
  std::vector<FileJob*> misses;
  if (use_index) {
    std::vector<FileStamp> stamps;
    stamps.reserve(files_.size());
    for (const auto& [key, job] : files_) stamps.push_back(job.stamp);
    auto found = ctx_->index->LookupFiles(stamps);
    size_t i = 0;
    for (auto& [key, job] : files_) {
      if (!found.ok()) {
        // An index that cannot be read is reported, not taken for empty:
        // hashing everything again in silence would hide it.
        job.error = job.open_path + ": " + found.status().message();
      } else if (auto& h = (*found)[i]) {
        job.hashes = std::move(*h);
        job.from_index = true;
        ++report_.files_from_index;
      } else {
        misses.push_back(&job);
      }
      ++i;
    }
  } else {
    for (auto& [key, job] : files_) misses.push_back(&job);
  }
  if (!o.ignore_index && o.manifests != nullptr) {
    // Lookups wait on the file server, not the CPU: more of them in flight.
    constexpr unsigned kLookupsInFlight = 16;
    TakeFromManifests(*ctx_, std::max(threads, kLookupsInFlight), misses, report_);
  }
  if (o.lookup_only) {
    for (FileJob* miss : misses) {
      miss->error = miss->open_path + ": not in the index yet";
      miss->unindexed = true;
    }
    misses.clear();
  }
  std::stable_sort(misses.begin(), misses.end(),
                   [](const FileJob* a, const FileJob* b) { return a->stamp.size > b->stamp.size; });
  uint64_t bytes = 0;
  for (const FileJob* miss : misses) bytes += miss->stamp.size;
  if (o.on_plan) o.on_plan(bytes);
  return misses;
}

void IndexingJob::TakeSharedResults() {
  for (auto& [key, job] : files_) {
    if (!job.shared) continue;
    const SharedFile& f = *job.shared;
    for (const auto& w : f.warnings) report_.warnings.push_back(w);
    if (f.published) ++report_.records_published;
    if (f.hashes) {
      job.hashes = f.hashes;
      job.stamp = f.stamp;
      ++report_.files_hashed;
      report_.bytes_hashed += f.stamp.size;
    } else {
      job.error = f.error.value_or(job.open_path + ": not hashed");
      job.unsettled = f.unsettled;
    }
    job.shared.reset();
  }
}

// The served size under stamp_headers of every *.safetensors file, from the
// index or, when it has none and reading is allowed, from the file's header
// chunks (verified against the hashes just computed, the SHA-256 chain
// included: a file without one, its hashes a manifest's, is left to stat),
// stored for next time. Done at indexing so that stat never reads a header.
void IndexingJob::FindStampedSizes() {
  Index* index = ctx_->index;
  const IndexerOptions& o = ctx_->options;
  if (index == nullptr || o.ignore_index) return;
  SourceReader reader(scan_->real_root);
  for (auto& [key, job] : files_) {
    if (!job.safetensors || !job.hashes) continue;
    auto stored = index->LookupStampedSize(job.hashes->sha256);
    if (!stored.ok()) {
      report_.warnings.push_back(job.open_path + ": " + stored.status().message());
      continue;  // stat reads the header itself, as without an index
    }
    if ((job.stamped_size = *stored)) continue;
    if (o.lookup_only || ctx_->Stopping() || !job.hashes->chain) continue;
    auto size = ServedStampedSize(reader, job.open_path, job.stamp, *job.hashes);
    if (!size.ok()) {
      // Not fatal: stat then reads the header itself, as the reads will.
      report_.warnings.push_back(job.open_path + ": cannot read its safetensors header: " + size.status().message());
      continue;
    }
    job.stamped_size = *size;
    if (Status s = index->PutStampedSize(job.hashes->sha256, *size); !s.ok()) report_.warnings.push_back(s.message());
  }
}

// A checkpoint's digest from its members' hashes, or the errors of the
// members that have none; its rows go to `rows`.
IndexedCheckpoint IndexingJob::Assemble(const CheckpointSource& cp, std::vector<Index::CheckpointRow>& rows) {
  IndexedCheckpoint out;
  out.rel_path = cp.rel_path;
  out.abs_path = cp.abs_path;
  if (!cp.valid()) {
    out.error = *cp.invalid_reason;
    return out;
  }
  std::vector<ManifestEntry> entries;
  // The first few files' errors, and how many more: a checkpoint of 50,000
  // files none of which is indexed yet made this string (joined a file at a
  // time) cost the scan minutes, while every other checkpoint waited.
  constexpr size_t kErrorsNamed = 8;
  size_t errors = 0;
  for (const auto& m : cp.members) {
    const FileJob& job = files_.at({m.stamp.dev, m.stamp.ino});
    if (job.error) {
      if (++errors <= kErrorsNamed) out.error = out.error ? *out.error + "; " + *job.error : *job.error;
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
    if (errors > kErrorsNamed) *out.error += "; and " + std::to_string(errors - kErrorsNamed) + " more files";
    out.files.clear();
    out.total_size = 0;
    return out;
  }
  out.manifest = CanonicalManifest(entries);
  out.name = CheckpointName(out.manifest);
  if (!ctx_->options.ignore_index && ctx_->index != nullptr) {
    rows.push_back({out.name, out.manifest, out.total_size, out.files.size(), scan_->real_root, cp.rel_path});
  }
  return out;
}

IndexReport IndexingJob::Finish() {
  TakeSharedResults();
  FindStampedSizes();
  std::vector<Index::CheckpointRow> rows;
  for (const auto& cp : scan_->checkpoints) report_.checkpoints.push_back(Assemble(cp, rows));
  // The files hashed, then the checkpoints that name them, in one transaction.
  if (ctx_->index != nullptr && !ctx_->options.ignore_index) {
    if (Status s = ctx_->rows->Flush(rows); !s.ok()) report_.warnings.push_back(s.message());
  }
  return std::move(report_);
}

}  // namespace ckptfs::indexing
