#include "ckptfs/file_hasher.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <new>
#include <optional>
#include <vector>

#include "source_file.h"

namespace ckptfs {

std::atomic<uint64_t> FileHasher::files_opened_{0};
std::atomic<uint64_t> FileHasher::direct_bytes_read_{0};

namespace {

constexpr uint64_t kToTheEnd = std::numeric_limits<uint64_t>::max();

// Reads up to `len` bytes at `off`, retrying short reads until `enough`
// bytes are in; returns bytes read (less than len only at end of file) or
// -errno. A read that asks for a byte past the expected end (enough < len)
// stops at the first short read past `enough`: that is the end of the file,
// and a file that grew meanwhile is seen by its stamp afterwards anyway.
int64_t PreadFull(int fd, uint8_t* buf, size_t len, uint64_t off, size_t enough) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
    if (done >= enough && done < len) break;
  }
  return static_cast<int64_t>(done);
}

int64_t PreadFull(int fd, uint8_t* buf, size_t len, uint64_t off) { return PreadFull(fd, buf, len, off, len); }

// A chunk of zeros that nobody can write: a read-only anonymous mapping, whose
// pages are all the kernel's one zero page, so SHA-256 over a hole reads from
// the CPU's cache, not from memory.
const uint8_t* Zeros() {
  static const uint8_t* const zeros = [] {
    void* p = ::mmap(nullptr, kChunkSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) return static_cast<const uint8_t*>(p);
    static const std::vector<uint8_t> fallback(kChunkSize, 0);
    return fallback.data();
  }();
  return zeros;
}

ChunkHash ZeroChunkHash(size_t len) {
  static const ChunkHash whole = HashChunk(Zeros(), kChunkSize);
  return len == kChunkSize ? whole : HashChunk(Zeros(), len);
}

}  // namespace

std::shared_ptr<UniqueFd> FileHasher::OpenSourceRoot(const std::string& root) {
  if (root.empty() || root == "/") return nullptr;
  auto fd = std::make_shared<UniqueFd>(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  return fd->valid() ? fd : nullptr;
}

void FileHasher::set_source_root(std::string root, std::shared_ptr<UniqueFd> root_fd) {
  root_ = std::move(root);
  root_fd_ = std::move(root_fd);
}

std::unique_ptr<FileHashTask> FileHasher::Start(const std::string& path, const FileStamp& expected,
                                                TaskOptions extra) const {
  return std::unique_ptr<FileHashTask>(new FileHashTask(*this, path, expected, std::move(extra)));
}

Result<FileHashes> FileHasher::Hash(const std::string& path, const FileStamp& expected, struct stat* observed) const {
  auto task = Start(path, expected, TaskOptions{});
  task->Run();
  if (observed != nullptr && task->observed().st_ino != 0) *observed = task->observed();
  return task->TakeResult();
}

FileHashTask::FileHashTask(const FileHasher& hasher, std::string path, FileStamp expected,
                           FileHasher::TaskOptions extra)
    : hasher_(hasher),
      path_(std::move(path)),
      expected_(expected),
      copy_(std::move(extra.copy)),
      hashed_(extra.hashed),
      cancelled_(std::move(extra.cancelled)),
      chunks_(ChunkCount(expected.size)),
      pipelined_(hasher.io_pool_ != nullptr && chunks_ > 1) {
  out_.size = expected_.size;
  out_.chunks.resize(chunks_);
  out_.chain.emplace().reserve(chunks_ > 0 ? chunks_ - 1 : 0);
}

FileHashTask::~FileHashTask() {
  for (auto& slot : slots_) {
    if (slot.read.valid()) slot.read.wait();  // it writes into the slot and the copy
  }
}

uint64_t FileHashTask::ChunkLen(uint64_t chunk) const {
  return std::min<uint64_t>(kChunkSize, expected_.size - chunk * kChunkSize);
}

Status FileHashTask::Open() {
  auto opened = OpenSourceFile(hasher_.root_, path_, hasher_.root_fd_ ? hasher_.root_fd_->get() : -1);
  if (!opened.ok()) return opened.status();
  FileHasher::files_opened_.fetch_add(1);
  observed_ = opened->st;
  if (FileStamp::FromStat(observed_) != expected_) {
    return Status::Changed(path_ + ": changed since it was listed (" + FileStamp::FromStat(observed_).ToString() + ")");
  }
  fd_ = std::move(opened->fd);
  if (pipelined_) {
    ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);  // the hint is the descriptor's
    // Invalid when the file cannot be read so (then every chunk is buffered).
    direct_fd_ = ReopenDirect(fd_.get(), observed_);
  }
  opened_once_ = true;
  region_valid_ = false;
  return Status::Ok();
}

void FileHashTask::Release() {
  for (auto& slot : slots_) {
    if (slot.read.valid()) slot.read.wait();
    slot.read = {};
    slot.buffer.reset();
  }
  next_read_ = next_hash_;  // what was read ahead is read again when resumed
  direct_fd_.reset();
  fd_.reset();
}

// One or two lseeks per extent of the file, not per chunk: the answer holds
// for every chunk up to the end of the data extent it found.
bool FileHashTask::ChunkIsHole(uint64_t begin, uint64_t end) {
  // A file of one chunk costs at most a chunk's read: not worth two lseeks.
  if (!holes_known_ || chunks_ <= 1) return false;
  if (!region_valid_ || begin < region_ || begin >= data_end_) {
    const off_t data = ::lseek(fd_.get(), static_cast<off_t>(begin), SEEK_DATA);
    region_ = begin;
    region_valid_ = true;
    if (data < 0) {
      if (errno != ENXIO) {  // the filesystem cannot tell: read everything
        holes_known_ = false;
        return false;
      }
      hole_end_ = data_end_ = kToTheEnd;  // no data from here to the end
    } else {
      hole_end_ = static_cast<uint64_t>(data);
      const off_t hole = ::lseek(fd_.get(), data, SEEK_HOLE);
      data_end_ = hole > data ? static_cast<uint64_t>(hole) : kToTheEnd;
    }
  }
  return end <= hole_end_;
}

void FileHashTask::Submit(uint64_t chunk) {
  Slot& slot = slots_[pipelined_ ? chunk % FileHasher::kReadAhead : 0];
  const uint64_t begin = chunk * kChunkSize;
  const uint64_t len = ChunkLen(chunk);
  slot.chunk = chunk;
  slot.hole = ChunkIsHole(begin, begin + len);
  if (slot.hole) {
    slot.data = const_cast<uint8_t*>(Zeros());  // only ever read
    slot.got = static_cast<int64_t>(len);
    out_.chunks[chunk] = ZeroChunkHash(static_cast<size_t>(len));
    return;
  }
  slot.data = copy_ ? copy_->WritableAt(begin, static_cast<size_t>(len)) : nullptr;
  if (slot.data == nullptr) {
    // One byte more than a chunk, so that the last read can ask for a byte
    // past the end and see a file that grew without another read; whole
    // aligned blocks, for O_DIRECT.
    if (!slot.buffer) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunkSize, expected_.size)) + 1;
      const size_t cap = (want + kDirectReadAlignment - 1) / kDirectReadAlignment * kDirectReadAlignment;
      slot.buffer.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectReadAlignment, cap)));
      if (!slot.buffer) throw std::bad_alloc();
    }
    slot.data = slot.buffer.get();
  }
  slot.got = -ECANCELED;  // stays so if the pool drops the read (shutdown)
  if (pipelined_) {
    slot.read = hasher_.io_pool_->Submit([this, &slot] { Read(slot); });
  } else {
    Read(slot);
  }
}

void FileHashTask::Read(Slot& slot) {
  const uint64_t begin = slot.chunk * kChunkSize;
  const size_t len = static_cast<size_t>(ChunkLen(slot.chunk));
  size_t direct = 0;
  slot.probed = false;
  // A chunk mostly not in the page cache comes straight from the disk (the
  // last one too: the copy and the buffer have room up to a whole block).
  if (copy_ && slot.data != slot.buffer.get()) copy_->PreparePages(begin, len);
  if (direct_fd_.valid() && !direct_refused_.load(std::memory_order_relaxed)) {
    const std::optional<double> cached = CachedShare(fd_.get(), begin, len);
    if (cached && *cached < 0.5) {
      if (auto n = ReadDirect(direct_fd_.get(), begin, slot.data, len)) {
        direct = *n;
        FileHasher::direct_bytes_read_.fetch_add(direct, std::memory_order_relaxed);
      } else {
        direct_refused_ = true;  // this filesystem's answer for the whole file
      }
    }
  }
  slot.got = static_cast<int64_t>(direct);
  if (direct < len) {
    const bool probe = slot.chunk + 1 == chunks_ && slot.data == slot.buffer.get();
    const int64_t rest = PreadFull(fd_.get(), slot.data + direct, len - direct + (probe ? 1 : 0), begin + direct,
                                   len - direct);
    slot.got = rest < 0 ? rest : slot.got + rest;
    slot.probed = probe;
  }
  if (slot.got != static_cast<int64_t>(len)) return;
  out_.chunks[slot.chunk] = HashChunk(slot.data, len);
  // The copy is written here, on the thread that read the chunk, so that
  // copying (slow into fresh memory: about 0.2-0.6 GB/s a thread on these
  // VMs) overlaps SHA-256 on the task's thread instead of following it.
  // Still the very bytes SHA-256 takes: the buffer is written only by this
  // read and is not reused until Consume has hashed it. A copy that cannot
  // be written is given up at Finish; the hashing goes on.
  if (copy_ && slot.data == slot.buffer.get() && !copy_failed_.load(std::memory_order_relaxed)) {
    if (!copy_->Write(begin, slot.data, len).ok()) copy_failed_ = true;
  }
}

Status FileHashTask::Consume(uint64_t chunk) {
  Slot& slot = slots_[pipelined_ ? chunk % FileHasher::kReadAhead : 0];
  if (slot.read.valid()) slot.read.wait();
  slot.read = {};
  const uint64_t begin = chunk * kChunkSize;
  const size_t len = static_cast<size_t>(ChunkLen(chunk));
  if (slot.got < 0) {
    return Status::FromErrno("cannot read " + path_ + " at offset " + std::to_string(begin), static_cast<int>(-slot.got));
  }
  if (slot.got < static_cast<int64_t>(len)) {
    return Status::Changed(path_ + ": truncated while being hashed (expected " + std::to_string(expected_.size) +
                           " bytes, ended at " + std::to_string(begin + static_cast<uint64_t>(slot.got)) + ")");
  }
  if (slot.got > static_cast<int64_t>(len)) return Status::Changed(path_ + ": grew while being hashed");
  if (slot.probed) growth_checked_ = true;
  if (hasher_.hook_) hasher_.hook_(path_, chunk);
  if (Cancelled()) return Status::Error(path_ + ": hashing cancelled");
  sha_.Update(slot.data, len);
  if (chunk + 1 < chunks_) out_.chain->push_back(sha_.State());
  if (hashed_ != nullptr) hashed_->fetch_add(len, std::memory_order_relaxed);
  if (hasher_.progress_) hasher_.progress_(len);
  return Status::Ok();
}

Status FileHashTask::Finish() {
  if (!growth_checked_) {
    uint8_t probe;
    if (PreadFull(fd_.get(), &probe, 1, expected_.size) > 0) return Status::Changed(path_ + ": grew while being hashed");
  }
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return Status::FromErrno("cannot stat " + path_, errno);
  observed_ = st;
  const FileStamp now = FileStamp::FromStat(st);
  if (now != expected_) {
    if (now.size < expected_.size) {
      return Status::Changed(path_ + ": truncated while being hashed (expected " + std::to_string(expected_.size) +
                             " bytes, now " + std::to_string(now.size) + ")");
    }
    if (now.size > expected_.size) return Status::Changed(path_ + ": grew while being hashed");
    return Status::Changed(path_ + ": modified while being hashed");
  }
  if (chunks_ == 0) sha_.Update("", 0);
  out_.sha256 = sha_.Finish();
  if (copy_ && !copy_failed_.load()) {
    copy_->Publish(out_);
    copy_.reset();
  }
  return Status::Ok();
}

bool FileHashTask::Run(const std::function<bool()>& yield) {
  if (done_) return true;
  if (!fd_.valid()) failure_ = Open();
  while (failure_.ok() && next_hash_ < chunks_) {
    if (Cancelled()) {
      failure_ = Status::Error(path_ + ": hashing cancelled");
      break;
    }
    const uint64_t ahead = pipelined_ ? FileHasher::kReadAhead : 1;
    while (next_read_ < chunks_ && next_read_ < next_hash_ + ahead) Submit(next_read_++);
    failure_ = Consume(next_hash_);
    if (!failure_.ok()) break;
    ++next_hash_;
    if (next_hash_ < chunks_ && yield && yield()) {
      Release();
      return false;
    }
  }
  for (auto& slot : slots_) {
    if (slot.read.valid()) slot.read.wait();  // a failure leaves reads in flight
  }
  if (failure_.ok()) failure_ = Finish();
  Release();
  copy_.reset();  // unpublished: given up
  done_ = true;
  return true;
}

Result<FileHashes> FileHashTask::TakeResult() {
  if (!failure_.ok()) return failure_;
  return std::move(out_);
}

}  // namespace ckptfs
