#include "ckptfs/file_filler.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <vector>

#include <spdlog/spdlog.h>

#include "ckptfs/catalog.h"
#include "ckptfs/header_stamper.h"

namespace ckptfs::daemon {

Result<ServedForm> ServedFormOf(FsContext& ctx, const View::NodePtr& file) {
  ServedForm form;
  form.key.sha256 = file->sha256;
  form.size = file->size;
  if (ctx.stamper == nullptr || !file->safetensors) return form;
  auto stamped = ctx.stamper->For(ctx, file);
  if (!stamped.ok()) return stamped.status();
  if (!*stamped) return form;  // served unstamped (a header that breaks the format)
  form.key.form = "stamped:" + file->digest;
  form.size = (*stamped)->size;
  form.prefix = (*stamped)->prefix;
  form.source_prefix_len = (*stamped)->source_prefix_len;
  return form;
}

FileFiller::FileFiller(FsContext& ctx, unsigned depth, SourceReader::Io io)
    : ctx_(ctx), io_(io), reads_(std::max(1u, depth)) {
  worker_ = std::thread([this] { RunQueue(); });
}

FileFiller::~FileFiller() { Stop(); }

void FileFiller::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queue_.clear();
    queued_.clear();
    sibling_requests_.clear();
  }
  cancel_ = true;
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

// Source chunk `chunk` of `file`, verified, at its place in the copy: byte o
// of the source lands at o + (prefix - source_prefix_len); the bytes of a
// source header being replaced are not copied. Where the copy is written
// through a mapping, a chunk that lands in one piece is read straight into
// it; otherwise it goes through `buf` (kChunkSize bytes, aligned for
// O_DIRECT).
Status FileFiller::CopyChunk(const View::NodePtr& file, const ServedForm& form, uint64_t chunk, uint8_t* buf,
                             SealedCopy& copy) {
  const uint64_t begin = chunk * kChunkSize;
  const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, file->size - begin));
  const uint64_t prefix = form.prefix ? form.prefix->size() : 0;
  if (begin >= form.source_prefix_len) {
    const uint64_t at = begin - form.source_prefix_len + prefix;
    const bool aligned_enough = io_ == SourceReader::Io::kBuffered || at % SourceReader::kDirectAlignment == 0;
    if (uint8_t* in_place = copy.WritableAt(at, len); in_place != nullptr && aligned_enough) {
      return ctx_.reader->ReadChunk(file->source_path, file->stamp, *file->chunks, chunk, in_place, len, io_);
    }
  }
  if (Status s = ctx_.reader->ReadChunk(file->source_path, file->stamp, *file->chunks, chunk, buf, len, io_); !s.ok()) {
    return s;
  }
  const size_t skip = static_cast<size_t>(std::min<uint64_t>(len, form.source_prefix_len - std::min(begin, form.source_prefix_len)));
  return copy.Write(begin + skip - form.source_prefix_len + prefix, buf + skip, len - skip);
}

// Every chunk of `file` into `copy`, `depth` of them in flight; the first
// failure stops the others at their next chunk.
Status FileFiller::CopyChunks(const View::NodePtr& file, const ServedForm& form, SealedCopy& copy,
                              const std::function<bool(uint64_t)>& progress) {
  const uint64_t chunks = ChunkCount(file->size);
  std::atomic<uint64_t> next{0}, done_chunks{0}, done_bytes{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  Status error;
  auto work = [&] {
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(
        static_cast<uint8_t*>(std::aligned_alloc(SourceReader::kDirectAlignment, kChunkSize)), &std::free);
    for (uint64_t c; !failed && !cancel_ && (c = next++) < chunks;) {
      Status s = buf ? CopyChunk(file, form, c, buf.get(), copy) : Status::FromErrno("no memory for a fill buffer", ENOMEM);
      if (!s.ok()) {
        std::lock_guard lock(error_mu);
        if (!failed.exchange(true)) error = s;
        return;
      }
      ++done_chunks;
      done_bytes += std::min<uint64_t>(kChunkSize, file->size - c * kChunkSize);
    }
  };
  std::vector<std::future<void>> running;
  for (uint64_t i = 0; i < std::min<uint64_t>(reads_.size(), chunks); ++i) running.push_back(reads_.Submit(work));
  for (auto& f : running) {
    while (f.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
      if (progress && !progress(done_bytes.load())) failed = true;  // the others stop at their next chunk
    }
  }
  if (!error.ok()) {
    Report(file, error);
    return error;
  }
  if (done_chunks.load() != chunks) return Status::Error(file->source_path + ": fill cancelled");
  if (!form.prefix) return Status::Ok();
  return copy.Write(0, reinterpret_cast<const uint8_t*>(form.prefix->data()), form.prefix->size());
}

void FileFiller::Report(const View::NodePtr& file, const Status& s) {
  ++failed_;
  ReportSourceFailure(ctx_, *file, s);
  spdlog::warn("{}: the copy of {} for the host tier was abandoned; nothing of it is served", file->digest,
               file->source_path);
}

Result<FileCache::CopyPtr> FileFiller::Fill(const View::NodePtr& file, bool pin,
                                            const std::function<bool(uint64_t)>& progress) {
  auto form = ServedFormOf(ctx_, file);
  if (!form.ok()) return form.status();
  auto claim = ctx_.files->Claim(form->key, form->size, pin, /*wait=*/true);
  if (!claim.ok()) return claim.status();
  if (claim->resident) {
    if (pin) {
      if (Status s = ctx_.files->Pin(form->key); !s.ok()) return s;
    }
    return claim->resident;
  }
  auto copy = SealedCopy::Create("ckptfs:" + ToHex(file->sha256).substr(0, 16) + ":" + file->digest.substr(7, 12),
                                 form->size);
  if (!copy.ok()) return copy.status();  // the reservation is given back
  if (Status s = CopyChunks(file, *form, **copy, progress); !s.ok()) return s;
  if (Status s = (*copy)->Seal(); !s.ok()) return s;
  return ctx_.files->Publish(std::move(claim->fill), std::move(*copy));
}

namespace {
constexpr size_t kMaxQueued = 4096;  // an open storm must not grow memory without bound
}  // namespace

void FileFiller::Enqueue(const View::NodePtr& file, const FileKey& key) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queued_.count(key) || queue_.size() >= kMaxQueued) return;
    queued_.insert(key);
    queue_.emplace_back(file, key);
  }
  wake_.notify_one();
}

void FileFiller::EnqueueSiblings(const View::NodePtr& file) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || sibling_requests_.size() >= kMaxQueued) return;
    sibling_requests_.push_back(file);
  }
  wake_.notify_one();
}

void FileFiller::QueueSiblingsOf(const View::NodePtr& file) {
  const std::string_view path = file->source_path;
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  if (!IsWeightFileName(path.substr(slash + 1)) || dot == std::string_view::npos) return;
  const std::string_view dir = path.substr(0, slash + 1), suffix = path.substr(dot);
  const auto root = ctx_.view->Get(kRootInode);
  const auto digest_dir = root ? root->children.find(file->digest) : std::map<std::string, InodeId>::const_iterator{};
  if (!root || digest_dir == root->children.end()) return;
  std::vector<View::NodePtr> siblings;
  for (auto& f : ctx_.view->FilesUnder(ctx_.view->Get(digest_dir->second))) {
    const std::string_view p = f->source_path;
    if (f->sha256 != file->sha256 && p.size() > dir.size() + suffix.size() && p.substr(0, dir.size()) == dir &&
        p.find('/', dir.size()) == std::string_view::npos && p.substr(p.size() - suffix.size()) == suffix) {
      siblings.push_back(std::move(f));
    }
  }
  std::sort(siblings.begin(), siblings.end(), [](const auto& a, const auto& b) { return a->source_path < b->source_path; });
  const FileCache::Stats tier = ctx_.files->GetStats();
  uint64_t room = tier.capacity - std::min(tier.capacity, tier.used + tier.filling);
  for (const auto& f : siblings) {
    auto form = ServedFormOf(ctx_, f);
    if (!form.ok() || ctx_.files->Find(form->key, /*use=*/false)) continue;
    if (PageBytes(form->size) > room) break;
    room -= PageBytes(form->size);
    Enqueue(f, form->key);
  }
}

void FileFiller::RunQueue() {
  for (;;) {
    std::pair<View::NodePtr, FileKey> job;
    View::NodePtr siblings_of;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !sibling_requests_.empty(); });
      if (stopping_) return;
      // Sibling requests first: they only queue fills, behind any queued before.
      if (!sibling_requests_.empty()) {
        siblings_of = std::move(sibling_requests_.front());
        sibling_requests_.pop_front();
      } else {
        job = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (siblings_of) {
      QueueSiblingsOf(siblings_of);
      continue;
    }
    if (!ctx_.files->Find(job.second, /*use=*/false)) {
      auto filled = Fill(job.first, /*pin=*/false);
      if (!filled.ok() && filled.status().code() == Status::Code::kFull) {
        ++skipped_;
        spdlog::debug("{}: not copied into the host tier: {}", job.first->source_path, filled.status().message());
      }
    }
    std::lock_guard lock(mu_);
    queued_.erase(job.second);
  }
}

}  // namespace ckptfs::daemon
