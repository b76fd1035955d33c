#include "file_filler.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "header_stamper.h"
#include "ckptfs/mutex.h"

namespace ckptfs {

namespace {

enum ChunkState : uint8_t { kPending, kTaken, kDone };

Status NotTheIndexedBytes(const View::Node& file) {
  return Status::Corrupt(file.source_path + ": every chunk passed its XXH3-128, but the file's SHA-256 is not "
                         "the index's: the source does not hold the indexed bytes");
}

using AlignedBuffer = std::unique_ptr<uint8_t, decltype(&std::free)>;
AlignedBuffer ChunkBuffer() {
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(SourceReader::kDirectAlignment, kChunkSize)),
                       &std::free);
}

}  // namespace

// One copy being filled. Its chunks' states, the reads wanted first, and
// how it ended are guarded by FileFiller::jobs_mu_ (`changed` is signalled
// under it); the bytes are written by the reader thread that took each
// chunk, and read (ReadableAt) only once their chunk is kDone.
class FillJob {
 public:
  // `proven` (FileServer::Proves): a chain to check each chunk against, or
  // null to check the whole copy's SHA-256 (`prove_whole`).
  FillJob(View::NodePtr f, ServedForm sf, std::shared_ptr<SealedCopy> c, std::unique_ptr<FileCache::Reservation> r,
          bool proven, std::shared_ptr<const ChunkChain> known_chain)
      : file(std::move(f)),
        form(std::move(sf)),
        reservation(std::move(r)),
        copy(std::move(c)),
        chunks(ChunkCount(file->size)),
        chain(proven ? std::move(known_chain) : nullptr),
        prove_whole(proven && !chain),
        state(chunks, kPending) {
    if (prove_whole) {
      taken_chain.resize(chunks > 0 ? chunks - 1 : 0);
      original_prefix.resize(static_cast<size_t>(std::min(form.source_prefix_len, file->size)));
    }
  }

  // Where source byte `offset` of the file lands in the copy.
  uint64_t CopyOffset(uint64_t offset) const {
    return offset - form.source_prefix_len + (form.prefix ? form.prefix->size() : 0);
  }
  uint64_t ChunkLen(uint64_t c) const { return std::min<uint64_t>(kChunkSize, file->size - c * kChunkSize); }

  const View::NodePtr file;
  const ServedForm form;
  // Declared before `copy` so that it is destroyed after it: the room of a
  // failed fill goes back only once its pages do, when the last reader
  // thread still copying a chunk into it (a read on a stalled source can
  // take long) lets go of the job.
  std::unique_ptr<FileCache::Reservation> reservation;  // given to Publish, or kept until the job goes
  const std::shared_ptr<SealedCopy> copy;
  const uint64_t chunks;
  // FileServer::Proves, the chain known: every chunk is checked against it.
  const std::shared_ptr<const ChunkChain> chain;
  // FileServer::Proves, no chain known: the whole copy's SHA-256 is checked
  // before it is sealed, and nothing of the copy is served before.
  const bool prove_whole;

  // Under jobs_mu_.
  CondVar changed;
  std::vector<uint8_t> state;
  uint64_t next = 0;            // the next chunk in order not yet taken (or past)
  std::deque<uint64_t> wanted;  // chunks a streaming reader waits for
  uint64_t done = 0;
  bool finishing = false;  // Finish ran or runs
  enum class End { kRunning, kPublished, kFailed } end = End::kRunning;
  Status error;
  FileCache::CopyPtr published;
  std::atomic<uint64_t> done_bytes{0};

  // When proving the whole: the source header a stamped copy does not hold
  // (written by the readers of the chunks it spans), and the whole file's
  // SHA-256 over the chunks done so far in order, with its chain, taken by
  // whoever holds hash_mu (see ChunkDone).
  ChunkChain taken_chain;
  std::string original_prefix;
  Mutex hash_mu;
  Sha256 whole;
  std::atomic<uint64_t> hashed{0};
  std::atomic<bool> hash_complete{false};
};

FileFiller::FileFiller(FileServer& server, unsigned depth, SourceReader::Io io) : server_(server), io_(io) {
  for (unsigned i = 0; i < std::max(1u, depth); ++i) readers_.emplace_back([this] { ReadChunks(); });
  worker_ = std::thread([this] { RunQueue(); });
}

FileFiller::~FileFiller() { Stop(); }

void FileFiller::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();
    queued_.clear();
    sibling_requests_.clear();
  }
  cancel_ = true;
  wake_.NotifyAll();
  std::vector<std::shared_ptr<FillJob>> running;
  {
    MutexLock lock(jobs_mu_);
    readers_stopping_ = true;
    for (const auto& [key, job] : jobs_) running.push_back(job);
  }
  work_.NotifyAll();
  for (const auto& job : running) {
    Finish(job, Status::Error(job->file->source_path + ": fill cancelled (stopping)"), /*cancelled=*/true);
  }
  for (auto& t : readers_) {
    if (t.joinable()) t.join();
  }
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<FillJob> FileFiller::InFlight(const FileKey& key) {
  MutexLock lock(jobs_mu_);
  auto it = jobs_.find(key);
  return it == jobs_.end() ? nullptr : it->second;
}

std::shared_ptr<FillJob> FileFiller::Begin(const View::NodePtr& file, const ServedForm& form, bool pin, bool wait,
                                           FileCache::CopyPtr* resident, Status* refused) {
  if (auto job = InFlight(form.key)) return job;
  // Never waiting here first: a fill of it may be ours, registered in a
  // moment; only one that is not ours (another party's claim) is waited for.
  // A copy written through a mapping of small pages can take the page reserve's.
  const bool take_reserve = SealedCopy::CanTakeReservePages(form.size);
  FileCache& files = *server_.parts().files;
  auto claim = files.Claim(form.key, form.size, pin, /*wait=*/false, FileCache::Room::kEvict, take_reserve);
  if (claim.ok() && !claim->resident && !claim->fill) {
    if (auto job = InFlight(form.key)) return job;
    if (!wait) {
      *refused = Status::Full(file->source_path + ": being copied by another fill");
      return nullptr;
    }
    claim = files.Claim(form.key, form.size, pin, /*wait=*/true, FileCache::Room::kEvict, take_reserve);
  }
  if (!claim.ok()) {
    *refused = claim.status();
    return nullptr;
  }
  if (claim->resident) {
    *resident = claim->resident;
    return nullptr;
  }
  auto made = SealedCopy::Create("ckptfs:" + ToHex(file->sha256).substr(0, 16) + ":" + file->digest.substr(7, 12),
                                 form.size);
  if (!made.ok()) {  // the reservation is given back
    *refused = made.status();
    return nullptr;
  }
  std::shared_ptr<SealedCopy> copy = std::move(*made);
  // The stamped header first: it is known, and a streaming reader of the
  // copy's first bytes finds it there.
  if (form.prefix) {
    if (Status s = copy->Write(0, reinterpret_cast<const uint8_t*>(form.prefix->data()), form.prefix->size());
        !s.ok()) {
      *refused = s;
      return nullptr;
    }
  }
  auto job = std::make_shared<FillJob>(file, form, std::move(copy), std::move(claim->fill), server_.Proves(*file),
                                       server_.ChainOf(*file));
  if (job->chunks == 0) {
    Finish(job, Status::Ok());
    return job;
  }
  {
    MutexLock lock(jobs_mu_);
    jobs_[form.key] = job;
    turns_.push_back(job);
  }
  work_.NotifyAll();
  return job;
}

Result<FileCache::CopyPtr> FileFiller::Fill(const View::NodePtr& file, bool pin,
                                            const std::function<bool(uint64_t)>& progress) {
  auto form = server_.FormOf(file);
  if (!form.ok()) return form.status();
  FileCache::CopyPtr resident;
  Status refused;
  auto job = Begin(file, *form, pin, /*wait=*/true, &resident, &refused);
  if (!job && !resident) return refused;
  if (job) {
    MutexLock lock(jobs_mu_);
    while (job->end == FillJob::End::kRunning) {
      job->changed.WaitFor(jobs_mu_, std::chrono::milliseconds(200));
      if (!progress || job->end != FillJob::End::kRunning) continue;
      lock.Unlock();
      const bool go_on = progress(job->done_bytes.load());
      if (!go_on) Finish(job, Status::Error(file->source_path + ": fill cancelled"), /*cancelled=*/true);
      lock.Lock();
    }
    if (job->end == FillJob::End::kFailed) return job->error;
    resident = job->published;
  }
  if (pin) {
    if (Status s = server_.parts().files->Pin(form->key); !s.ok()) return s;
  }
  return resident;
}

void FileFiller::Start(const View::NodePtr& file) {
  if (cancel_) return;
  auto form = server_.FormOf(file);
  if (!form.ok()) return;
  FileCache::CopyPtr resident;
  Status refused;
  if (!Begin(file, *form, /*pin=*/false, /*wait=*/false, &resident, &refused) && !resident) {
    ++skipped_;
    spdlog::debug("{}: not copied at open: {}", file->source_path, refused.message());
  }
}

// The next chunk to read: one a streaming reader waits for, from any fill,
// else the next in order of each fill in turn. Blocks until there is one;
// {null, 0} once stopping.
std::pair<std::shared_ptr<FillJob>, uint64_t> FileFiller::NextChunk() {
  MutexLock lock(jobs_mu_);
  for (;;) {
    if (readers_stopping_) return {nullptr, 0};
    for (const auto& [key, job] : jobs_) {
      while (!job->wanted.empty()) {
        const uint64_t c = job->wanted.front();
        job->wanted.pop_front();
        if (job->state[c] != kPending) continue;
        job->state[c] = kTaken;
        return {job, c};
      }
    }
    while (!turns_.empty()) {
      auto job = std::move(turns_.front());
      turns_.pop_front();
      while (job->next < job->chunks && job->state[job->next] != kPending) ++job->next;
      if (job->next >= job->chunks || job->end != FillJob::End::kRunning) continue;  // nothing left to take
      const uint64_t c = job->next++;
      job->state[c] = kTaken;
      turns_.push_back(job);
      return {job, c};
    }
    work_.Wait(jobs_mu_);
  }
}

void FileFiller::ReadChunks() {
  AlignedBuffer buf = ChunkBuffer();  // this thread's, for all its chunks: kept warm
  for (;;) {
    auto [job, chunk] = NextChunk();
    if (!job) return;
    Status s = buf ? CopyChunk(*job, chunk, buf.get()) : Status::FromErrno("no memory for a fill buffer", ENOMEM);
    ChunkDone(job, chunk, s);
  }
}

// Source chunk `chunk` of the job's file, verified, at its place in the
// copy: byte o of the source lands at CopyOffset(o); the bytes of a source
// header being replaced are not copied (only kept aside to be hashed, when
// the job proves the whole copy). Where the copy is written through a mapping, a chunk that
// lands in one piece is read straight into it; otherwise it goes through
// `buf` (kChunkSize bytes, aligned for O_DIRECT).
Status FileFiller::CopyChunk(FillJob& job, uint64_t chunk, uint8_t* buf) {
  const uint64_t begin = chunk * kChunkSize;
  const size_t len = static_cast<size_t>(job.ChunkLen(chunk));
  const uint64_t header = job.form.source_prefix_len;
  uint8_t* dst = buf;
  if (begin >= header) {
    const uint64_t at = job.CopyOffset(begin);
    const bool aligned_enough = io_ == SourceReader::Io::kBuffered || at % SourceReader::kDirectAlignment == 0;
    if (uint8_t* in_place = job.copy->WritableAt(at, len); in_place != nullptr && aligned_enough) dst = in_place;
  }
  // The memory the chunk is about to take comes from the page reserve,
  // in 2 MiB pages where the chunk is read straight into the copy.
  if (job.reservation) {
    server_.parts().files->PlaceReservePages(*job.reservation, *job.copy, job.CopyOffset(std::max(begin, header)), len,
                                             /*in_place=*/dst != buf);
  }
  if (Status s = server_.ReadSourceChunk(*job.file, chunk, dst, len, io_, job.chain.get(), job.prove_whole); !s.ok()) {
    return s;
  }
  if (dst != buf) return Status::Ok();
  const size_t skip = static_cast<size_t>(std::min<uint64_t>(len, header - std::min(begin, header)));
  if (job.prove_whole && skip > 0) std::memcpy(job.original_prefix.data() + begin, buf, skip);
  return job.copy->Write(job.CopyOffset(begin + skip), buf + skip, len - skip);
}

namespace {

// The file's source bytes of chunk `c` into the job's whole-file SHA-256
// (and its state after them into the chain taken): what the copy holds of
// them, and the original header it replaced.
void HashInOrder(FillJob& job, uint64_t c) {
  const uint64_t begin = c * kChunkSize, end = begin + job.ChunkLen(c);
  const uint64_t header = std::min(job.form.source_prefix_len, end);
  if (begin < header) job.whole.Update(job.original_prefix.data() + begin, static_cast<size_t>(header - begin));
  const uint64_t from = std::max(begin, header);
  if (from < end) job.whole.Update(job.copy->ReadableAt(job.CopyOffset(from), end - from), end - from);
  if (c + 1 < job.chunks) job.taken_chain[c] = job.whole.State();
}

}  // namespace

void FileFiller::ChunkDone(const std::shared_ptr<FillJob>& job, uint64_t chunk, const Status& s) {
  bool complete = false;
  {
    MutexLock lock(jobs_mu_);
    if (job->finishing) return;
    if (s.ok()) {
      job->state[chunk] = kDone;
      job->done_bytes += job->ChunkLen(chunk);
      complete = ++job->done == job->chunks;
    }
    job->changed.NotifyAll();
  }
  if (!s.ok()) {
    Finish(job, s);
    return;
  }
  if (!job->prove_whole) {
    if (complete) Finish(job, Status::Ok());
    return;
  }
  // Proving: hash the chunks done in order as far as they go. One
  // thread at a time; one that finds the lock taken leaves its chunk to the
  // holder, which looks again before it lets go.
  auto next_done = [&] {
    MutexLock lock(jobs_mu_);
    const uint64_t h = job->hashed.load();
    return h < job->chunks && job->state[h] == kDone;
  };
  while (next_done()) {
    if (!job->hash_mu.TryLock()) return;
    while (next_done()) {
      HashInOrder(*job, job->hashed.load());
      ++job->hashed;
    }
    const bool hashed_all = job->hashed.load() == job->chunks && !job->hash_complete.exchange(true);
    job->hash_mu.Unlock();
    if (hashed_all) {
      Finish(job, Status::Ok());
      return;
    }
  }
}

// Ends a fill once: a copy that passed is sealed and published (when the
// job proves the whole, only if its SHA-256 is the index's, and then its
// chain is kept for the chunk path); any other is dropped with its reservation.
void FileFiller::Finish(const std::shared_ptr<FillJob>& job, Status s, bool cancelled) {
  {
    MutexLock lock(jobs_mu_);
    if (job->finishing) return;
    job->finishing = true;
  }
  if (s.ok() && job->prove_whole) {
    if (job->whole.Finish() != job->file->sha256) {
      s = NotTheIndexedBytes(*job->file);
      if (const SourceCopy* c = server_.FirstUsableCopy(*job->file)) server_.ReportSourceFailure(*job->file, *c, s, false);
    } else {
      server_.KeepProvenChain(*job->file, std::make_shared<const ChunkChain>(std::move(job->taken_chain)));
    }
  }
  if (s.ok()) s = job->copy->Seal();
  FileCache::CopyPtr published;
  if (s.ok()) published = server_.parts().files->Publish(std::move(job->reservation), job->copy);
  if (s.ok() && (job->prove_whole || job->chain)) ++proven_;
  {
    MutexLock lock(jobs_mu_);
    job->end = s.ok() ? FillJob::End::kPublished : FillJob::End::kFailed;
    job->error = s;
    job->published = published;
    if (auto it = jobs_.find(job->form.key); it != jobs_.end() && it->second == job) jobs_.erase(it);
    std::erase(turns_, job);
    job->changed.NotifyAll();
  }
  if (!s.ok() && s.code() != Status::Code::kFull && !cancelled) {
    ++failed_;
    // A changed or damaged source was reported where it was found
    // (ReadSourceChunk, or above): once is enough.
    const bool reported = s.code() == Status::Code::kChanged || s.code() == Status::Code::kCorrupt;
    spdlog::warn("{}: the copy of {} for the host tier was abandoned{}{}; nothing of it is served", job->file->digest,
                 job->file->source_path, reported ? "" : ": ", reported ? "" : s.message());
  }
}

// Whether a streaming reader of chunks [first, last] of `job` may go on:
// they are verified, or it will not be served from the copy at all.
bool FileFiller::StreamReady(const FillJob& job, bool none, uint64_t first, uint64_t last) const {
  if (job.end != FillJob::End::kRunning || readers_stopping_) return true;
  if (!job.prove_whole && none) return true;
  if (job.prove_whole) return false;  // served only once the whole copy passed
  for (uint64_t c = first; c <= last; ++c) {
    if (job.state[c] != kDone) return false;
  }
  return true;
}

std::optional<FileFiller::Streamed> FileFiller::Stream(const FileKey& key, uint64_t offset, size_t len,
                                                      bool wait_for_proof) {
  auto job = InFlight(key);
  if (!job || (job->prove_whole && !wait_for_proof)) return std::nullopt;
  const uint64_t end = std::min<uint64_t>(job->form.size, offset + len);
  if (offset >= end) return Streamed{job->copy, {}, nullptr, 0};
  // The source chunks under [offset, end) of the served form.
  const uint64_t prefix = job->form.prefix ? job->form.prefix->size() : 0;
  const uint64_t header = job->form.source_prefix_len;
  const bool none = end <= prefix;
  const uint64_t first = (std::max(offset, prefix) - prefix + header) / kChunkSize;
  const uint64_t last = none ? first : (end - 1 - prefix + header) / kChunkSize;
  MutexLock lock(jobs_mu_);
  if (!job->prove_whole && !none) {
    for (uint64_t c = first; c <= last; ++c) {
      if (job->state[c] == kPending) job->wanted.push_back(c);
    }
    work_.NotifyAll();
  }
  while (!StreamReady(*job, none, first, last)) job->changed.Wait(jobs_mu_);
  if (job->end == FillJob::End::kFailed || readers_stopping_ ||
      (job->prove_whole && job->end != FillJob::End::kPublished)) {
    return std::nullopt;
  }
  std::shared_ptr<SealedCopy> copy = job->copy;
  lock.Unlock();
  // The hold is taken without jobs_mu_: while the copy is being sealed it
  // waits for the replies still sending from the mapping, and every fill
  // thread would wait with it. The bytes asked for are verified and final
  // already; only the mapping they are read through may move (the seal).
  SealedCopy::MappingHold hold = copy->HoldMapping();
  const uint8_t* data = copy->ReadableAt(offset, end - offset);
  if (data == nullptr) return std::nullopt;  // a seal that failed left no mapping
  ++streamed_;
  return Streamed{std::move(copy), std::move(hold), data, static_cast<size_t>(end - offset)};
}

Result<ProvenChunkTables::Table> FileFiller::Prove(const View::NodePtr& file) {
  if (auto chain = server_.ChainOf(*file)) return chain;
  if (server_.parts().proven == nullptr) return Status::Error("no proven chains on this mount");
  {
    MutexLock lock(prove_mu_);
    while (proving_.count(file->sha256)) proved_.Wait(prove_mu_);
    if (auto table = server_.parts().proven->Find(file->sha256)) return table;
    proving_.insert(file->sha256);
  }
  auto table = ProveByReading(file);
  {
    MutexLock lock(prove_mu_);
    proving_.erase(file->sha256);
  }
  proved_.NotifyAll();
  return table;
}

// One pass over the whole file from its source copies, keeping nothing but
// its SHA-256 chain, which counts only if the whole file's SHA-256 is the
// index's. A pass read from one copy that fails it refuses that
// copy, and the next copy gets a pass of its own: a user's copy whose
// chunks were crafted to pass their XXH3-128 costs a reader of the same
// bytes no EIO while another copy holds them.
Result<ProvenChunkTables::Table> FileFiller::ProveByReading(const View::NodePtr& file) {
  AlignedBuffer buf = ChunkBuffer();
  if (!buf) return Status::FromErrno("no memory for a buffer to prove " + file->source_path, ENOMEM);
  for (size_t pass = 0;; ++pass) {
    Sha256 whole;
    const uint64_t chunks = ChunkCount(file->size);
    auto chain = std::make_shared<ChunkChain>(chunks > 0 ? chunks - 1 : 0);
    const SourceCopy* from = nullptr;  // the one copy every chunk came from, if one did
    bool one_copy = true;
    for (uint64_t c = 0; c < chunks; ++c) {
      if (cancel_) return Status::Error(file->source_path + ": proving cancelled (stopping)");
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, file->size - c * kChunkSize));
      const SourceCopy* by = nullptr;
      if (Status s = server_.ReadSourceChunk(*file, c, buf.get(), len, io_, nullptr, /*whole_file_proven=*/true, &by);
          !s.ok()) {
        return s;
      }
      if (c == 0) from = by;
      one_copy = one_copy && by == from;
      whole.Update(buf.get(), len);
      if (c + 1 < chunks) (*chain)[c] = whole.State();
    }
    if (whole.Finish() == file->sha256) {
      server_.KeepProvenChain(*file, chain);
      return ProvenChunkTables::Table(std::move(chain));
    }
    Status s = NotTheIndexedBytes(*file);
    const SourceCopy* blamed = one_copy && from != nullptr ? from : server_.FirstUsableCopy(*file);
    if (blamed == nullptr) return s;
    // Another pass only when the failing copy is known and others are left.
    const bool again = one_copy && from != nullptr && pass + 1 < file->copies.size();
    server_.ReportSourceFailure(*file, *blamed, s, /*served_by_another=*/again);
    if (!again || server_.AllCopiesRefused(*file)) return s;
  }
}

}  // namespace ckptfs
