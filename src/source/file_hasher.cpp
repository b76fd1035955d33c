#include "ckptfs/file_hasher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <future>
#include <memory>
#include <optional>

#include "ckptfs/source_file.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

std::atomic<uint64_t> FileHasher::files_opened_{0};

namespace {

// Buffers in flight per file: one being read and SHA'd while the chunk hashes
// of the previous ones finish on the pool.
constexpr size_t kBuffers = 3;

// Reads up to `len` bytes at `off`, retrying short reads; returns bytes read
// (less than len only at end of file) or -errno.
int64_t PreadFull(int fd, uint8_t* buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<int64_t>(done);
}

}  // namespace

Result<FileHashes> FileHasher::Hash(const std::string& path, const FileStamp& expected, struct stat* observed) const {
  auto opened = OpenSourceFile(root_, path);
  if (!opened.ok()) return opened.status();
  files_opened_.fetch_add(1);
  const UniqueFd& fd = opened->fd;
  struct stat st = opened->st;
  if (observed) *observed = st;
  if (FileStamp::FromStat(st) != expected) {
    return Status::Changed(path + ": changed since it was listed (" + FileStamp::FromStat(st).ToString() + ")");
  }
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);

  FileHashes out;
  out.size = expected.size;
  const uint64_t chunks = ChunkCount(expected.size);
  out.chunks.resize(chunks);

  std::array<std::unique_ptr<uint8_t[]>, kBuffers> buffers;
  std::array<std::future<void>, kBuffers> pending;
  Sha256 sha;
  Status failure;

  for (uint64_t i = 0; i < chunks; ++i) {
    const size_t slot = i % kBuffers;
    if (pending[slot].valid()) pending[slot].wait();  // its previous chunk hash is done
    if (!buffers[slot]) buffers[slot].reset(new uint8_t[kChunkSize]);
    uint8_t* buf = buffers[slot].get();

    const uint64_t offset = i * kChunkSize;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunkSize, expected.size - offset));
    const int64_t got = PreadFull(fd.get(), buf, want, offset);
    if (got < 0) {
      failure = Status::FromErrno("cannot read " + path + " at offset " + std::to_string(offset),
                                  static_cast<int>(-got));
      break;
    }
    if (static_cast<size_t>(got) != want) {
      failure = Status::Changed(path + ": truncated while being hashed (expected " +
                                std::to_string(expected.size) + " bytes, ended at " +
                                std::to_string(offset + static_cast<uint64_t>(got)) + ")");
      break;
    }
    if (hook_) hook_(path, i);
    if (cancel_ != nullptr && cancel_->load()) {
      failure = Status::Error(path + ": hashing cancelled (the daemon is stopping)");
      break;
    }
    ChunkHash* slot_out = &out.chunks[i];
    if (chunk_pool_ != nullptr) {
      pending[slot] = chunk_pool_->Submit([buf, want, slot_out] { *slot_out = HashChunk(buf, want); });
    } else {
      *slot_out = HashChunk(buf, want);
    }
    sha.Update(buf, want);
    if (progress_) progress_(want);
  }
  for (auto& p : pending) {
    if (p.valid()) p.wait();  // buffers must outlive the tasks that read them
  }
  if (!failure.ok()) return failure;
  if (chunks == 0) sha.Update("", 0);

  // A byte past the expected end means the file grew while we read it.
  uint8_t probe;
  int64_t extra = PreadFull(fd.get(), &probe, 1, expected.size);
  if (extra > 0) return Status::Changed(path + ": grew while being hashed");
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("cannot stat " + path, errno);
  if (observed) *observed = st;
  if (FileStamp::FromStat(st) != expected) {
    return Status::Changed(path + ": modified while being hashed");
  }
  out.sha256 = sha.Finish();
  return out;
}

}  // namespace ckptfs
