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

#include "open_source_files.h"
#include "retry_eintr.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

namespace {

// As much of [offset, offset + len) as one O_DIRECT read of `fd` (opened
// with O_DIRECT) gives, into `dst` (aligned, with room for `len` rounded up
// to the alignment); the caller reads the rest, if any, buffered. nullopt
// when the read could not be direct at all: a misaligned buffer, or a
// filesystem that refuses the read (EINVAL).
std::optional<size_t> ReadDirect(int fd, uint64_t offset, uint8_t* dst, size_t len) {
  constexpr size_t kAlign = SourceReader::kDirectAlignment;
  if (reinterpret_cast<uintptr_t>(dst) % kAlign != 0 || offset % kAlign != 0) return std::nullopt;
  const size_t want = (len + kAlign - 1) / kAlign * kAlign;
  ssize_t n;
  do {
    n = ::pread(fd, dst, want, static_cast<off_t>(offset));
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

SourceReader::SourceReader(std::string root, size_t kept_open, std::chrono::milliseconds idle_close)
    : files_(std::make_unique<OpenSourceFiles>(std::move(root), kept_open, idle_close)) {}

SourceReader::~SourceReader() = default;

uint64_t SourceReader::source_opens() const { return files_->opens(); }
size_t SourceReader::source_files_open() const { return files_->open_files(); }

Status SourceReader::ReadChunk(const std::string& path, const FileStamp& stamp, const std::vector<ChunkHash>& chunks,
                               uint64_t index, uint8_t* dst, size_t len, Io io) {
  if (index >= chunks.size()) {
    return Status::Error(path + ": chunk " + std::to_string(index) + " is past the end of the chunk table");
  }
  // A descriptor kept from an earlier chunk whose file changed, was removed
  // or renamed over (or went stale) is let go, and the path opened again:
  // the answer is then what a first read gives. A read error or a chunk
  // that does not match is the file's own answer, not the descriptor's: it
  // is not read a second time.
  Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool held = false;
    auto file = files_->Get(path, stamp, &held);
    if (!file.ok()) {
      if (file.status().error_number() == ENOENT) return Status::Changed(path + ": source file is gone");
      return file.status();
    }
    s = ReadFrom(**file, path, stamp, chunks, index, dst, len, io);
    if (s.ok()) return s;
    files_->Forget(path, stamp);
    const bool stale = s.code() == Status::Code::kChanged || s.error_number() == ESTALE;
    if (!held || !stale) break;
  }
  return s;
}

Status SourceReader::ReadFrom(KeptSourceFile& file, const std::string& path, const FileStamp& stamp,
                              const std::vector<ChunkHash>& chunks, uint64_t index, uint8_t* dst, size_t len,
                              Io io) {
  const int fd = file.fd();
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
  if (direct) {
    const int direct_fd = file.Direct();
    if (auto from_disk = direct_fd >= 0 ? ReadDirect(direct_fd, offset, dst, len) : std::nullopt) {
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
    if (n == 0) return Status::Changed(path + ": source is shorter than when it was indexed");
    done += static_cast<size_t>(n);
  }
  bytes_read_ += len;
  ++chunks_read_;
  // The stamp after the read: a write that raced with it shows here, and so
  // does a file removed or renamed over since it was opened (its link count,
  // and with it its ctime, changed).
  struct stat st {};
  if (RetryOnEintr([&] { return ::fstat(fd, &st); }) != 0 || FileStamp::FromStat(st) != stamp) {
    return Status::Changed(path + ": source changed while it was read");
  }
  if (HashChunk(dst, len) != chunks[index]) {
    return Status::Corrupt(path + ": chunk " + std::to_string(index) + " (offset " + std::to_string(offset) +
                         ") does not match the index although the file's stamp does");
  }
  return Status::Ok();
}

}  // namespace ckptfs
