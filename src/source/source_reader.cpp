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
#include "ckptfs/unique_fd.h"
#include "open_source_files.h"

namespace ckptfs {

namespace {

// As much of [offset, offset + len) as one read through `direct_fd` (opened
// with O_DIRECT) gives, into `dst` (aligned, with room for `len` rounded up
// to the alignment); the caller reads the rest, if any, buffered. nullopt
// when the read could not be direct at all: a misaligned buffer, or a
// filesystem that refuses it (EINVAL).
std::optional<size_t> ReadDirect(int direct_fd, uint64_t offset, uint8_t* dst, size_t len) {
  constexpr size_t kAlign = SourceReader::kDirectAlignment;
  if (reinterpret_cast<uintptr_t>(dst) % kAlign != 0 || offset % kAlign != 0) return std::nullopt;
  const size_t want = (len + kAlign - 1) / kAlign * kAlign;
  ssize_t n;
  do {
    n = ::pread(direct_fd, dst, want, static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
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

SourceReader::SourceReader(std::string root)
    : root_(std::move(root)), files_(std::make_unique<OpenSourceFiles>(root_)) {}

SourceReader::~SourceReader() = default;

size_t SourceReader::files_open() const { return files_->size(); }

Status SourceReader::ReadChunk(const std::string& path, const FileStamp& stamp, const std::vector<ChunkHash>& chunks,
                               uint64_t index, uint8_t* dst, size_t len, Io io) {
  if (index >= chunks.size()) {
    return Status::Error(path + ": chunk " + std::to_string(index) + " is past the end of the chunk table");
  }
  auto opened = files_->Open(path, stamp, /*direct=*/false);
  if (!opened.ok()) {
    if (opened.status().error_number() == ENOENT) return Status::Changed(path + ": source file is gone");
    return opened.status();
  }
  const int fd = (*opened)->fd.get();
  struct stat st;
  // A descriptor kept from an earlier read is checked after this one (its
  // file may have changed since); one opened now, at once.
  if (FileStamp::FromStat((*opened)->st) != stamp) {
    files_->Forget(path);
    return Status::Changed(path + ": source changed since it was indexed");
  }

  const uint64_t offset = index * kChunkSize;
  size_t done = 0;
  bool direct = io == Io::kDirect;
  if (io == Io::kAuto) {
    // A chunk mostly in the page cache is copied from it; one mostly not is
    // read directly from the disk, so that it is not cached a second time.
    // Where the kernel cannot say, buffered.
    const std::optional<double> cached = CachedShare(fd, offset, len);
    direct = cached && *cached < 0.5;
    if (cached && !direct) cached_bytes_read_ += len;
  }
  std::optional<size_t> from_disk;
  if (direct) {
    if (auto direct_file = files_->Open(path, stamp, /*direct=*/true); direct_file.ok()) {
      from_disk = ReadDirect((*direct_file)->fd.get(), offset, dst, len);
    }
    if (from_disk) {
      direct_bytes_read_ += *from_disk;
      done += *from_disk;
    } else {
      ++direct_reads_refused_;
    }
  }
  while (done < len) {
    ssize_t n = ::pread(fd, dst + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read source " + path + " at offset " + std::to_string(offset), errno);
    if (n == 0) {
      files_->Forget(path);
      return Status::Changed(path + ": source is shorter than when it was indexed");
    }
    done += static_cast<size_t>(n);
  }
  bytes_read_ += len;
  ++chunks_read_;
  // The stamp again: a write that raced with the read shows here, as does
  // a change of a kept descriptor's file since its last read.
  if (::fstat(fd, &st) != 0 || FileStamp::FromStat(st) != stamp) {
    files_->Forget(path);
    return Status::Changed(path + ": source changed while it was read");
  }
  if (HashChunk(dst, len) != chunks[index]) {
    return Status::Corrupt(path + ": chunk " + std::to_string(index) + " (offset " + std::to_string(offset) +
                         ") does not match the index although the file's stamp does");
  }
  return Status::Ok();
}

}  // namespace ckptfs
