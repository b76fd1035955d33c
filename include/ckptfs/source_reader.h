// SourceReader: fills a cache chunk from the source file and proves it is the
// chunk the index knows before anyone sees it: the file's stamp must still be
// the one it was hashed under, and the chunk's XXH3-128 must equal the chunk
// table's entry.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/status.h"

namespace ckptfs {

class SourceReader {
 public:
  // `root`: the canonical source root every path read lies in (see
  // OpenSourceFile); empty in tests that read loose files.
  explicit SourceReader(std::string root = "") : root_(std::move(root)) {}

  // kChanged: the file's stamp moved (rescan it); kCorrupt: the chunk does
  // not match the index although the stamp does; kError: an I/O error.
  Status ReadChunk(const std::string& path, const FileStamp& stamp, const std::vector<ChunkHash>& chunks,
                   uint64_t index, uint8_t* dst, size_t len);

  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t chunks_read() const { return chunks_read_.load(); }

 private:
  const std::string root_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> chunks_read_{0};
};

}  // namespace ckptfs
