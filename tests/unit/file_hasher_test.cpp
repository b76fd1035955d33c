// The single read pass: SHA-256 and chunk table, and refusal of files that
// change while they are read.
#include "ckptfs/file_hasher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "ckptfs/file_cache.h"
#include "ckptfs/host_tier_fill.h"
#include "ckptfs/unique_fd.h"
#include "test_tree.h"

namespace ckptfs::testing {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

FileStamp StampOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return FileStamp::FromStat(st);
}

// Bytes this process has read with read(2) and pread(2), cache hits included.
uint64_t BytesReadByThisProcess() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

std::string Sha256sumOf(const std::string& path) {
  return RunCommand("sha256sum " + ShellQuote(path)).out.substr(0, 64);
}

// A file of `size` bytes that is mostly holes: data at its start, at an
// offset no chunk or page is aligned to, and just before its last chunk,
// which stays a hole. False when the filesystem cannot say where holes are.
bool WriteSparseFile(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) return false;
  const std::string a = RandomBytes(100, 1), b = RandomBytes(kMiB + 3, 2), c = RandomBytes(10, 3);
  const uint64_t at_b = 5 * kChunkSize + 123, at_c = size - kChunkSize - 10;
  bool ok = ::pwrite(fd, a.data(), a.size(), 0) == static_cast<ssize_t>(a.size()) &&
            ::pwrite(fd, b.data(), b.size(), static_cast<off_t>(at_b)) == static_cast<ssize_t>(b.size()) &&
            ::pwrite(fd, c.data(), c.size(), static_cast<off_t>(at_c)) == static_cast<ssize_t>(c.size());
  ok = ok && ::fsync(fd) == 0 && ::lseek(fd, 0, SEEK_HOLE) < static_cast<off_t>(size);
  ::close(fd);
  return ok;
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

// The chain taken in the hashing pass: one state per chunk but the last,
// each chunk fitting it alone, and no other bytes (ChunkChain).
TEST_F(FileHasherTest, TheChainProvesEachChunkAloneAndNothingElse) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, kChunkSize, 3 * kChunkSize + 7}) {
    SCOPED_TRACE(size);
    const std::string path = dir_ / ("f" + std::to_string(size));
    const std::string bytes = RandomBytes(size, size + 1);
    WriteFile(path, bytes);
    auto h = FileHasher(&pool_).Hash(path, StampOf(path));
    ASSERT_TRUE(h.ok()) << h.status().message();
    ASSERT_TRUE(h->chain.has_value());
    ASSERT_EQ(h->chain->size(), size > 0 ? ChunkCount(size) - 1 : 0);
    for (uint64_t i = 0; i < ChunkCount(size); ++i) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, size - i * kChunkSize));
      std::string chunk = bytes.substr(i * kChunkSize, len);
      EXPECT_TRUE(ChunkFitsChain(h->sha256, size, *h->chain, i, chunk.data(), len)) << "chunk " << i;
      chunk[len / 2] ^= 1;
      EXPECT_FALSE(ChunkFitsChain(h->sha256, size, *h->chain, i, chunk.data(), len))
          << "chunk " << i << ", a bit flipped";
    }
    if (ChunkCount(size) < 2) continue;
    // A chunk offered at another place, or cut short, or checked against a
    // chain of another length, does not fit.
    EXPECT_FALSE(ChunkFitsChain(h->sha256, size, *h->chain, 1, bytes.data(), kChunkSize));
    EXPECT_FALSE(ChunkFitsChain(h->sha256, size, *h->chain, 0, bytes.data(), kChunkSize - 64));
    ChunkChain shorter(h->chain->begin(), h->chain->end() - 1);
    EXPECT_FALSE(ChunkFitsChain(h->sha256, size, shorter, 0, bytes.data(), kChunkSize));
    // Resumed from a state of the chain, SHA-256 ends where the whole does.
    Sha256 resumed;
    ASSERT_TRUE(resumed.Resume((*h->chain)[1], 2 * kChunkSize));
    EXPECT_FALSE(Sha256().Resume((*h->chain)[1], 2 * kChunkSize + 3));
    resumed.Update(bytes.data() + 2 * kChunkSize, size - 2 * kChunkSize);
    EXPECT_EQ(resumed.Finish(), Sha256Of(bytes));
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
  EXPECT_EQ(a->chain, b->chain);
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

// Issue 21 item 4: a chunk wholly in a hole is not read (its zeros are
// hashed from memory), and the file's SHA-256 is still the plain SHA-256 of
// its bytes, as sha256sum prints it; the chunk table too is that of the bytes.
TEST_F(FileHasherTest, HolesAreHashedWithoutBeingReadAndTheSha256IsSha256sums) {
  const std::string path = dir_ / "sparse.bin";
  const uint64_t size = 1ull << 30;
  if (!WriteSparseFile(path, size)) GTEST_SKIP() << "this filesystem does not report holes";
  const uint64_t before = BytesReadByThisProcess();
  auto h = FileHasher(&pool_).Hash(path, StampOf(path));
  const uint64_t read = BytesReadByThisProcess() - before;
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(ToHex(h->sha256), Sha256sumOf(path));
  // The three chunks that hold data (the middle piece spans two), not 1 GiB.
  EXPECT_LE(read, 4 * kChunkSize + 1) << "bytes read to hash a 1 GiB file with 1 MiB of data";
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::string chunk(kChunkSize, '\0');
  for (uint64_t i = 0; i < h->chunks.size(); ++i) {
    ASSERT_EQ(::pread(fd, chunk.data(), kChunkSize, static_cast<off_t>(i * kChunkSize)), static_cast<ssize_t>(kChunkSize));
    ASSERT_EQ(h->chunks[i], HashChunk(chunk.data(), kChunkSize)) << "chunk " << i;
  }
  ::close(fd);
}

// A task that yields after every chunk lets go of its descriptor each time,
// opens the file again when resumed, and ends with the same hashes.
TEST_F(FileHasherTest, ATaskThatYieldsBetweenChunksEndsWithTheSameHashes) {
  const std::string path = dir_ / "f";
  WriteFile(path, RandomBytes(5 * kChunkSize + 9, 4));
  const FileHasher hasher(&pool_);
  auto whole = hasher.Hash(path, StampOf(path));
  ASSERT_TRUE(whole.ok());
  auto task = hasher.Start(path, StampOf(path), {});
  int pauses = 0;
  const uint64_t opened = FileHasher::files_opened();
  while (!task->Run([] { return true; })) ++pauses;
  EXPECT_EQ(pauses, 5);
  EXPECT_EQ(FileHasher::files_opened() - opened, 6u);
  auto resumed = task->TakeResult();
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(resumed->sha256, whole->sha256);
  EXPECT_EQ(resumed->chunks, whole->chunks);
  EXPECT_EQ(resumed->chain, whole->chain);
}

// A file replaced while its task is paused is refused when it resumes.
TEST_F(FileHasherTest, AFileChangedWhilePausedIsRefusedWhenResumed) {
  const std::string path = dir_ / "f";
  WriteFile(path, RandomBytes(3 * kChunkSize, 5));
  const FileHasher hasher(&pool_);
  auto task = hasher.Start(path, StampOf(path), {});
  ASSERT_FALSE(task->Run([] { return true; }));
  WriteFile(path, RandomBytes(3 * kChunkSize, 6));
  while (!task->Run([] { return true; })) {
  }
  auto h = task->TakeResult();
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(h.status().is_changed()) << h.status().message();
}

// fill_on_index: the copy the hasher fills is resident under the file's
// SHA-256 once hashed, byte for byte; one of a file that changed while it
// was read is never published, and its room is given back.
TEST_F(FileHasherTest, TheCopyFilledFromTheHashedBytesIsPublishedOnlyForAnUnchangedFile) {
  FileCache cache(64 * kMiB);
  HostTierFill fills(&cache, HostTierFill::Policy::kFree, false);
  const FileHasher hasher(&pool_);
  const std::string path = dir_ / "f";
  const std::string bytes = RandomBytes(2 * kChunkSize + 77, 7);
  WriteFile(path, bytes);
  FileHasher::TaskOptions extra;
  extra.copy = fills.Begin("f", StampOf(path));
  ASSERT_NE(extra.copy, nullptr);
  auto task = hasher.Start(path, StampOf(path), std::move(extra));
  task->Run();
  auto h = task->TakeResult();
  ASSERT_TRUE(h.ok()) << h.status().message();
  auto copy = cache.Find({h->sha256, ""});
  ASSERT_NE(copy, nullptr);
  ASSERT_EQ(copy->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(copy->data()), copy->size()), bytes);
  EXPECT_EQ(fills.GetStats().fills, 1u);

  const std::string other = dir_ / "g";
  WriteFile(other, RandomBytes(2 * kChunkSize, 8));
  FileHasher changing(&pool_);
  changing.set_chunk_read_hook([](const std::string& p, uint64_t i) {
    if (i == 1) WriteFile(p, RandomBytes(2 * kChunkSize, 9));
  });
  FileHasher::TaskOptions extra2;
  extra2.copy = fills.Begin("g", StampOf(other));
  auto task2 = changing.Start(other, StampOf(other), std::move(extra2));
  task2->Run();
  EXPECT_FALSE(task2->TakeResult().ok());
  EXPECT_EQ(cache.GetStats().files, 1u);
  EXPECT_EQ(cache.GetStats().filling, 0u);
  EXPECT_EQ(fills.GetStats().abandoned, 1u);
}

// A HashCopy that keeps what is written into it in memory, and which thread
// wrote each range; refuses the write at `fail_at` when asked to.
class RecordingCopy : public HashCopy {
 public:
  struct Log {
    std::mutex mu;
    std::string bytes;
    std::vector<std::pair<uint64_t, std::thread::id>> writes;  // offset, writer
    bool published = false;
    FileHashes hashes;
  };
  RecordingCopy(Log& log, uint64_t size, uint64_t fail_at = UINT64_MAX) : log_(log), fail_at_(fail_at) {
    log_.bytes.assign(size, '\0');
  }
  uint8_t* WritableAt(uint64_t, size_t) override { return nullptr; }
  Status Write(uint64_t offset, const uint8_t* data, size_t len) override {
    std::lock_guard<std::mutex> lock(log_.mu);
    log_.writes.emplace_back(offset, std::this_thread::get_id());
    if (offset == fail_at_) return Status::Full("refused by the test");
    log_.bytes.replace(offset, len, reinterpret_cast<const char*>(data), len);
    return Status::Ok();
  }
  void Publish(const FileHashes& hashes) override {
    std::lock_guard<std::mutex> lock(log_.mu);
    log_.published = true;
    log_.hashes = hashes;
  }

 private:
  Log& log_;
  const uint64_t fail_at_;
};

// Issue 20 item 4: the copy of a large file is written by the I/O threads
// that read its chunks, not by the thread that runs SHA-256 in file order,
// so copying into fresh memory overlaps SHA-256 instead of adding to it.
// Every chunk is written once, with the bytes that were hashed; a write that
// fails leaves the copy unpublished and the hashes as they are.
TEST_F(FileHasherTest, TheCopyIsWrittenByTheReadersOverlappingSha256) {
  const std::string path = dir_ / "f";
  const std::string bytes = RandomBytes(6 * kChunkSize + 1234, 21);
  WriteFile(path, bytes);
  const FileHasher hasher(&pool_);
  RecordingCopy::Log log;
  FileHasher::TaskOptions extra;
  extra.copy = std::make_unique<RecordingCopy>(log, bytes.size());
  auto task = hasher.Start(path, StampOf(path), std::move(extra));
  task->Run();  // SHA-256 runs here, on this thread
  auto h = task->TakeResult();
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->sha256, Sha256Of(bytes));
  ASSERT_TRUE(log.published);
  EXPECT_EQ(log.hashes.sha256, h->sha256);
  EXPECT_TRUE(log.bytes == bytes) << "the copy differs from the file";
  ASSERT_EQ(log.writes.size(), ChunkCount(bytes.size()));
  std::set<uint64_t> offsets;
  for (const auto& [offset, writer] : log.writes) {
    offsets.insert(offset);
    EXPECT_NE(writer, std::this_thread::get_id()) << "chunk at " << offset << " was copied by the SHA-256 thread";
  }
  EXPECT_EQ(offsets.size(), log.writes.size()) << "a chunk was written twice";

  RecordingCopy::Log failed;
  FileHasher::TaskOptions extra2;
  extra2.copy = std::make_unique<RecordingCopy>(failed, bytes.size(), 2 * kChunkSize);
  auto task2 = hasher.Start(path, StampOf(path), std::move(extra2));
  task2->Run();
  auto h2 = task2->TakeResult();
  ASSERT_TRUE(h2.ok()) << h2.status().message();
  EXPECT_EQ(h2->sha256, Sha256Of(bytes));
  EXPECT_FALSE(failed.published) << "a copy with a failed write was published";
}

// The share of `path` in the page cache (mincore of a mapping of it).
double CachedShareOf(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size == 0) return -1;
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const size_t pages = (static_cast<size_t>(st.st_size) + 4095) / 4096;
  std::vector<unsigned char> in(pages);
  const bool ok = ::mincore(p, static_cast<size_t>(st.st_size), in.data()) == 0;
  ::munmap(p, static_cast<size_t>(st.st_size));
  if (!ok) return -1;
  size_t cached = 0;
  for (unsigned char c : in) cached += c & 1;
  return static_cast<double>(cached) / static_cast<double>(pages);
}

void DropFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Issue 20 item 3: a file not in the page cache is read once from the disk
// straight into where it is hashed and copied (O_DIRECT), and leaves the
// page cache as it was; a file in the page cache is read from there. The
// copy and the hashes are the same either way.
TEST_F(FileHasherTest, AColdFileIsReadAroundThePageCacheAndAWarmOneFromIt) {
  const std::string path = dir_ / "f";
  struct statfs fs {};
  ASSERT_EQ(::statfs(dir_.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << dir_.path() << " is a tmpfs: no disk to read around the page cache";
  const std::string bytes = RandomBytes(3 * kChunkSize + 4097, 17);
  WriteFile(path, bytes);
  FileCache cache(64 * kMiB);
  HostTierFill fills(&cache, HostTierFill::Policy::kFree, false);
  const FileHasher hasher(&pool_);
  // Held open throughout: another test's drop of unused inodes (ctest runs
  // two at once) would take the warm file's pages with its inode.
  UniqueFd held(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(held.valid());
  for (const bool cold : {true, false}) {
    if (cold) {
      DropFromPageCache(path);
      ASSERT_LT(CachedShareOf(path), 0.05) << "the kernel kept the file cached";
    } else {
      ASSERT_EQ(RunCommand("cat " + ShellQuote(path) + " >/dev/null").exit_code, 0);
      ASSERT_GT(CachedShareOf(path), 0.95);
    }
    cache.Evict(Sha256Of(bytes));
    FileHasher::TaskOptions extra;
    extra.copy = fills.Begin("f", StampOf(path));
    ASSERT_NE(extra.copy, nullptr);
    const uint64_t direct_before = FileHasher::direct_bytes_read();
    auto task = hasher.Start(path, StampOf(path), std::move(extra));
    task->Run();
    auto h = task->TakeResult();
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_EQ(h->sha256, Sha256Of(bytes));
    for (uint64_t i = 0; i < h->chunks.size(); ++i) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunkSize, bytes.size() - i * kChunkSize));
      EXPECT_EQ(h->chunks[i], HashChunk(bytes.data() + i * kChunkSize, len)) << "chunk " << i;
    }
    auto copy = cache.Find({h->sha256, ""});
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(copy->data()), copy->size()), bytes);
    const uint64_t direct = FileHasher::direct_bytes_read() - direct_before;
    if (cold) {
      EXPECT_EQ(direct, bytes.size());
      EXPECT_LT(CachedShareOf(path), 0.05) << "the cold file was read through the page cache";
    } else {
      EXPECT_EQ(direct, 0u);
    }
  }
  held.reset();
  // And without a copy (ckptfsctl digest), into the hasher's own buffers.
  DropFromPageCache(path);
  const uint64_t direct_before = FileHasher::direct_bytes_read();
  auto h = hasher.Hash(path, StampOf(path));
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->sha256, Sha256Of(bytes));
  EXPECT_EQ(FileHasher::direct_bytes_read() - direct_before, bytes.size());
}

// Only free room: a copy that would need an eviction is not made, and what
// is resident stays.
TEST_F(FileHasherTest, ACopyAtIndexingNeverEvictsWhatIsResident) {
  FileCache cache(8 * kMiB);
  auto claim = cache.Claim({Sha256Of("resident"), ""}, 6 * kMiB, false, true);
  ASSERT_TRUE(claim.ok() && claim->fill);
  auto resident = SealedCopy::Create("resident", 6 * kMiB);
  ASSERT_TRUE(resident.ok() && (*resident)->Seal().ok());
  cache.Publish(std::move(claim->fill), std::move(*resident));
  HostTierFill fills(&cache, HostTierFill::Policy::kFree, false);
  FileStamp stamp{1, 2, 4 * kMiB, 3, 4};
  EXPECT_EQ(fills.Begin("big.bin", stamp), nullptr);
  EXPECT_EQ(fills.GetStats().skipped, 1u);
  EXPECT_NE(cache.Find({Sha256Of("resident"), ""}), nullptr);
  stamp.size = kMiB;
  EXPECT_NE(fills.Begin("small.bin", stamp), nullptr);  // fits in what is free
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
