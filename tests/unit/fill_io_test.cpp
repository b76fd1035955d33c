// How fills read the source and write the host tier's copies: O_DIRECT
// reads (SourceReader::Io::kDirect), reading straight into a copy's mapping
// (SealedCopy::WritableAt), and the kernel's huge-page setting for memfds
// (AskForShmemHugePages).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/sealed_copy.h"
#include "ckptfs/source_reader.h"
#include "kernel_tuning.h"
#include "indexed_source_file.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using testing::RandomBytes;
using testing::TempDir;
using testing::WriteFile;

using testing::SourceFile;

std::unique_ptr<uint8_t, decltype(&std::free)> AlignedChunk() {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(SourceReader::kDirectAlignment, kChunkSize));
  std::memset(p, 0xab, kChunkSize);
  return {p, &std::free};
}

class DirectReadTest : public ::testing::Test {
 protected:
  TempDir dir{"ckptfs-direct"};
  SourceFile f{dir.path()};
  SourceReader reader;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf = AlignedChunk();
};

TEST_F(DirectReadTest, ReadsTheVerifiedBytesAndLeavesNothingPastTheEnd) {
  const size_t len = f.ChunkLen(1);
  ASSERT_TRUE(reader.ReadChunk(f.path, f.stamp, f.chunks, 1, buf.get(), len, SourceReader::Io::kDirect).ok());
  EXPECT_EQ(std::memcmp(buf.get(), f.bytes.data() + kChunkSize, len), 0);
  // The block holding the end of the file came whole; what lay past the end
  // in it must not be left in the buffer (it may be a copy's last page).
  const size_t rounded = (len + 4095) / 4096 * 4096;
  for (size_t i = len; i < rounded; ++i) ASSERT_EQ(buf.get()[i], 0) << i;
  EXPECT_EQ(buf.get()[rounded], 0xab);  // and nothing after that block was touched
  // The test directory is on a filesystem with O_DIRECT (ext4 here).
  EXPECT_EQ(reader.direct_bytes_read(), len);
  EXPECT_EQ(reader.direct_reads_refused(), 0u);
}

// On tmpfs (O_DIRECT since Linux 6.6) a direct read copies only up to the
// end of the file and leaves the rest of the buffer as it was, so there the
// zeros past the end are the reader's own doing (on ext4 the block comes
// zeroed from the disk already).
TEST(DirectReadTmpfsTest, WhatLiesPastTheEndIsZeroedByTheReader) {
  TempDir dir("ckptfs-direct-tmpfs");
  ASSERT_EQ(::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=16m"), 0) << std::strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{dir.path()};
  SourceFile f(dir.path());
  SourceReader reader;
  auto buf = AlignedChunk();
  const size_t len = f.ChunkLen(1);
  ASSERT_TRUE(reader.ReadChunk(f.path, f.stamp, f.chunks, 1, buf.get(), len, SourceReader::Io::kDirect).ok());
  ASSERT_EQ(reader.direct_bytes_read(), len) << "tmpfs did not take O_DIRECT";
  EXPECT_EQ(std::memcmp(buf.get(), f.bytes.data() + kChunkSize, len), 0);
  const size_t rounded = (len + 4095) / 4096 * 4096;
  for (size_t i = len; i < rounded; ++i) ASSERT_EQ(buf.get()[i], 0) << i;
}

TEST_F(DirectReadTest, AMisalignedBufferIsReadBufferedAndCounted) {
  ASSERT_TRUE(reader.ReadChunk(f.path, f.stamp, f.chunks, 1, buf.get() + 1, f.ChunkLen(1), SourceReader::Io::kDirect).ok());
  EXPECT_EQ(std::memcmp(buf.get() + 1, f.bytes.data() + kChunkSize, f.ChunkLen(1)), 0);
  EXPECT_EQ(reader.direct_bytes_read(), 0u);
  EXPECT_EQ(reader.direct_reads_refused(), 1u);
}

// kAuto: a chunk in the page cache is read from it, one that is not directly.
TEST_F(DirectReadTest, AutoReadsACachedChunkFromTheCacheAndAnUncachedOneDirectly) {
  const size_t len = f.ChunkLen(1);
  ASSERT_TRUE(reader.ReadChunk(f.path, f.stamp, f.chunks, 1, buf.get(), len, SourceReader::Io::kAuto).ok());
  EXPECT_EQ(std::memcmp(buf.get(), f.bytes.data() + kChunkSize, len), 0);
  EXPECT_EQ(reader.cached_bytes_read(), len);  // just written: all of it cached
  EXPECT_EQ(reader.direct_bytes_read(), 0u);

  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fsync(fd);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  std::memset(buf.get(), 0xab, kChunkSize);
  ASSERT_TRUE(reader.ReadChunk(f.path, f.stamp, f.chunks, 0, buf.get(), kChunkSize, SourceReader::Io::kAuto).ok());
  EXPECT_EQ(std::memcmp(buf.get(), f.bytes.data(), kChunkSize), 0);
  EXPECT_EQ(reader.cached_bytes_read(), len);  // nothing more came from the cache
  EXPECT_EQ(reader.direct_bytes_read(), kChunkSize);
}

TEST_F(DirectReadTest, ADirectReadIsCheckedLikeAnyOther) {
  auto wrong = f.chunks;
  wrong[0] = f.chunks[1];
  Status s = reader.ReadChunk(f.path, f.stamp, wrong, 0, buf.get(), kChunkSize, SourceReader::Io::kDirect);
  EXPECT_EQ(s.code(), Status::Code::kCorrupt) << s.message();
  FileStamp moved = f.stamp;
  moved.mtime_ns += 1;
  s = reader.ReadChunk(f.path, moved, f.chunks, 0, buf.get(), kChunkSize, SourceReader::Io::kDirect);
  EXPECT_EQ(s.code(), Status::Code::kChanged) << s.message();
}

// The flags /proc/self/smaps gives the mapping that begins at `at`.
std::string MappingFlags(const void* at) {
  std::ifstream smaps("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(at));
  bool in_it = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind(start, 0) == 0) in_it = true;
    if (in_it && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(SealedCopyWritableTest, AFillReadsStraightIntoACopyWrittenThroughAMapping) {
  const std::string bytes = RandomBytes(3 * kChunkSize + 5, 9);
  for (auto how : {SealedCopy::WriteBy::kHugePageMapping, SealedCopy::WriteBy::kSmallPageMapping}) {
    auto copy = SealedCopy::Create("ckptfs:test", bytes.size(), how);
    ASSERT_TRUE(copy.ok()) << copy.status().message();
    EXPECT_EQ((*copy)->WritableAt(bytes.size() - 4, 5), nullptr);  // past the end
    // Asked for 2 MiB pages (smaps "hg"), or kept to 4 KiB ones ("nh")
    // whatever shmem_enabled says (a kernel without transparent huge pages
    // has neither flag, nor any huge page to ask for or keep off).
    if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
      const std::string flags = MappingFlags((*copy)->WritableAt(0, 1));
      EXPECT_NE(flags.find(how == SealedCopy::WriteBy::kHugePageMapping ? " hg" : " nh"), std::string::npos) << flags;
    }
    for (uint64_t off = 0; off < bytes.size(); off += kChunkSize) {
      const size_t n = std::min<size_t>(kChunkSize, bytes.size() - off);
      uint8_t* at = (*copy)->WritableAt(off, n);
      ASSERT_NE(at, nullptr);
      std::memcpy(at, bytes.data() + off, n);
    }
    ASSERT_TRUE((*copy)->Seal().ok());
    EXPECT_EQ((*copy)->WritableAt(0, 1), nullptr);  // sealed: nothing may be written
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>((*copy)->data()), bytes.size()) == bytes);
  }

  auto by_pwrite = SealedCopy::Create("ckptfs:test", 10, SealedCopy::WriteBy::kPwrite);
  ASSERT_TRUE(by_pwrite.ok());
  EXPECT_EQ((*by_pwrite)->WritableAt(0, 10), nullptr);  // no mapping to read into
}

// Against a copy of the setting's file (the machine's own is shared with
// every daemon the other tests start).
TEST(ShmemHugePagesTest, TheKernelDefaultBecomesAdviseAndAnyOtherChoiceStays) {
  TempDir thp("ckptfs-thp");
  const std::string path = thp / "shmem_enabled";
  auto set = [&](const std::string& chosen) {
    std::string list;
    for (const char* v : {"always", "within_size", "advise", "never", "deny", "force"}) {
      list += (list.empty() ? "" : " ") + (v == chosen ? "[" + chosen + "]" : std::string(v));
    }
    WriteFile(path, list + "\n");
  };
  auto now = [&] {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };

  set("never");
  auto changed = daemon::AskForShmemHugePages(thp.path());
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_NE(changed->find("to advise"), std::string::npos) << *changed;
  EXPECT_EQ(now(), "advise");  // what a write to the sysfs file says
  set("advise");
  auto again = daemon::AskForShmemHugePages(thp.path());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, "");  // nothing left to do

  for (const char* chosen : {"always", "within_size", "deny", "force"}) {
    set(chosen);
    const std::string before = now();
    auto left = daemon::AskForShmemHugePages(thp.path());
    ASSERT_TRUE(left.ok());
    EXPECT_EQ(*left, "") << chosen;
    EXPECT_EQ(now(), before) << chosen;  // an administrator's choice is not touched
  }
  // A kernel without transparent huge pages: no file, nothing done.
  auto none = daemon::AskForShmemHugePages(thp / "absent");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
}

}  // namespace
}  // namespace ckptfs
