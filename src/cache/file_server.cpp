#include "ckptfs/file_server.h"

#include <fcntl.h>

#include <algorithm>
#include <optional>
#include <utility>

#include <spdlog/spdlog.h>

#include "file_filler.h"
#include "header_scans.h"
#include "header_stamper.h"

namespace ckptfs {

size_t ServedBytes::size() const {
  size_t n = 0;
  for (const iovec& v : iov) n += v.iov_len;
  return n;
}

FileServer::FileServer(Parts parts, Options options, Reports reports)
    : parts_(parts), options_(options), reports_(std::move(reports)) {
  if (options_.stamp_headers) stamper_ = std::make_unique<HeaderStamper>();
  if (parts_.files != nullptr) {
    filler_ = std::make_unique<FileFiller>(*this, options_.fill_depth, options_.fill_io);
    header_scans_ = std::make_unique<HeaderScans>();
  }
}

// Fills and read-ahead tasks call back into the server: stop the one, and
// wait for the others to be done with (run, or dropped by a cancelled pool).
FileServer::~FileServer() {
  if (filler_) filler_->Stop();
  MutexLock lock(readahead_mu_);
  while (readahead_in_flight_.load() > 0) readahead_done_.Wait(readahead_mu_);
}

// Under the lock, the count and the wake-up are one step: were the count
// lowered first, the destructor could see 0 and free the server before the
// notify touches its condition variable.
void FileServer::EndReadAhead() {
  MutexLock lock(readahead_mu_);
  if (readahead_in_flight_.fetch_sub(1) == 1) readahead_done_.NotifyAll();
}

Result<FileCache::CopyPtr> FileServer::Fill(const View::NodePtr& file, bool pin,
                                            const std::function<bool(uint64_t)>& progress) {
  if (filler_ == nullptr) return Status::Error(file->source_path + ": no host tier of whole files on this mount");
  return filler_->Fill(file, pin, progress);
}

void FileServer::StopFills() {
  if (filler_) filler_->Stop();
}

FileServer::FillStats FileServer::GetFillStats() const {
  FillStats s;
  if (filler_ == nullptr) return s;
  s.depth = filler_->depth();
  s.failed = filler_->fills_failed();
  s.skipped = filler_->fills_skipped();
  s.streamed_reads = filler_->streamed_reads();
  s.proven = filler_->fills_proven();
  s.header_scan_opens = header_scans_->scan_opens();
  s.io = filler_->io();
  return s;
}

Result<ServedForm> FileServer::FormOf(const View::NodePtr& file) {
  ServedForm form;
  form.key.sha256 = file->sha256;
  form.size = file->size;
  if (stamper_ == nullptr || !file->safetensors) return form;
  auto stamped = stamper_->For(*this, file);
  if (!stamped.ok()) return stamped.status();
  if (!*stamped) return form;  // served unstamped (a header that breaks the format)
  form.key.form = "stamped:" + file->digest;
  form.size = (*stamped)->size;
  form.prefix = (*stamped)->prefix;
  form.source_prefix_len = (*stamped)->source_prefix_len;
  return form;
}

Result<uint64_t> FileServer::ServedSize(const View::NodePtr& file) {
  if (stamper_ == nullptr || !file->safetensors) return file->size;
  if (file->stamped_size) return *file->stamped_size;  // stored at indexing: stat reads nothing
  auto form = FormOf(file);
  if (!form.ok()) return form.status();
  return form->size;
}

// Whether an open's reads may be served from the copy while it is made,
// rather than wait for all of it: only while chunks are served as they are
// verified (not when only a pass over the whole file proves its bytes,
// where a copy is served only once its whole SHA-256 passed), and then for an open with O_DIRECT, which a page
// cache could not serve anyway (a buffered or mmap reader runs faster on
// the passthrough it gets by waiting; README, measured performance), or
// one of a loader reading every shard's header first (HeaderScans).
bool FileServer::StreamsWhileFilling(const View::Node& file, int open_flags, pid_t opener) {
  if (ProvesOnlyWhole(file)) return false;
  if ((open_flags & O_DIRECT) != 0) return true;
  return file.safetensors && header_scans_->OpenIsScan(opener, file.digest, file.ino, std::chrono::steady_clock::now());
}

Result<std::shared_ptr<ServedFile>> FileServer::Served(const View::NodePtr& file) {
  auto f = std::make_shared<ServedFile>();
  f->node = file;
  if (file->content) return f;  // a file the daemon holds itself (a hub ref): no source, no copy
  auto form = FormOf(file);
  if (!form.ok()) return form.status();
  f->key = form->key;
  return f;
}

Result<std::shared_ptr<ServedFile>> FileServer::Open(const View::NodePtr& file, int open_flags, bool inode_open,
                                                     pid_t opener) {
  auto f = Served(file);
  if (!f.ok() || file->content) return f;
  (*f)->opener = opener;
  if (options_.fill == FillPolicy::kWait && filler_ != nullptr && !inode_open && !Resident((*f)->key, false)) {
    if (StreamsWhileFilling(*file, open_flags, opener)) {
      // A parallel loader (O_DIRECT, many threads, every shard at once)
      // gains nothing from waiting for the whole copy, nor does a loader
      // reading the shards' headers before their tensors: the reads are
      // served from the copy as each chunk is verified, the chunks asked
      // for first, and the next open passes through.
      filler_->Start(file);
    } else if (!TakeWaitingPlace()) {
      // Half the FUSE threads wait for copies already: this open does not,
      // so that requests of every other user still find a thread. Its reads
      // are served from the copy as it is made (or, for a file whose bytes
      // only a whole pass proves, where a copy serves nothing before its
      // whole SHA-256 passed, from the chunk path).
      ++opens_not_waiting_;
      if (!ProvesOnlyWhole(*file)) filler_->Start(file);
    } else {
      auto filled = filler_->Fill(file, /*pin=*/false);
      waiting_opens_.fetch_sub(1);
      if (!filled.ok()) {
        // Failing that (no room, a bad source), the chunk path serves it.
        spdlog::debug("{}: not copied at open: {}", file->source_path, filled.status().message());
      }
    }
    // After this file's copy, not beside it: the next shard then fills while
    // the engine loads this one, instead of slowing this one's fill down.
    filler_->EnqueueSiblings(file);
  }
  (*f)->answered = std::chrono::steady_clock::now();
  return f;
}

bool FileServer::TakeWaitingPlace() {
  unsigned now = waiting_opens_.load();
  do {
    if (now >= std::max(1u, options_.max_waiting_opens)) return false;
  } while (!waiting_opens_.compare_exchange_weak(now, now + 1));
  return true;
}

Result<std::shared_ptr<ServedFile>> FileServer::Adopt(const View::NodePtr& file) { return Served(file); }

void FileServer::Opened(const ServedFile&) { ++open_files_; }

void FileServer::OpenedOnChunkPath(const ServedFile& f) {
  if (f.node->content || f.copy || options_.fill != FillPolicy::kOpen || filler_ == nullptr) return;
  filler_->Enqueue(f.node, f.key);
  filler_->EnqueueSiblings(f.node);
}

bool FileServer::Closed(const ServedFile& f, bool alone) {
  --open_files_;
  if (header_scans_ && alone && f.node->safetensors && !f.node->content) {
    const auto now = std::chrono::steady_clock::now();
    header_scans_->Closed(f.opener, f.node->digest, f.node->ino, now - f.answered, now);
  }
  return !f.node->content && Resident(f.key, /*use=*/false) != nullptr;
}

std::vector<CacheTier*> FileServer::tiers() const {
  std::vector<CacheTier*> out;
  if (parts_.files != nullptr) out.push_back(parts_.files);
  if (parts_.cache != nullptr) out.push_back(parts_.cache);
  return out;
}

FileCache::CopyPtr FileServer::Resident(const FileKey& key, bool use) const {
  return parts_.files != nullptr ? parts_.files->Find(key, use) : nullptr;
}

ServedBytes FileServer::FromCopy(const FileCache::CopyPtr& copy, uint64_t offset, size_t size) {
  ServedBytes out;
  if (offset >= copy->size() || size == 0) return out;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, copy->size() - offset));
  out.iov.push_back({const_cast<uint8_t*>(copy->data() + offset), n});
  out.holds.push_back(copy);
  ++reads_;
  bytes_read_ += n;
  return out;
}

bool FileServer::MayReadTheSource(const ServedFile& f) const {
  if (f.copy || f.node->content) return false;
  return Resident(f.key, /*use=*/false) == nullptr;
}

bool FileServer::MayWaitForAProof(const ServedFile& f) const {
  if (f.copy || f.node->content || !ProvesOnlyWhole(*f.node)) return false;
  return Resident(f.key, /*use=*/false) == nullptr;
}

Result<ServedBytes> FileServer::Read(ServedFile& f, uint64_t offset, size_t size) {
  if (const auto& content = f.node->content) {  // a hub ref: no source read, no cache
    ServedBytes out;
    if (offset < content->size()) {
      out.iov.push_back({const_cast<char*>(content->data() + offset),
                         static_cast<size_t>(std::min<uint64_t>(size, content->size() - offset))});
      out.holds.push_back(f.node);
    }
    return out;
  }
  // A copy made since the open serves the reads that follow.
  if (f.copy) return FromCopy(f.copy, offset, size);
  // A copy being made serves what it has verified, rather than the source
  // being read twice.
  if (filler_ != nullptr) {
    // A reader whose chain is known does not wait for another digest's
    // whole-file proof of the same bytes: the chunk path proves its chunks.
    if (auto streamed = filler_->Stream(f.key, offset, size, /*wait_for_proof=*/ProvesOnlyWhole(*f.node))) {
      ServedBytes out;
      out.iov.push_back({const_cast<uint8_t*>(streamed->data), streamed->len});
      ++reads_;
      bytes_read_ += streamed->len;
      out.holds.push_back(std::make_shared<FileFiller::Streamed>(std::move(*streamed)));
      return out;
    }
  }
  // Looked for after the fill, which publishes its copy before it leaves the
  // filler: no fill in flight means any copy there is is published by now.
  if (const FileCache::CopyPtr made = Resident(f.key, /*use=*/false)) return FromCopy(made, offset, size);
  auto out = FromChunkPath(f, offset, size);
  if (!out.ok()) ++failed_reads_;
  return out;
}

// With stamp_headers a safetensors file is served as the stamped header
// followed by the source's tensor bytes, shifted by the header's growth.
Result<ServedBytes> FileServer::FromChunkPath(ServedFile& f, uint64_t offset, size_t size) {
  auto form = FormOf(f.node);
  if (!form.ok()) return form.status();
  ServedBytes out;
  if (offset >= form->size || size == 0) return out;
  const uint64_t begin = offset, end = std::min<uint64_t>(form->size, begin + size);
  uint64_t source_begin = begin, source_end = end;
  if (form->prefix) {
    const uint64_t prefix = form->prefix->size();
    if (begin < prefix) {
      out.iov.push_back({const_cast<char*>(form->prefix->data() + begin),
                         static_cast<size_t>(std::min(end, prefix) - begin)});
      out.holds.push_back(form->prefix);
    }
    source_begin = std::max(begin, prefix) - prefix + form->source_prefix_len;
    source_end = end <= prefix ? source_begin : end - prefix + form->source_prefix_len;
  }
  if (Status s = AppendSourceRange(f.node, source_begin, source_end, out); !s.ok()) return s;
  // The kernel's read-ahead sends neighbouring requests in parallel, so
  // "sequential" means near where the last one ended, not exactly there.
  const uint64_t prev = f.next_offset.exchange(end);
  const bool sequential = begin == 0 || (begin + 2 * kChunkSize >= prev && begin <= prev + 2 * kChunkSize);
  if (sequential && parts_.readahead_pool != nullptr && source_end > source_begin) {
    ReadAhead(f, (source_end - 1) / kChunkSize);
  }
  ++reads_;
  bytes_read_ += end - begin;
  return out;
}

// Appends iovecs for source bytes [begin, end) of `file`, keeping the chunk
// references that back them.
Status FileServer::AppendSourceRange(const View::NodePtr& file, uint64_t begin, uint64_t end, ServedBytes& out) {
  if (begin >= end) return Status::Ok();
  for (uint64_t c = begin / kChunkSize; c <= (end - 1) / kChunkSize; ++c) {
    auto ref = FetchChunk(file, c, /*readahead=*/false);
    if (!ref.ok()) return ref.status();
    const uint64_t chunk_start = c * kChunkSize;
    const uint64_t from = std::max(begin, chunk_start) - chunk_start;
    const uint64_t to = std::min(end, chunk_start + ref->size()) - chunk_start;
    out.iov.push_back({const_cast<uint8_t*>(ref->data() + from), static_cast<size_t>(to - from)});
    out.chunks.push_back(std::move(*ref));
  }
  return Status::Ok();
}

// Requests the chunks after `last_chunk` on the read-ahead pool, so the
// source's I/O and the checks overlap the reader's consumption.
void FileServer::ReadAhead(ServedFile& f, uint64_t last_chunk) {
  const uint64_t chunks = ChunkCount(f.node->size);
  // Two chunks per open file (the one being read and the next the kernel
  // asks for) come first; read ahead only into what is left.
  const uint64_t readers = std::max<uint64_t>(1, open_files_.load());
  const uint64_t share = options_.cache_chunks / readers;
  const uint64_t window = std::min<uint64_t>(options_.readahead_chunks, share > 2 ? share - 2 : 0);
  if (window == 0) return;
  const uint64_t target = std::min<uint64_t>(chunks, last_chunk + 1 + window);
  uint64_t from = f.readahead_until.load();
  from = std::max(from, last_chunk + 1);
  if (from >= target) return;
  f.readahead_until = target;
  for (uint64_t c = from; c < target; ++c) {
    if (readahead_in_flight_.fetch_add(1) >= options_.readahead_budget_chunks) {
      readahead_in_flight_.fetch_sub(1);
      f.readahead_until = c;  // the rest when there is room again
      return;
    }
    // The count goes back when the task is done with, run or dropped (a
    // pool cancelled at shutdown destroys the tasks it will not run).
    std::shared_ptr<FileServer> done(this, [](FileServer* s) { s->EndReadAhead(); });
    parts_.readahead_pool->Submit([this, node = f.node, c, done = std::move(done)] {
      (void)FetchChunk(node, c, /*readahead=*/true);
    });
  }
}

Result<ChunkCache::Ref> FileServer::FetchChunk(const View::NodePtr& file, uint64_t index, bool readahead) {
  if (AllCopiesRefused(*file)) return NoCopyLeft(*file);
  const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, file->size - index * kChunkSize));
  ChunkKey key{file->sha256, static_cast<uint32_t>(index)};
  // A chunk that needs a proof first is not proven inside the chunk's slot
  // (with no_proof_here): readers of the same bytes under another digest,
  // whose copies need none, would wait on that slot for the whole pass.
  auto get = [&] {
    return parts_.cache->Get(
        key, len,
        [&](uint8_t* dst, size_t n) { return ReadVerifiedChunk(file, index, dst, n, /*no_proof_here=*/true); },
        readahead);
  };
  auto ref = get();
  if (!readahead && !ref.ok() && ref.status().code() == Status::Code::kNotFound && filler_ != nullptr &&
      (Proves(*file) || UntrustedCopyLeft(*file))) {
    if (auto proven = filler_->Prove(file); !proven.ok()) return proven.status();
    ref = get();
  }
  if (!ref.ok() && ref.status().code() == Status::Code::kFull) spdlog::error("{}: {}", file->digest, ref.status().message());
  return ref;
}

}  // namespace ckptfs
