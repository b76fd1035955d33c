// The single read pass: SHA-256 and chunk table, and refusal of files that
// change while they are read.
#include "ckptfs/file_hasher.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_tree.h"

namespace ckptfs::testing {
namespace {

FileStamp StampOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return FileStamp::FromStat(st);
}

class FileHasherTest : public ::testing::Test {
 protected:
  TempDir dir_;
  ThreadPool pool_{2};
};

TEST_F(FileHasherTest, HashesMatchWholeFileDigests) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, kChunkSize, 3 * kChunkSize + 7}) {
    const std::string path = dir_ / ("f" + std::to_string(size));
    const std::string bytes = RandomBytes(size, size);
    WriteFile(path, bytes);
    auto h = FileHasher(&pool_).Hash(path, StampOf(path));
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_EQ(h->sha256, Sha256Of(bytes)) << size;
    ASSERT_EQ(h->chunks.size(), ChunkCount(size));
    for (uint64_t i = 0; i < h->chunks.size(); ++i) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, size - i * kChunkSize));
      EXPECT_EQ(h->chunks[i], HashChunk(bytes.data() + i * kChunkSize, len)) << "chunk " << i;
    }
  }
}

TEST_F(FileHasherTest, SameAnswerWithoutHelperPool) {
  const std::string path = dir_ / "f";
  WriteFile(path, RandomBytes(2 * kChunkSize + 5, 3));
  auto a = FileHasher(&pool_).Hash(path, StampOf(path));
  auto b = FileHasher(nullptr).Hash(path, StampOf(path));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sha256, b->sha256);
  EXPECT_EQ(a->chunks, b->chunks);
}

TEST_F(FileHasherTest, TruncatedWhileHashedAsksForRetry) {
  const std::string path = dir_ / "f";
  WriteFile(path, RandomBytes(4 * kChunkSize, 1));
  FileHasher hasher(&pool_);
  hasher.set_chunk_read_hook([](const std::string& p, uint64_t i) {
    if (i == 0) {
      ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(kChunkSize + 10)), 0);
    }
  });
  auto h = hasher.Hash(path, StampOf(dir_ / "f"));
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(h.status().is_changed());
  EXPECT_NE(h.status().message().find(path), std::string::npos);
  EXPECT_NE(h.status().message().find("truncated"), std::string::npos);
}

TEST_F(FileHasherTest, GrownWhileHashedAsksForRetry) {
  const std::string path = dir_ / "f";
  WriteFile(path, RandomBytes(2 * kChunkSize, 1));
  FileHasher hasher(&pool_);
  hasher.set_chunk_read_hook([](const std::string& p, uint64_t i) {
    if (i == 1) {
      ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(3 * kChunkSize)), 0);
    }
  });
  auto h = hasher.Hash(path, StampOf(path));
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(h.status().is_changed()) << h.status().message();
}

TEST_F(FileHasherTest, RewrittenInPlaceWhileHashedAsksForRetry) {
  const std::string path = dir_ / "f";
  WriteFile(path, RandomBytes(2 * kChunkSize, 1));
  FileHasher hasher(&pool_);
  hasher.set_chunk_read_hook([](const std::string& p, uint64_t i) {
    if (i == 0) {
      FILE* f = std::fopen(p.c_str(), "r+b");
      std::fwrite("X", 1, 1, f);  // same size, new content
      std::fclose(f);
    }
  });
  auto h = hasher.Hash(path, StampOf(path));
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(h.status().is_changed()) << h.status().message();
}

TEST_F(FileHasherTest, StaleStampIsRefusedBeforeReading) {
  const std::string path = dir_ / "f";
  WriteFile(path, "one");
  FileStamp old = StampOf(path);
  WriteFile(path, "two, longer");
  auto h = FileHasher(&pool_).Hash(path, old);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(h.status().is_changed());
}

TEST_F(FileHasherTest, MissingFileIsAnErrorNamingIt) {
  auto h = FileHasher(&pool_).Hash(dir_ / "gone", FileStamp{});
  ASSERT_FALSE(h.ok());
  EXPECT_FALSE(h.status().is_changed());
  EXPECT_NE(h.status().message().find(dir_ / "gone"), std::string::npos);
  EXPECT_NE(h.status().message().find("No such file"), std::string::npos);
}

}  // namespace
}  // namespace ckptfs::testing
