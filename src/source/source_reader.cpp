#include "ckptfs/source_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "ckptfs/source_file.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

Status SourceReader::ReadChunk(const std::string& path, const FileStamp& stamp, const std::vector<ChunkHash>& chunks,
                               uint64_t index, uint8_t* dst, size_t len) {
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
  if (::fstat(fd.get(), &st) != 0 || FileStamp::FromStat(st) != stamp) {
    return Status::Changed(path + ": source changed while it was read");
  }
  if (HashChunk(dst, len) != chunks[index]) {
    return Status::Corrupt(path + ": chunk " + std::to_string(index) + " (offset " + std::to_string(offset) +
                         ") does not match the index although the file's stamp does");
  }
  return Status::Ok();
}

}  // namespace ckptfs
