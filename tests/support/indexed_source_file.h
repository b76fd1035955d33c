// Source files on disk with their stamp and chunk table as the index would
// hold them, for tests of the readers of SRC.
#pragma once

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/file_hasher.h"
#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/view.h"
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

// The SHA-256 chain (ChunkChain) of `bytes`, taken here apart from the
// FileHasher, so that a test can vouch for bytes other than those on disk.
inline ChunkChain ChainOfBytes(const std::string& bytes) {
  ChunkChain chain;
  Sha256 running;
  for (uint64_t c = 0; c + 1 < ChunkCount(bytes.size()); ++c) {
    running.Update(bytes.data() + c * kChunkSize, kChunkSize);
    chain.push_back(running.State());
  }
  return chain;
}

// `bytes` written to `path`, and the file node the view holds for it once
// indexed (hashed for real) into checkpoint `digest`.
inline View::NodePtr IndexedFileNode(const std::string& path, const std::string& bytes, const std::string& digest,
                                     ThreadPool* pool) {
  WriteFile(path, bytes);
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  auto node = std::make_shared<View::Node>();
  node->kind = View::Kind::kFile;
  node->source_path = path;
  node->stamp = FileStamp::FromStat(st);
  node->size = bytes.size();
  node->safetensors = path.ends_with(".safetensors");
  node->digest = digest;
  auto hashes = FileHasher(pool).Hash(path, node->stamp);
  EXPECT_TRUE(hashes.ok()) << hashes.status().message();
  if (hashes.ok()) {
    node->sha256 = hashes->sha256;
    node->chunks = std::make_shared<const std::vector<ChunkHash>>(hashes->chunks);
  }
  return node;
}

}  // namespace ckptfs::testing
