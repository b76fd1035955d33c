// IndexScheduler: indexes many scans at once on one set of workers (the
// daemon submits one checkpoint a job), so that no checkpoint, however large
// or slow, holds back the others.
//
// Fair share: workers take turns round-robin across the jobs that have work.
// A turn is a job's first step (its index lookups), one file to hash (or a
// handful of small ones), or its last step (the digests, recorded). A large
// file keeps its worker only while no other job waits for one: then, between
// two chunks, it yields (letting go of its descriptor and buffers) and
// resumes on its job's next turn. So a 15 TB sparse file, hours of SHA-256,
// costs everybody else one worker's share at most, and it moves on meanwhile;
// status shows how far (ProgressOf).
//
// Files begun: a large file begun and not done holds its SHA-256 state and
// its tables so far (16 + 32 bytes a 4 MiB chunk: 48 MiB for a sparse 4 TiB
// file, which costs nothing to make). So that a writer of one directory
// cannot make the daemon hold that for thousands of files at once, by
// dropping thousands of checkpoints, each owner (the files' uid) has at
// most twice the workers' number of large files begun; its others wait
// until one of them is done, and every other owner's files go on.
//
// Jobs share files: a file (device, inode, stamp) that two jobs need is
// hashed once, for both. A cancelled job stops waiting; a file's hashing
// stops at its next chunk once no job waits for it.
//
// Index rows are written in batches (one transaction for many files), before
// any job looks them up and together with the checkpoints that name them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/index.h"
#include "ckptfs/indexer.h"
#include "ckptfs/mutex.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

namespace indexing {
class RowBatch;
struct FileJob;
struct SharedFile;
}  // namespace indexing

class IndexScheduler {
 public:
  using JobId = uint64_t;
  using Done = std::function<void(IndexReport)>;

  // `index` may be null only for jobs with ignore_index.
  IndexScheduler(Index* index, unsigned threads);
  ~IndexScheduler();  // Stop()
  IndexScheduler(const IndexScheduler&) = delete;
  IndexScheduler& operator=(const IndexScheduler&) = delete;

  // Queues `scan` to be indexed with `options` (whose callbacks then run on
  // the workers). `done` runs on a worker once it is indexed, unless the job
  // was cancelled first.
  JobId Submit(std::shared_ptr<const CatalogScan> scan, IndexerOptions options, Done done);
  // Stops waiting for job `id`; its `done` is not called unless it already
  // runs.
  void Cancel(JobId id);
  // Drops what was hashed lately of file (dev, ino): the index forgot it
  // (its bytes failed a check behind an intact stamp), and the rescan that
  // follows must read it again, not take the hashes it no longer holds.
  void ForgetRecent(uint64_t dev, uint64_t ino);

  struct FileProgress {
    std::string path;  // relative to its checkpoint
    uint64_t done = 0, size = 0;
  };
  struct Progress {
    bool started = false;  // its lookups have begun
    uint64_t bytes_done = 0, bytes_total = 0;  // of the files it waits for
    std::vector<FileProgress> hashing;  // files begun and not done, largest first
  };
  // Nothing once the job is done or cancelled.
  std::optional<Progress> ProgressOf(JobId id) const;

  // Cancels every job and joins the workers.
  void Stop();

 private:
  struct Job;
  struct Shared;
  struct Turn;
  struct Key {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
    bool verify;  // ignore_index: hashed apart from the files recorded
    auto operator<=>(const Key&) const = default;
  };

  void Work();
  Turn NextTurn() REQUIRES(mu_);
  bool HasWork(const Job& job) const REQUIRES(mu_);
  // Large files begun and not done, per owner (see "Files begun").
  bool MayBegin(const Shared& s) const REQUIRES(mu_);
  void Begin(Shared& s) REQUIRES(mu_);
  void End(Shared& s) REQUIRES(mu_);
  void Attach(Job& job, const std::vector<indexing::FileJob*>& misses) REQUIRES(mu_);
  // Hashes `files` for `job`, letting go of mu_ while each one is hashed.
  void RunFiles(Job& job, std::vector<std::shared_ptr<Shared>> files) REQUIRES(mu_);
  void Complete(const std::shared_ptr<Shared>& s) REQUIRES(mu_);
  void CancelLocked(Job& job) REQUIRES(mu_);
  void Remove(const Job& job) REQUIRES(mu_);
  void MoveToBack(const Job& job) REQUIRES(mu_);
  void Remember(const Key& key, std::shared_ptr<indexing::SharedFile> file) REQUIRES(mu_);
  bool ShouldYield(const Job& job, std::chrono::steady_clock::time_point& since) const;
  // The O_PATH descriptor of source root `root` that every job of it holds.
  std::shared_ptr<UniqueFd> RootFd(const std::string& root) EXCLUDES(mu_);

  Index* const index_;
  const unsigned threads_;
  ThreadPool io_;  // reads ahead of SHA-256, and runs the chunk hashes
  std::unique_ptr<indexing::RowBatch> rows_;
  mutable Mutex mu_;
  CondVar wake_;
  std::list<std::shared_ptr<Job>> jobs_ GUARDED_BY(mu_);  // the front is next in turn
  std::map<Key, std::shared_ptr<Shared>> shared_ GUARDED_BY(mu_);  // files being hashed
  // Files hashed lately, for a job whose lookups raced their completion.
  std::map<Key, std::shared_ptr<indexing::SharedFile>> recent_ GUARDED_BY(mu_);
  std::list<Key> recent_order_ GUARDED_BY(mu_);
  uint64_t recent_bytes_ GUARDED_BY(mu_) = 0;
  std::map<uid_t, unsigned> begun_ GUARDED_BY(mu_);
  std::map<std::string, std::weak_ptr<UniqueFd>> root_fds_ GUARDED_BY(mu_);
  unsigned idle_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  JobId next_id_ GUARDED_BY(mu_) = 1;
  std::vector<std::thread> workers_;
};

}  // namespace ckptfs
