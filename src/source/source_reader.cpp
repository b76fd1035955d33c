#include "ckptfs/source_reader.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#include "source_file.h"
#include "ckptfs/retry_eintr.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

namespace {

// As much of [offset, offset + len) as one O_DIRECT read gives, into `dst`
// (aligned, with room for `len` rounded up to the alignment); the caller
// reads the rest, if any, buffered. nullopt when the read could not be
// direct at all: a misaligned buffer, or a filesystem that refuses O_DIRECT
// (EINVAL). The descriptor is left buffered either way, since the stamp
// checks and any remainder use it.
std::optional<size_t> ReadDirect(int fd, uint64_t offset, uint8_t* dst, size_t len) {
  constexpr size_t kAlign = SourceReader::kDirectAlignment;
  if (reinterpret_cast<uintptr_t>(dst) % kAlign != 0 || offset % kAlign != 0) return std::nullopt;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) return std::nullopt;
  const size_t want = (len + kAlign - 1) / kAlign * kAlign;
  ssize_t n;
  do {
    n = ::pread(fd, dst, want, static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  ::fcntl(fd, F_SETFL, flags);
  // The block holding the end of the file comes whole (also from a read
  // that failed part way); what lies past the end is not the file's, so it
  // must not stay where a mapping of the copy could show it.
  std::memset(dst + len, 0, want - len);
  if (n < 0) return std::nullopt;  // the buffered read then reports a real I/O error with its path
  // A read at the end of the file ends there; never count bytes past `len`.
  return std::min(static_cast<size_t>(n), len);
}

// The share of [offset, offset + len) in the page cache now, from 0 to 1,
// asked of the kernel without reading anything (cachestat, Linux 6.5+; a
// read with RWF_NOWAIT would start read-ahead of what is missing, and so
// read it twice). nullopt when the kernel cannot say.
std::optional<double> CachedShare(int fd, uint64_t offset, size_t len) {
#ifdef SYS_cachestat
  constexpr long kCachestat = SYS_cachestat;
#else
  constexpr long kCachestat = 451;  // the same number on every architecture
#endif
  struct {
    uint64_t off, len;
  } range{offset, len};
  struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } stat{};
  if (len == 0 || ::syscall(kCachestat, fd, &range, &stat, 0) != 0) return std::nullopt;
  const uint64_t pages = (len + 4095) / 4096;
  return std::min(1.0, static_cast<double>(stat.nr_cache) / static_cast<double>(pages));
}

}  // namespace

Status SourceReader::ReadChunk(const std::string& path, const FileStamp& stamp, const std::vector<ChunkHash>& chunks,
                               uint64_t index, uint8_t* dst, size_t len, Io io) {
  if (index >= chunks.size()) {
    return Status::Error(path + ": chunk " + std::to_string(index) + " is past the end of the chunk table");
  }
  auto opened = OpenSourceFile(root_, path);
  if (!opened.ok()) {
    if (opened.status().error_number() == ENOENT) return Status::Changed(path + ": source file is gone");
    return opened.status();
  }
  const UniqueFd& fd = opened->fd;
  struct stat st = opened->st;
  if (FileStamp::FromStat(st) != stamp) return Status::Changed(path + ": source changed since it was indexed");

  const uint64_t offset = index * kChunkSize;
  size_t done = 0;
  bool direct = io == Io::kDirect;
  if (io == Io::kAuto) {
    // A chunk mostly in the page cache is copied from it; one mostly not is
    // read directly from the disk, so that it is not cached a second time.
    // Where the kernel cannot say, buffered.
    const std::optional<double> cached = CachedShare(fd.get(), offset, len);
    direct = cached && *cached < 0.5;
    if (cached && !direct) cached_bytes_read_ += len;
  }
  if (direct) {
    if (auto from_disk = ReadDirect(fd.get(), offset, dst, len)) {
      direct_bytes_read_ += *from_disk;
      done += *from_disk;
    } else {
      ++direct_reads_refused_;
    }
  }
  while (done < len) {
    ssize_t n = ::pread(fd.get(), dst + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read source " + path + " at offset " + std::to_string(offset), errno);
    if (n == 0) return Status::Changed(path + ": source is shorter than when it was indexed");
    done += static_cast<size_t>(n);
  }
  bytes_read_ += len;
  ++chunks_read_;
  // The stamp again: a write that raced with the read shows here.
  if (RetryOnEintr([&] { return ::fstat(fd.get(), &st); }) != 0 || FileStamp::FromStat(st) != stamp) {
    return Status::Changed(path + ": source changed while it was read");
  }
  if (HashChunk(dst, len) != chunks[index]) {
    return Status::Corrupt(path + ": chunk " + std::to_string(index) + " (offset " + std::to_string(offset) +
                         ") does not match the index although the file's stamp does");
  }
  return Status::Ok();
}

}  // namespace ckptfs
