// The pieces an indexing run is made of, for the Indexer and the
// IndexScheduler (private to src/index):
//
//   IndexingJob   one scan's checkpoints: finds their distinct files, looks
//                 them up in the index and the manifest store (Prepare), and
//                 assembles the digests once every miss is hashed (Finish);
//   SharedFile    one distinct file (device, inode and stamp) to hash, shared
//                 by every job that needs it, so that two checkpoints indexed
//                 at once never hash the same file twice;
//   FileWork      the hashing of one SharedFile with its retries, resumable
//                 between chunks;
//   RowBatch      the index rows of hashed files, written many to one
//                 transaction.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/file_hasher.h"
#include "ckptfs/index.h"
#include "ckptfs/indexer.h"
#include "ckptfs/mutex.h"

namespace ckptfs::indexing {

using InodeKey = std::pair<uint64_t, uint64_t>;

// Rows waiting for their transaction. Flushed when enough have gathered, and
// before anything reads the index for them (a job's lookups) or names them
// (a checkpoint's row), so a row is never missed, only written late; a crash
// loses the rows not yet flushed, and their files are hashed again.
class RowBatch {
 public:
  explicit RowBatch(Index* index) : index_(index) {}
  void Add(Index::FileRow row);
  // Writes what is waiting, with `checkpoints` in the same transaction.
  Status Flush(const std::vector<Index::CheckpointRow>& checkpoints = {});

 private:
  static constexpr size_t kRows = 512;
  static constexpr auto kAge = std::chrono::seconds(1);
  Index* index_;
  Mutex mu_;
  std::vector<Index::FileRow> rows_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point oldest_ GUARDED_BY(mu_);
};

// What the files of one job are hashed with: its options, a hasher with its
// hooks, and where results are recorded. Shared by the job and the files it
// started, which may outlive it (another job still waits for them).
struct JobContext {
  // `root_fd`: real_root opened (FileHasher::OpenSourceRoot), shared with
  // other jobs of the same root.
  JobContext(Index* index, IndexerOptions options, const std::string& real_root, std::shared_ptr<UniqueFd> root_fd,
             ThreadPool* io, RowBatch* rows);
  Index* index;
  IndexerOptions options;
  std::string real_root;
  FileHasher hasher;
  RowBatch* rows;
  bool Stopping() const { return options.cancel != nullptr && options.cancel->load(); }
};

struct SharedFile {
  // As the walk listed it (stamp: as last hashed, after a retry).
  std::string open_path, rel_path;
  FileStamp stamp;
  Ownership owner;
  bool safetensors = false;
  // Some job's copy of it every user may read, at a path every user may
  // learn: only then is its record (which names the path) shared through
  // the manifest store (FileWork::Record). Set by the
  // scheduler as jobs come, read by the worker that records it.
  std::atomic<bool> open_to_everyone{false};
  enum class State { kQueued, kRunning, kPaused, kDone } state = State::kQueued;
  std::atomic<uint64_t> hashed{0};  // bytes of the attempt under way
  // Jobs still waiting for it; hashing gives up when none is left.
  std::atomic<int> live_waiters{0};
  // The result, once kDone.
  std::optional<FileHashes> hashes;
  std::optional<std::string> error;
  bool unsettled = false;
  bool abandoned = false;  // given up because nobody waited for it any more
  bool published = false;  // to the manifest store
  std::vector<std::string> warnings;
  std::unique_ptr<class FileWork> work;  // while being hashed
};

class FileWork {
 public:
  FileWork(SharedFile& file, std::shared_ptr<JobContext> ctx) : file_(file), ctx_(std::move(ctx)) {}
  // Hashes on (retrying a file that changed while read, as it was listed),
  // until the file is done (true) or `yield` says to let another have the
  // thread (false).
  bool Advance(const std::function<bool()>& yield);

 private:
  bool Finished(Result<FileHashes> result, const struct stat& seen);
  void Record();

  SharedFile& file_;
  std::shared_ptr<JobContext> ctx_;
  std::unique_ptr<FileHashTask> task_;
  int attempt_ = 1;
};

// One distinct file of a job: from the index or the store, or a SharedFile.
struct FileJob {
  std::string open_path, rel_path;
  FileStamp stamp;
  Ownership owner;  // as the walk saw it
  std::optional<FileHashes> hashes;
  bool from_index = false;
  bool from_manifest = false;
  std::optional<std::string> error;
  bool unsettled = false;
  bool unindexed = false;
  bool safetensors = false;  // some member names it *.safetensors
  bool open_to_everyone = false;  // some member every user may read and find (see SharedFile)
  std::optional<uint64_t> stamped_size;
  std::shared_ptr<SharedFile> shared;  // a miss, hashed by whoever runs it
};

class IndexingJob {
 public:
  IndexingJob(std::shared_ptr<const CatalogScan> scan, std::shared_ptr<JobContext> ctx);
  // Distinct files and what the index and the store know of them; returns
  // the misses, largest first (long files start early, small ones fill in).
  std::vector<FileJob*> Prepare(unsigned threads);
  // Every miss resolved: the digests, recorded (one transaction).
  IndexReport Finish();
  const std::shared_ptr<JobContext>& context() const { return ctx_; }

 private:
  IndexedCheckpoint Assemble(const CheckpointSource& cp, std::vector<Index::CheckpointRow>& rows);
  void TakeSharedResults();
  void FindStampedSizes();

  std::shared_ptr<const CatalogScan> scan_;
  std::shared_ptr<JobContext> ctx_;
  std::map<InodeKey, FileJob> files_;
  IndexReport report_;
};

}  // namespace ckptfs::indexing
