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
#include "source_file.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

static_assert(SourceReader::kDirectAlignment == kDirectReadAlignment);

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
