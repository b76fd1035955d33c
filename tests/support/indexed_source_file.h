// A source file on disk with its stamp and chunk table as the index would
// hold them, for tests of the readers of SRC.
#pragma once

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "test_tree.h"

namespace ckptfs::testing {

// A source file of two chunks, the second ending off a page boundary, with
// its stamp and chunk table as the index would hold them.
struct SourceFile {
  explicit SourceFile(const std::string& dir)
      : path(dir + "/model.safetensors"), bytes(RandomBytes(2 * kChunkSize - 5000, 7)) {
    WriteFile(path, bytes);
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    stamp = FileStamp::FromStat(st);
    for (uint64_t c = 0; c < ChunkCount(bytes.size()); ++c) {
      chunks.push_back(HashChunk(bytes.data() + c * kChunkSize, ChunkLen(c)));
    }
  }
  size_t ChunkLen(uint64_t c) const { return std::min<size_t>(kChunkSize, bytes.size() - c * kChunkSize); }
  std::string path;
  std::string bytes;
  FileStamp stamp;
  std::vector<ChunkHash> chunks;
};

}  // namespace ckptfs::testing
