// SourceReader keeps the source files it reads open between chunks
// (OpenSourceFiles), bounded in number and in idle time, and never reads
// through a kept descriptor what the path no longer holds: a file renamed
// over or removed is let go of and its read fails as a first read would.
#include <dirent.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "ckptfs/source_reader.h"
#include "indexed_source_file.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using testing::SourceFile;
using testing::TempDir;
using testing::WriteFile;

// Descriptors of this process open on `path` now.
int DescriptorsOn(const std::string& path) {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (const dirent* e = ::readdir(d)) {
    char target[PATH_MAX];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (path == target || path + " (deleted)" == target) ++n;
  }
  ::closedir(d);
  return n;
}

struct AlignedBuffer {
  AlignedBuffer() : p(static_cast<uint8_t*>(std::aligned_alloc(SourceReader::kDirectAlignment, kChunkSize + 4096))) {}
  ~AlignedBuffer() { std::free(p); }
  uint8_t* p;
};

class KeptOpenSourceTest : public ::testing::Test {
 protected:
  Status Read(SourceReader& reader, const SourceFile& file, uint64_t chunk,
              SourceReader::Io io = SourceReader::Io::kBuffered, size_t misalign = 0) {
    return reader.ReadChunk(file.path, file.stamp, file.chunks, chunk, buf.p + misalign, file.ChunkLen(chunk), io);
  }
  TempDir dir{"ckptfs-kept-open"};
  SourceFile f{dir.path()};
  AlignedBuffer buf;
};

TEST_F(KeptOpenSourceTest, AFileReadChunkAfterChunkIsOpenedOnce) {
  SourceReader reader;
  for (uint64_t c : {0, 1, 0, 1}) ASSERT_TRUE(Read(reader, f, c).ok());
  EXPECT_EQ(std::memcmp(buf.p, f.bytes.data() + kChunkSize, f.ChunkLen(1)), 0);
  EXPECT_EQ(reader.source_opens(), 1u);
  EXPECT_EQ(reader.source_files_open(), 1u);
  EXPECT_EQ(DescriptorsOn(f.path), 1);
}

TEST_F(KeptOpenSourceTest, AFileRenamedOverIsNotReadThroughTheOldDescriptor) {
  SourceReader reader;
  ASSERT_TRUE(Read(reader, f, 0).ok());
  // The same bytes under a new inode: the old one still matches its stamp
  // and chunk table, but the path no longer holds it.
  WriteFile(dir / "new", f.bytes);
  ASSERT_EQ(::rename((dir / "new").c_str(), f.path.c_str()), 0);
  const Status s = Read(reader, f, 1);
  EXPECT_EQ(s.code(), Status::Code::kChanged) << s.message();
  EXPECT_EQ(reader.source_files_open(), 0u);
  EXPECT_EQ(reader.source_opens(), 2u);  // opened again by path, as a first read
}

TEST_F(KeptOpenSourceTest, ARemovedFileIsLetGoOf) {
  SourceReader reader;
  ASSERT_TRUE(Read(reader, f, 0).ok());
  ASSERT_EQ(::unlink(f.path.c_str()), 0);
  const Status s = Read(reader, f, 1);
  EXPECT_EQ(s.code(), Status::Code::kChanged) << s.message();
  EXPECT_EQ(reader.source_files_open(), 0u);
  EXPECT_EQ(DescriptorsOn(f.path), 0);  // its blocks are not held
}

// The file itself is untouched (same inode, same stamp): only a directory
// on its path moved, out of the source root. A fresh open would fail; so
// must a read through the kept descriptor.
TEST_F(KeptOpenSourceTest, AFileWhoseDirectoryMovesOutOfTheRootIsLetGoOf) {
  TempDir root("ckptfs-kept-open-root"), outside("ckptfs-kept-open-outside");
  SourceFile g(root / "ckpt");
  SourceReader reader(root.path());
  ASSERT_TRUE(Read(reader, g, 0).ok());
  ASSERT_EQ(reader.source_files_open(), 1u);
  ASSERT_EQ(::rename((root / "ckpt").c_str(), (outside / "ckpt").c_str()), 0);
  const Status s = Read(reader, g, 1);
  EXPECT_EQ(s.code(), Status::Code::kChanged) << s.message();
  EXPECT_EQ(reader.source_files_open(), 0u);
  EXPECT_EQ(DescriptorsOn(outside / "ckpt/model.safetensors"), 0);
}

// A chunk that does not match is the file's answer, not a stale
// descriptor's: it is not read a second time through a fresh open.
TEST_F(KeptOpenSourceTest, AChunkThatDoesNotMatchIsReadOnce) {
  SourceReader reader;
  ASSERT_TRUE(Read(reader, f, 0).ok());
  SourceFile wrong = f;
  wrong.chunks[1][0] ^= 1;
  const Status s = Read(reader, wrong, 1);
  EXPECT_EQ(s.code(), Status::Code::kCorrupt) << s.message();
  EXPECT_EQ(reader.chunks_read(), 2u);
  EXPECT_EQ(reader.source_opens(), 1u);
}

// Out of descriptors, the path cannot be checked: that read fails, and the
// kept file stays (nothing says it changed), to serve the next read.
TEST_F(KeptOpenSourceTest, APathThatCannotBeCheckedFailsTheReadAndKeepsTheFile) {
  SourceReader reader;
  ASSERT_TRUE(Read(reader, f, 0).ok());
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  struct rlimit none = saved;
  none.rlim_cur = static_cast<rlim_t>(lowest_free);  // no new descriptor can be made
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &none), 0);
  const Status s = Read(reader, f, 1);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), Status::Code::kChanged) << s.message();
  EXPECT_EQ(reader.source_files_open(), 1u);
  ASSERT_TRUE(Read(reader, f, 1).ok());
  EXPECT_EQ(reader.source_opens(), 1u);
}

TEST_F(KeptOpenSourceTest, AFileNobodyReadsIsClosedAfterTheIdleTime) {
  SourceReader reader("", SourceReader::kKeptOpen, std::chrono::milliseconds(50));
  ASSERT_TRUE(Read(reader, f, 0).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  // The descriptor is closed just after the entry goes (outside the lock).
  while ((reader.source_files_open() > 0 || DescriptorsOn(f.path) > 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(reader.source_files_open(), 0u);
  EXPECT_EQ(DescriptorsOn(f.path), 0);
}

TEST_F(KeptOpenSourceTest, AtMostTheBoundIsKeptAndTheLeastRecentlyReadGoesFirst) {
  TempDir other_a("ckptfs-kept-open-a"), other_b("ckptfs-kept-open-b");
  SourceFile a(other_a.path()), b(other_b.path());
  SourceReader reader("", /*kept_open=*/2, std::chrono::hours(1));
  ASSERT_TRUE(Read(reader, f, 0).ok());
  ASSERT_TRUE(Read(reader, a, 0).ok());
  ASSERT_TRUE(Read(reader, f, 1).ok());  // f is now the most recent
  ASSERT_TRUE(Read(reader, b, 0).ok());  // closes a
  EXPECT_EQ(reader.source_files_open(), 2u);
  EXPECT_EQ(DescriptorsOn(a.path), 0);
  EXPECT_EQ(DescriptorsOn(f.path), 1);
  ASSERT_TRUE(Read(reader, f, 0).ok());
  EXPECT_EQ(reader.source_opens(), 3u);
  ASSERT_TRUE(Read(reader, a, 1).ok());
  EXPECT_EQ(reader.source_opens(), 4u);
}

// A kept descriptor is shared by every reader of the file: direct reads use
// a descriptor of their own, so a buffered read into a misaligned buffer is
// never made with O_DIRECT by a direct reader beside it.
TEST_F(KeptOpenSourceTest, DirectAndBufferedReadersOfOneFileDoNotShareFlags) {
  SourceReader reader;
  // Opened once before the two start, so that both use the one kept file
  // (two first reads at once may each open it; the second open is let go).
  ASSERT_TRUE(Read(reader, f, 0).ok());
  int failures = 0;
  std::thread direct([&] {
    AlignedBuffer mine;
    for (int i = 0; i < 300; ++i) {
      if (!reader.ReadChunk(f.path, f.stamp, f.chunks, 0, mine.p, f.ChunkLen(0), SourceReader::Io::kDirect).ok()) {
        ++failures;
      }
    }
  });
  int buffered_failures = 0;
  for (int i = 0; i < 300; ++i) {
    if (!Read(reader, f, 1, SourceReader::Io::kBuffered, /*misalign=*/1).ok()) ++buffered_failures;
  }
  direct.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(buffered_failures, 0);
  EXPECT_GT(reader.direct_bytes_read(), 0u);  // ext4 here takes O_DIRECT
  EXPECT_EQ(reader.source_opens(), 1u);
}

}  // namespace
}  // namespace ckptfs
