#include "ckptfs/index_scheduler.h"

#include <sys/stat.h>
#include "ckptfs/mutex.h"

#include <algorithm>
#include <deque>

#include "indexing_job.h"

namespace ckptfs {

using indexing::FileJob;
using indexing::FileWork;
using indexing::SharedFile;

namespace {

// A large file keeps its worker at least this long before it yields.
constexpr auto kMinSlice = std::chrono::milliseconds(50);
// Small files taken in one turn (they cost less than the turn itself).
constexpr size_t kSmallFilesPerTurn = 32;
// Files hashed lately kept for jobs whose lookups raced them.
constexpr size_t kRecentFiles = 1024;
constexpr uint64_t kRecentChunkBytes = 16ull << 20;

}  // namespace

// One file being hashed and the jobs that wait for it.
struct IndexScheduler::Shared {
  Key key;
  bool begun = false;  // counted in begun_
  std::shared_ptr<SharedFile> file;
  std::vector<Job*> waiters;
};

struct IndexScheduler::Job {
  JobId id = 0;
  std::unique_ptr<indexing::IndexingJob> job;
  Done done;
  bool cancelled = false;
  enum class Phase { kNew, kPreparing, kHashing, kFinishing } phase = Phase::kNew;
  int busy = 0;  // turns running
  std::deque<std::shared_ptr<Shared>> runnable;  // its turns take from the front
  std::vector<std::shared_ptr<Shared>> needs;    // every file it waits for
  size_t outstanding = 0;                         // of those, not done
};

struct IndexScheduler::Turn {
  enum class Kind { kNone, kPrepare, kHash, kFinish } kind = Kind::kNone;
  std::shared_ptr<Job> job;
  std::vector<std::shared_ptr<Shared>> files;
};

IndexScheduler::IndexScheduler(Index* index, unsigned threads)
    : index_(index),
      threads_(EffectiveThreads(threads)),
      io_(std::max(4u, 2 * threads_)),
      rows_(std::make_unique<indexing::RowBatch>(index)) {
  for (unsigned i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
}

IndexScheduler::~IndexScheduler() { Stop(); }

void IndexScheduler::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    for (auto& job : std::list<std::shared_ptr<Job>>(jobs_)) CancelLocked(*job);
  }
  wake_.NotifyAll();
  for (auto& w : workers_) w.join();
  workers_.clear();
  MutexLock lock(mu_);
  shared_.clear();  // paused tasks let go of their copies here
  if (Status s = rows_->Flush(); !s.ok()) {
    // Rows not written are files hashed again next time; nothing to tell.
  }
}

std::shared_ptr<UniqueFd> IndexScheduler::RootFd(const std::string& root) {
  std::shared_ptr<UniqueFd> fd;
  {
    MutexLock lock(mu_);
    fd = root_fds_[root].lock();
  }
  // Outside the lock: a root on a hung server must not stop the workers.
  // Kept while the path still names the directory it was opened on; a root
  // replaced since is opened anew.
  struct stat held, now;
  if (fd && ::fstat(fd->get(), &held) == 0 && ::stat(root.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
      held.st_ino == now.st_ino) {
    return fd;
  }
  fd = FileHasher::OpenSourceRoot(root);
  MutexLock lock(mu_);
  root_fds_[root] = fd;
  return fd;
}

IndexScheduler::JobId IndexScheduler::Submit(std::shared_ptr<const CatalogScan> scan, IndexerOptions options,
                                             Done done) {
  auto job = std::make_shared<Job>();
  const std::string root = scan->real_root;
  auto ctx = std::make_shared<indexing::JobContext>(index_, std::move(options), root, RootFd(root), &io_, rows_.get());
  job->job = std::make_unique<indexing::IndexingJob>(std::move(scan), std::move(ctx));
  job->done = std::move(done);
  {
    MutexLock lock(mu_);
    job->id = next_id_++;
    if (stopping_) return job->id;  // never runs
    jobs_.push_back(job);
  }
  wake_.NotifyOne();
  return job->id;
}

void IndexScheduler::Cancel(JobId id) {
  {
    MutexLock lock(mu_);
    for (auto& job : jobs_) {
      if (job->id == id) {
        CancelLocked(*job);
        break;
      }
    }
  }
  wake_.NotifyAll();
}

void IndexScheduler::CancelLocked(Job& job) {
  if (job.cancelled) return;
  job.cancelled = true;
  for (auto& s : job.needs) {
    std::erase(s->waiters, &job);
    if (s->file->state == SharedFile::State::kDone) continue;
    s->file->live_waiters--;
    // Nobody else waits: a file not running now is dropped (one running
    // gives up at its next chunk, and is dropped when it returns).
    if (s->waiters.empty() && s->file->state != SharedFile::State::kRunning) {
      End(*s);
      shared_.erase(s->key);
    }
  }
  // A file still to run that another job waits for goes on to that job's
  // turns: this job's list may have been the only one holding it (another
  // waiter's turn found it running, or it was paused back onto this one).
  for (auto& s : job.runnable) {
    if (s->waiters.empty() || s->file->state == SharedFile::State::kDone) continue;
    auto& next = s->waiters.front()->runnable;
    if (std::find(next.begin(), next.end(), s) == next.end()) next.push_front(s);
  }
  job.needs.clear();
  job.runnable.clear();
  if (job.busy == 0) Remove(job);
}

void IndexScheduler::Remove(const Job& job) {
  std::erase_if(jobs_, [&](const std::shared_ptr<Job>& j) { return j.get() == &job; });
}

bool IndexScheduler::HasWork(const Job& job) const {
  if (job.cancelled) return false;
  if (job.phase == Job::Phase::kNew) return true;
  if (job.phase != Job::Phase::kHashing) return false;
  if (job.runnable.empty()) return job.outstanding == 0 && job.busy == 0;
  // A loop, not a lambda: the analysis sees mu_ held here, not in a lambda.
  for (const auto& s : job.runnable) {
    if (MayBegin(*s)) return true;
  }
  return false;
}

namespace {

// A file hashed in one turn, never paused: it holds nothing between turns.
bool Large(uint64_t size) { return size > kChunkSize; }

}  // namespace

bool IndexScheduler::MayBegin(const Shared& s) const {
  if (s.begun || s.file->state != SharedFile::State::kQueued || !Large(s.key.size)) return true;
  const auto it = begun_.find(s.file->owner.uid);
  return it == begun_.end() || it->second < 2 * threads_;
}

void IndexScheduler::Begin(Shared& s) {
  if (s.begun || !Large(s.key.size)) return;
  s.begun = true;
  ++begun_[s.file->owner.uid];
}

void IndexScheduler::End(Shared& s) {
  if (!s.begun) return;
  s.begun = false;
  auto it = begun_.find(s.file->owner.uid);
  if (it != begun_.end() && --it->second == 0) begun_.erase(it);
}

// The first job in turn with something to do, moved to the back of the line.
IndexScheduler::Turn IndexScheduler::NextTurn() {
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    Job& job = **it;
    if (job.cancelled) continue;
    Turn turn;
    if (job.phase == Job::Phase::kNew) {
      job.phase = Job::Phase::kPreparing;
      turn.kind = Turn::Kind::kPrepare;
    } else if (job.phase == Job::Phase::kHashing) {
      while (!job.runnable.empty()) {
        // A file its owner may not begin yet waits in place; what may run
        // behind it (a file begun already, whose turn frees the owner's
        // place; a small one; another owner's) comes first.
        auto first = job.runnable.begin();
        while (first != job.runnable.end() && !MayBegin(**first)) ++first;
        if (first == job.runnable.end()) break;
        if (first != job.runnable.begin()) {
          auto moved = std::move(*first);
          job.runnable.erase(first);
          job.runnable.push_front(std::move(moved));
        }
        auto s = job.runnable.front();
        const auto state = s->file->state;
        const bool small = state == SharedFile::State::kQueued && !Large(s->key.size);
        // Running elsewhere or done: not this turn's. One large or paused
        // file is a turn; small ones go several to a turn.
        if (state == SharedFile::State::kRunning || state == SharedFile::State::kDone) {
          job.runnable.pop_front();
          continue;
        }
        if (!turn.files.empty() && (!small || turn.files.size() >= kSmallFilesPerTurn)) break;
        job.runnable.pop_front();
        Begin(*s);
        s->file->state = SharedFile::State::kRunning;
        turn.files.push_back(std::move(s));
        if (!small) break;
      }
      if (!turn.files.empty()) {
        turn.kind = Turn::Kind::kHash;
      } else if (job.outstanding == 0 && job.busy == 0) {
        job.phase = Job::Phase::kFinishing;
        turn.kind = Turn::Kind::kFinish;
      }
    }
    if (turn.kind == Turn::Kind::kNone) continue;
    ++job.busy;
    turn.job = *it;
    jobs_.splice(jobs_.end(), jobs_, it);
    return turn;
  }
  return {};
}

void IndexScheduler::Work() {
  MutexLock lock(mu_);
  for (;;) {
    Turn turn = NextTurn();
    if (turn.kind == Turn::Kind::kNone) {
      if (stopping_) return;
      ++idle_;
      wake_.Wait(mu_);
      --idle_;
      continue;
    }
    Job& job = *turn.job;
    switch (turn.kind) {
      case Turn::Kind::kPrepare: {
        lock.Unlock();
        const std::vector<FileJob*> misses = job.job->Prepare(threads_);
        lock.Lock();
        job.phase = Job::Phase::kHashing;
        if (!job.cancelled) Attach(job, misses);
        break;
      }
      case Turn::Kind::kHash:
        RunFiles(job, std::move(turn.files));
        break;
      case Turn::Kind::kFinish: {
        lock.Unlock();
        IndexReport report = job.job->Finish();
        lock.Lock();
        if (!job.cancelled) {
          Remove(job);
          --job.busy;
          lock.Unlock();
          wake_.NotifyAll();
          job.done(std::move(report));
          lock.Lock();
          continue;
        }
        break;
      }
      case Turn::Kind::kNone:
        break;
    }
    --job.busy;
    if (job.cancelled && job.busy == 0) Remove(job);
    else MoveToBack(job);  // its turn is over: every other job's comes first
    wake_.NotifyAll();
  }
}

void IndexScheduler::MoveToBack(const Job& job) {
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if (it->get() == &job) {
      jobs_.splice(jobs_.end(), jobs_, it);
      return;
    }
  }
}

void IndexScheduler::Attach(Job& job, const std::vector<FileJob*>& misses) {
  const bool verify = job.job->context()->options.ignore_index;
  for (FileJob* miss : misses) {
    const FileStamp& st = miss->stamp;
    const Key key{st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns, verify};
    if (auto r = recent_.find(key); r != recent_.end()) {
      miss->shared = r->second;  // done: read at Finish
      continue;
    }
    auto& s = shared_[key];
    if (!s) {
      s = std::make_shared<Shared>();
      s->key = key;
      s->file = std::make_shared<SharedFile>();
      SharedFile& f = *s->file;
      f.open_path = miss->open_path;
      f.rel_path = miss->rel_path;
      f.stamp = miss->stamp;
      f.owner = miss->owner;
    }
    if (miss->open_to_everyone) s->file->open_to_everyone = true;
    s->waiters.push_back(&job);
    s->file->live_waiters++;
    miss->shared = s->file;
    job.needs.push_back(s);
    job.runnable.push_back(s);  // whoever's turn comes first runs it
    ++job.outstanding;
  }
}

void IndexScheduler::RunFiles(Job& job, std::vector<std::shared_ptr<Shared>> files) {
  for (auto& s : files) {
    SharedFile& f = *s->file;
    if (!f.work) f.work = std::make_unique<FileWork>(f, job.job->context());
    mu_.Unlock();
    auto since = std::chrono::steady_clock::now();
    const bool finished = f.work->Advance([&] { return ShouldYield(job, since); });
    mu_.Lock();
    if (finished) {
      Complete(s);
    } else if (!s->waiters.empty()) {
      f.state = SharedFile::State::kPaused;
      // Resumed first on the next turn of a job that waits for it.
      Job* next = job.cancelled ? s->waiters.front() : &job;
      next->runnable.push_front(s);
    } else {
      End(*s);
      shared_.erase(s->key);  // paused for nobody
    }
  }
}

void IndexScheduler::Complete(const std::shared_ptr<Shared>& s) {
  SharedFile& f = *s->file;
  f.work.reset();
  End(*s);
  if (f.abandoned && !s->waiters.empty()) {
    // It gave up for want of waiters just as a job came to wait for it:
    // begin again for that job.
    f.abandoned = false;
    f.error.reset();
    f.warnings.clear();
    f.state = SharedFile::State::kQueued;
    s->waiters.front()->runnable.push_front(s);
    return;
  }
  f.state = SharedFile::State::kDone;
  shared_.erase(s->key);
  if (f.hashes) Remember(s->key, s->file);
  for (Job* w : s->waiters) --w->outstanding;
}

namespace {

// What a remembered file's hashes hold per chunk: its XXH3 table and chain.
uint64_t TableBytes(const FileHashes& h) {
  return h.chunks.size() * sizeof(ChunkHash) + (h.chain ? h.chain->size() * sizeof(Sha256State) : 0);
}

}  // namespace

void IndexScheduler::ForgetRecent(uint64_t dev, uint64_t ino) {
  MutexLock lock(mu_);
  for (auto it = recent_.begin(); it != recent_.end();) {
    if (it->first.dev == dev && it->first.ino == ino) {
      recent_bytes_ -= TableBytes(*it->second->hashes);
      it = recent_.erase(it);  // its key left in recent_order_ is passed over there
    } else {
      ++it;
    }
  }
}

void IndexScheduler::Remember(const Key& key, std::shared_ptr<SharedFile> file) {
  const uint64_t bytes = TableBytes(*file->hashes);
  if (bytes > kRecentChunkBytes / 4) return;
  // The key again (hashed again since): its old entry's bytes go first. Its
  // older place in recent_order_ stays, and lets it go early, as a cache may.
  if (auto it = recent_.find(key); it != recent_.end()) recent_bytes_ -= TableBytes(*it->second->hashes);
  recent_[key] = std::move(file);
  recent_order_.push_back(key);
  recent_bytes_ += bytes;
  while (recent_order_.size() > kRecentFiles || recent_bytes_ > kRecentChunkBytes) {
    auto it = recent_.find(recent_order_.front());
    if (it != recent_.end()) {
      recent_bytes_ -= TableBytes(*it->second->hashes);
      recent_.erase(it);
    }
    recent_order_.pop_front();
  }
}

bool IndexScheduler::ShouldYield(const Job& job, std::chrono::steady_clock::time_point& since) const {
  const auto now = std::chrono::steady_clock::now();
  if (now - since < kMinSlice) return false;
  // Asked again a slice from now, not at every chunk: a file hashed alone
  // for hours takes the scheduler's lock once a slice.
  since = now;
  MutexLock lock(mu_);
  if (idle_ > 0 || stopping_) return false;
  for (const auto& other : jobs_) {
    if (other.get() != &job && HasWork(*other)) return true;
  }
  return false;
}

std::optional<IndexScheduler::Progress> IndexScheduler::ProgressOf(JobId id) const {
  MutexLock lock(mu_);
  for (const auto& job : jobs_) {
    if (job->id != id || job->cancelled) continue;
    Progress p;
    p.started = job->phase != Job::Phase::kNew;
    for (const auto& s : job->needs) {
      const SharedFile& f = *s->file;
      p.bytes_total += s->key.size;
      const uint64_t done = f.state == SharedFile::State::kDone ? s->key.size : std::min(f.hashed.load(), s->key.size);
      p.bytes_done += done;
      const bool begun = f.state == SharedFile::State::kRunning || f.state == SharedFile::State::kPaused;
      if (begun && f.work) p.hashing.push_back({f.rel_path, done, s->key.size});
    }
    std::sort(p.hashing.begin(), p.hashing.end(), [](const auto& a, const auto& b) { return a.size > b.size; });
    return p;
  }
  return std::nullopt;
}

}  // namespace ckptfs
