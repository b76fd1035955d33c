// The host tier's bookkeeping (FileCache) and its sealed memfds (SealedCopy).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/file_cache.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMiB = 1 << 20;

FileKey Key(int n, const std::string& form = "") {
  FileKey k;
  k.sha256[0] = static_cast<uint8_t>(n);
  k.form = form;
  return k;
}

std::unique_ptr<SealedCopy> SealedOf(uint64_t size, char fill,
                                     SealedCopy::WriteBy how = SealedCopy::PreferredWrite()) {
  auto copy = SealedCopy::Create("ckptfs:test", size, how);
  EXPECT_TRUE(copy.ok()) << copy.status().message();
  EXPECT_TRUE((*copy)->Write(0, reinterpret_cast<const uint8_t*>(std::string(size, fill).data()), size).ok());
  EXPECT_TRUE((*copy)->Seal().ok());
  return std::move(*copy);
}

// Fills `key` with `size` bytes; the copy, or null when refused.
FileCache::CopyPtr Fill(FileCache& cache, const FileKey& key, uint64_t size, bool pin = false) {
  auto claim = cache.Claim(key, size, pin, /*wait=*/true);
  if (!claim.ok()) return nullptr;
  if (claim->resident) return claim->resident;
  return cache.Publish(std::move(claim->fill), SealedOf(size, 'x', SealedCopy::PreferredWriteFor(size)));
}

// Where a first touch of fresh memory is slow (a VM whose balloon device
// reports free pages to its host) copies are written in 4 KiB pages.
TEST(SealedCopyTest, FreePageReportingIsReadFromSysfs) {
  namespace fs = std::filesystem;
  const fs::path sys = fs::temp_directory_path() / ("ckptfs-sys-" + std::to_string(::getpid()));
  auto write = [&](const std::string& rel, const std::string& text) {
    fs::create_directories((sys / rel).parent_path());
    std::ofstream(sys / rel) << text;
  };
  EXPECT_FALSE(SealedCopy::FreePageReporting(sys.string()));  // no page_reporting in the kernel
  write("module/page_reporting/parameters/page_reporting_order", "9\n");
  EXPECT_FALSE(SealedCopy::FreePageReporting(sys.string()));  // and no balloon
  write("bus/virtio/drivers/virtio_balloon/virtio0/features", "0110000000000000\n");
  EXPECT_FALSE(SealedCopy::FreePageReporting(sys.string()));  // a balloon without reporting
  write("bus/virtio/drivers/virtio_balloon/virtio0/features", "0110010100000000\n");
  EXPECT_TRUE(SealedCopy::FreePageReporting(sys.string()));
  // An order past the buddy allocator's reports nothing (how an operator
  // turns reporting off).
  write("module/page_reporting/parameters/page_reporting_order", "11\n");
  EXPECT_FALSE(SealedCopy::FreePageReporting(sys.string()));
  fs::remove_all(sys);
  // And the copies of this machine follow what its own sysfs says.
  if (SealedCopy::FreshMemoryIsSlow()) {
    EXPECT_EQ(SealedCopy::PreferredWrite(), SealedCopy::WriteBy::kSmallPageMapping);
  }
}

TEST(SealedCopyTest, NobodyCanChangeASealedCopy) {
  auto copy = SealedOf(3 * kMiB + 5, 'a');
  const int seals = ::fcntl(copy->fd(), F_GET_SEALS);
  EXPECT_EQ(seals, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_EQ(copy->data()[3 * kMiB + 4], 'a');
  EXPECT_TRUE(copy->readers_visible());
  EXPECT_EQ(::fcntl(copy->fd(), F_GETFL) & O_ACCMODE, O_RDONLY);  // what the kernel is given: read-only
  // Reopened for writing through /proc, as root in another process could,
  // it is still unwritable: the seals refuse.
  const int again = ::open(("/proc/self/fd/" + std::to_string(copy->fd())).c_str(), O_RDWR);
  ASSERT_GE(again, 0);
  EXPECT_EQ(::pwrite(again, "b", 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(again, 1), 0);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0), MAP_FAILED);
  EXPECT_NE(::fcntl(again, F_ADD_SEALS, 0), 0);  // F_SEAL_SEAL: the seals are final
  ::close(again);
  EXPECT_EQ(copy->Lock(), 0);
  copy->Unlock();
}

// Every way of filling (pwrite, or a mapping of huge pages under
// shmem_enabled "advise" or of 4 KiB pages) gives the same sealed bytes.
TEST(SealedCopyTest, EitherWayOfWritingGivesTheSameSealedCopy) {
  for (auto how : {SealedCopy::WriteBy::kPwrite, SealedCopy::WriteBy::kHugePageMapping, SealedCopy::WriteBy::kSmallPageMapping}) {
    auto copy = SealedCopy::Create("ckptfs:test", 5 * kMiB + 3, how);
    ASSERT_TRUE(copy.ok()) << copy.status().message();
    std::string bytes(5 * kMiB + 3, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
    ASSERT_TRUE((*copy)->Write(0, reinterpret_cast<const uint8_t*>(bytes.data()), 3 * kMiB).ok());
    ASSERT_TRUE((*copy)->Write(3 * kMiB, reinterpret_cast<const uint8_t*>(bytes.data()) + 3 * kMiB, 2 * kMiB + 3).ok());
    EXPECT_FALSE((*copy)->Write(5 * kMiB, reinterpret_cast<const uint8_t*>(bytes.data()), 4).ok());  // past the end
    ASSERT_TRUE((*copy)->Seal().ok());
    EXPECT_EQ(::fcntl((*copy)->fd(), F_GET_SEALS), F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>((*copy)->data()), bytes.size()) == bytes);
    EXPECT_FALSE((*copy)->Write(0, reinterpret_cast<const uint8_t*>(bytes.data()), 1).ok());  // sealed
  }
}

TEST(SealedCopyTest, EmptyFilesHaveACopyToo) {
  auto copy = SealedOf(0, 'a');
  EXPECT_EQ(copy->size(), 0u);
  EXPECT_EQ(::fcntl(copy->fd(), F_GET_SEALS), F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
}

TEST(FileCacheTest, SmallFilesCostAPageAndTheBudgetHolds) {
  FileCache cache(4 * kMiB);
  ASSERT_TRUE(Fill(cache, Key(1), 2));
  EXPECT_EQ(cache.GetStats().used, PageBytes(2));
  EXPECT_EQ(PageBytes(2), static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  ASSERT_TRUE(Fill(cache, Key(2), 3 * kMiB));
  // A third file evicts the least recently used unpinned one.
  EXPECT_TRUE(cache.Find(Key(1)));  // 1 is now newer than 2
  ASSERT_TRUE(Fill(cache, Key(3), 2 * kMiB));
  EXPECT_TRUE(cache.Find(Key(1)));
  EXPECT_FALSE(cache.Find(Key(2)));
  const auto s = cache.GetStats();
  EXPECT_LE(s.used + s.filling, s.capacity);
  EXPECT_EQ(s.evictions, 1u);
  auto too_big = cache.Claim(Key(4), 5 * kMiB, false, true);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), Status::Code::kFull);
}

TEST(FileCacheTest, PinnedFilesStayAndPinsThatDoNotFitAreRefused) {
  FileCache cache(4 * kMiB);
  ASSERT_TRUE(Fill(cache, Key(1), 3 * kMiB, /*pin=*/true));
  auto refused = cache.Claim(Key(2), 2 * kMiB, /*pin=*/true, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pinning would exceed the host tier"), std::string::npos);
  EXPECT_FALSE(Fill(cache, Key(2), 2 * kMiB));  // only room by evicting the pinned one: refused
  EXPECT_TRUE(cache.Find(Key(1)));
  EXPECT_EQ(cache.Unpin(Key(1).sha256), 3 * kMiB);
  EXPECT_TRUE(Fill(cache, Key(2), 2 * kMiB));
  EXPECT_FALSE(cache.Find(Key(1)));
}

// What the chunk tier copies from: the source's bytes of a resident copy,
// never a stamped form, and no use counted.
TEST(FileCacheTest, CopyOutGivesAResidentCopysBytesOnly) {
  FileCache cache(16 * kMiB);
  ASSERT_TRUE(Fill(cache, Key(1), 3 * kMiB + 5));
  ASSERT_TRUE(Fill(cache, Key(2, "stamped:sha256-0"), kMiB));
  std::vector<uint8_t> out(5, 0);
  ASSERT_TRUE(cache.CopyOut(Key(1).sha256, 3 * kMiB, out.size(), out.data()));
  EXPECT_EQ(out, std::vector<uint8_t>(5, 'x'));
  EXPECT_FALSE(cache.CopyOut(Key(1).sha256, 3 * kMiB + 1, out.size(), out.data()));  // past its end
  EXPECT_FALSE(cache.CopyOut(Key(2).sha256, 0, out.size(), out.data()));  // only a stamped form is resident
  EXPECT_FALSE(cache.CopyOut(Key(3).sha256, 0, out.size(), out.data()));
  EXPECT_EQ(cache.GetStats().hits + cache.GetStats().misses, 0u);
}

// Evicted copies the daemon's own readers hold (an open file's handle)
// keep their pages: those stay in the budget until the readers let go.
TEST(FileCacheTest, EvictedCopiesHeldByReadersStayInTheBudget) {
  FileCache cache(8 * kMiB);
  FileCache::CopyPtr reader = Fill(cache, Key(1), 3 * kMiB);
  ASSERT_TRUE(Fill(cache, Key(1, "stamped:sha256-ab"), kMiB));  // another form of the same file
  EXPECT_EQ(cache.Evict(Key(1).sha256), 4 * kMiB);
  auto s = cache.GetStats();
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.files, 0u);
  EXPECT_EQ(s.held_by_readers, 3 * kMiB);  // the other form had no reader and is gone
  EXPECT_EQ(reader->data()[0], 'x');        // the reader keeps its verified bytes
  auto refused = cache.Claim(Key(2), 6 * kMiB, false, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kFull);
  reader.reset();
  EXPECT_EQ(cache.GetStats().held_by_readers, 0u);
  EXPECT_TRUE(Fill(cache, Key(2), 6 * kMiB));
}

// A copy in use is not evicted for room: its reader would keep its pages,
// so evicting it would free nothing. The least recently used copy that
// nobody uses goes instead, and when only copies in use are left the fill
// is refused at once, with nothing evicted.
TEST(FileCacheTest, CopiesInUseAreNotEvictedForRoom) {
  FileCache cache(8 * kMiB);
  FileCache::CopyPtr in_use = Fill(cache, Key(1), 3 * kMiB);
  ASSERT_TRUE(Fill(cache, Key(2), 3 * kMiB));
  ASSERT_TRUE(Fill(cache, Key(3), 4 * kMiB));  // evicts 2, not the older 1
  EXPECT_TRUE(cache.Find(Key(1)));
  EXPECT_FALSE(cache.Find(Key(2)));
  FileCache::CopyPtr also_in_use = cache.Find(Key(3));
  auto refused = cache.Claim(Key(4), 2 * kMiB, false, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(cache.Find(Key(1)) && cache.Find(Key(3)));  // nothing was evicted in vain
  EXPECT_EQ(cache.GetStats().held_by_readers, 0u);
  in_use.reset();
  EXPECT_TRUE(Fill(cache, Key(4), 2 * kMiB));
  EXPECT_FALSE(cache.Find(Key(1)));
}

TEST(FileCacheTest, OneFillAtATimePerKeyAndAnAbandonedFillLeavesNothing) {
  FileCache cache(8 * kMiB);
  auto first = cache.Claim(Key(1), kMiB, false, true);
  ASSERT_TRUE(first.ok() && first->fill);
  auto other = cache.Claim(Key(1), kMiB, false, /*wait=*/false);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->fill);
  EXPECT_FALSE(other->resident);
  EXPECT_EQ(cache.GetStats().filling, kMiB);
  std::thread waiter([&] {
    auto w = cache.Claim(Key(1), kMiB, false, /*wait=*/true);
    EXPECT_TRUE(w.ok() && w->resident);
  });
  cache.Publish(std::move(first->fill), SealedOf(kMiB, 'y'));
  waiter.join();
  auto abandoned = cache.Claim(Key(2), kMiB, false, true);
  ASSERT_TRUE(abandoned.ok() && abandoned->fill);
  abandoned->fill.reset();  // a failed fill gives its room back
  const auto s = cache.GetStats();
  EXPECT_EQ(s.filling, 0u);
  EXPECT_EQ(s.fills_abandoned, 1u);
  EXPECT_FALSE(cache.Find(Key(2)));
}


// Small files are held in the daemon's memory, with no memfd: a user who
// reads thousands of configs takes none of the daemon's descriptors.
TEST(SealedCopyTest, SmallFilesAreHeldInMemoryWithoutADescriptor) {
  EXPECT_EQ(SealedCopy::PreferredWriteFor(SealedCopy::kMemoryCopyMax), SealedCopy::WriteBy::kMemory);
  EXPECT_NE(SealedCopy::PreferredWriteFor(SealedCopy::kMemoryCopyMax + 1), SealedCopy::WriteBy::kMemory);
  auto copy = SealedCopy::Create("ckptfs:test", 100);
  ASSERT_TRUE(copy.ok()) << copy.status().message();
  EXPECT_TRUE((*copy)->in_memory());
  EXPECT_FALSE((*copy)->holds_descriptor());
  ASSERT_TRUE((*copy)->Write(0, reinterpret_cast<const uint8_t*>(std::string(100, 'm').data()), 100).ok());
  ASSERT_TRUE((*copy)->Seal().ok());
  EXPECT_EQ((*copy)->data()[99], 'm');
  EXPECT_FALSE((*copy)->Write(0, reinterpret_cast<const uint8_t*>("x"), 1).ok());  // frozen once sealed
}

// What was written can be read back before sealing, at an address that stays
// valid, with the same bytes, through Seal (a reader streaming from a copy in
// progress must never find its pages unmapped).
TEST(SealedCopyTest, WrittenBytesAreReadableBeforeAndAcrossSealing) {
  for (auto how : {SealedCopy::WriteBy::kPwrite, SealedCopy::WriteBy::kHugePageMapping, SealedCopy::WriteBy::kSmallPageMapping, SealedCopy::WriteBy::kMemory}) {
    auto copy = SealedCopy::Create("ckptfs:test", 3 * kMiB, how);
    ASSERT_TRUE(copy.ok()) << copy.status().message();
    std::string bytes(3 * kMiB, 'r');
    ASSERT_TRUE((*copy)->Write(kMiB, reinterpret_cast<const uint8_t*>(bytes.data()), kMiB).ok());
    const uint8_t* at = (*copy)->ReadableAt(kMiB, kMiB);
    ASSERT_NE(at, nullptr);
    EXPECT_EQ(at[0], 'r');
    EXPECT_EQ((*copy)->ReadableAt(3 * kMiB, 1), nullptr);  // past the end
    ASSERT_TRUE((*copy)->Seal().ok());
    EXPECT_EQ((*copy)->ReadableAt(kMiB, kMiB), at);
    EXPECT_EQ(at[kMiB - 1], 'r');
    if (how != SealedCopy::WriteBy::kMemory) {
      EXPECT_EQ(::fcntl((*copy)->fd(), F_GET_SEALS), F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    }
  }
}

// Readers of a copy in progress go on reading while it is sealed: each sees
// the bytes written, before and after the mapping under it is replaced;
// the replacement is ordered with their reads by HoldMapping, as a FUSE reply
// streaming from the copy holds it (without it, ThreadSanitizer reports the
// remap racing with the reads); and readers that always overlap, so that
// some hold is always taken, do not keep the seal off.
TEST(SealedCopyTest, ReadersOfACopyInProgressAreOrderedWithItsSeal) {
  for (auto how : {SealedCopy::WriteBy::kPwrite, SealedCopy::WriteBy::kHugePageMapping, SealedCopy::WriteBy::kSmallPageMapping}) {
    auto made = SealedCopy::Create("ckptfs:test", 4 * kMiB, how);
    ASSERT_TRUE(made.ok()) << made.status().message();
    std::shared_ptr<SealedCopy> copy = std::move(*made);
    const std::string bytes(4 * kMiB, 's');
    ASSERT_TRUE(copy->Write(0, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()).ok());
    std::atomic<bool> sealed{false};
    std::atomic<int> reads{0}, wrong{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r) {
      readers.emplace_back([&] {
        // Until the seal, and a few reads after it.
        for (int after = 0; after < 50;) {
          const bool was_sealed = sealed.load();
          const auto hold = copy->HoldMapping();
          const uint8_t* at = copy->ReadableAt(0, bytes.size());
          // A reply in flight: the seal comes now, if it is to race.
          std::this_thread::sleep_for(std::chrono::microseconds(300));
          if (at == nullptr || std::memcmp(at, bytes.data(), bytes.size()) != 0) ++wrong;
          ++reads;
          if (was_sealed) ++after;
        }
      });
    }
    while (reads.load() < 20) std::this_thread::yield();
    ASSERT_TRUE(copy->Seal().ok());
    sealed = true;
    for (auto& t : readers) t.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_GE(reads.load(), 120);
  }
}

// The tier bounds its memfds as it bounds its bytes: a fill that needs a
// descriptor evicts the least recently used copy holding one that nobody
// uses, or is refused; files held in memory need none; a copy let go of
// while a reader holds it keeps its descriptor counted until the reader
// lets go, though the reader keeps its bytes.
TEST(FileCacheTest, DescriptorsAreBudgetedLikeBytes) {
  FileCache cache(64 * kMiB, nullptr, /*descriptor_budget=*/2);
  FileCache::CopyPtr reader = Fill(cache, Key(1), kMiB);
  ASSERT_TRUE(reader);
  ASSERT_TRUE(Fill(cache, Key(2), kMiB));
  for (int i = 10; i < 40; ++i) ASSERT_TRUE(Fill(cache, Key(i), 10));  // configs: no descriptor
  EXPECT_EQ(cache.GetStats().descriptors, 2u);
  EXPECT_EQ(cache.GetStats().in_memory, 30u);
  // Evicts 2, the oldest holding a descriptor that no reader uses (evicting
  // 1 would free nothing: its reader keeps its pages).
  ASSERT_TRUE(Fill(cache, Key(3), kMiB));
  auto s = cache.GetStats();
  EXPECT_EQ(s.descriptors, 2u);
  EXPECT_EQ(s.files, 32u);
  EXPECT_TRUE(cache.Find(Key(1)));
  EXPECT_FALSE(cache.Find(Key(2)));
  EXPECT_TRUE(cache.Find(Key(10)));
  // Let go of while its reader holds it: its descriptor stays counted.
  EXPECT_EQ(cache.Evict(Key(1).sha256), kMiB);
  EXPECT_FALSE(reader->holds_descriptor());  // the tier took it
  EXPECT_EQ(reader->data()[kMiB - 1], 'x');   // the reader keeps the bytes
  s = cache.GetStats();
  EXPECT_EQ(s.descriptors, 2u);
  EXPECT_EQ(s.held_by_readers, kMiB);
  auto claim = cache.Claim(Key(4), kMiB, false, true);  // evicts 3, which no reader uses
  ASSERT_TRUE(claim.ok());
  EXPECT_FALSE(cache.Find(Key(3)));
  claim->fill.reset();
  EXPECT_EQ(cache.GetStats().descriptors, 1u);  // the held copy's
  reader.reset();
  EXPECT_EQ(cache.GetStats().descriptors, 0u);
  EXPECT_EQ(cache.GetStats().held_by_readers, 0u);
  // Pinned copies are never evicted for a descriptor: then the fill is refused.
  ASSERT_TRUE(Fill(cache, Key(5), kMiB));
  ASSERT_TRUE(Fill(cache, Key(6), kMiB));
  ASSERT_TRUE(cache.Pin(Key(5)).ok());
  ASSERT_TRUE(cache.Pin(Key(6)).ok());
  auto refused = cache.Claim(Key(7), kMiB, false, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kFull);
  EXPECT_NE(refused.status().message().find("descriptor"), std::string::npos) << refused.status().message();
  EXPECT_TRUE(Fill(cache, Key(41), 10));  // a config still fits
  cache.Unpin(Key(6).sha256);
  EXPECT_EQ(cache.ShedDescriptors(8), 1u);  // the unpinned one
  EXPECT_EQ(cache.GetStats().descriptors, 1u);
}

// A fill that needs a descriptor when only pinned copies hold them is
// refused before anything is evicted for its bytes: evicting copies that
// could not make room would lose them for nothing.
TEST(FileCacheTest, AFillRefusedForADescriptorEvictsNothingForItsBytes) {
  FileCache cache(2 * kMiB, nullptr, /*descriptor_budget=*/2);
  constexpr uint64_t kLarge = SealedCopy::kMemoryCopyMax + 1;  // held in a memfd
  ASSERT_TRUE(SealedCopy::NeedsDescriptor(kLarge));
  ASSERT_TRUE(Fill(cache, Key(1), kLarge, /*pin=*/true));
  ASSERT_TRUE(Fill(cache, Key(2), kLarge, /*pin=*/true));
  for (int i = 10; i < 15; ++i) ASSERT_TRUE(Fill(cache, Key(i), SealedCopy::kMemoryCopyMax));  // no descriptor
  ASSERT_GT(cache.GetStats().used + kLarge, 2 * kMiB);  // the next fill needs bytes too
  auto refused = cache.Claim(Key(3), kLarge, false, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("descriptor"), std::string::npos) << refused.status().message();
  for (int i = 10; i < 15; ++i) EXPECT_TRUE(cache.Find(Key(i))) << i;
  EXPECT_EQ(cache.GetStats().evictions, 0u);
}

// A reader the daemon is not told of: the kernel's file of a passthrough
// open, and a mapping of it, which outlives the file's close. Here a file
// opened read-only on the copy (as the kernel opens one for a passthrough
// open), mapped and closed. Once evicted, the copy's pages stay in the
// budget for as long as the mapping keeps them, so holding evicted copies
// cannot take memory past the tier's capacity.
TEST(FileCacheTest, EvictedCopiesMappedAfterTheirCloseStayInTheBudget) {
  FileCache cache(8 * kMiB);
  FileCache::CopyPtr copy = Fill(cache, Key(1), 5 * kMiB);
  ASSERT_TRUE(copy);
  if (!copy->readers_visible()) GTEST_SKIP() << "no /proc to open the memfd again";
  const int kernel_file = ::open(("/proc/self/fd/" + std::to_string(copy->fd())).c_str(), O_RDONLY);
  ASSERT_GE(kernel_file, 0);
  void* map = ::mmap(nullptr, 5 * kMiB, PROT_READ, MAP_SHARED, kernel_file, 0);
  ASSERT_NE(map, MAP_FAILED);
  ::close(kernel_file);
  copy.reset();  // the daemon's own readers are gone: only the mapping holds it

  // Another 5 MiB evicts 1, which frees nothing: the mapping holds it (the
  // kernel is asked once a copy is let go of, not before). It stays in the
  // budget, and the fill is refused.
  auto claim = cache.Claim(Key(2), 5 * kMiB, false, true);
  ASSERT_FALSE(claim.ok());
  EXPECT_FALSE(cache.Find(Key(1)));
  auto s = cache.GetStats();
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.held_by_readers, 5 * kMiB);
  EXPECT_EQ(s.descriptors, 1u);  // the held copy's, kept to ask the kernel
  // Nothing can make room while the mapping holds 5 of the 8 MiB.
  auto refused = cache.Claim(Key(3), 4 * kMiB, false, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kFull);
  EXPECT_NE(refused.status().message().find("held by readers"), std::string::npos) << refused.status().message();
  EXPECT_EQ(static_cast<const char*>(map)[5 * kMiB - 1], 'x');  // the mapping keeps its bytes

  ::munmap(map, 5 * kMiB);
  auto fits = cache.Claim(Key(3), 4 * kMiB, false, true);
  ASSERT_TRUE(fits.ok()) << fits.status().message();
  EXPECT_TRUE(fits->fill);
  s = cache.GetStats();
  EXPECT_EQ(s.held_by_readers, 0u);
  EXPECT_EQ(s.descriptors, 1u);  // the fill's; the held copy's was closed
}

// Asking the kernel about a held copy costs a lease under the lock every
// open takes: a reader who maps many small files and lets the tier evict
// them cannot make every stats query or claim pay for all of them. With
// more than 64 held copies they are looked at again at most every 100 ms.
TEST(FileCacheTest, ManyHeldCopiesAreAskedAboutAtMostEvery100Ms) {
  constexpr int kCopies = 100;
  constexpr uint64_t kSize = 300 << 10;  // past kMemoryCopyMax: a memfd each
  FileCache cache(1ull << 30);
  std::vector<void*> maps;
  for (int i = 0; i < kCopies; ++i) {
    FileCache::CopyPtr copy = Fill(cache, Key(i), kSize);
    ASSERT_TRUE(copy);
    if (!copy->readers_visible()) GTEST_SKIP() << "leases do not tell readers apart here";
    const int file = ::open(("/proc/self/fd/" + std::to_string(copy->fd())).c_str(), O_RDONLY);
    ASSERT_GE(file, 0);
    maps.push_back(::mmap(nullptr, kSize, PROT_READ, MAP_SHARED, file, 0));
    ASSERT_NE(maps.back(), MAP_FAILED);
    ::close(file);
  }
  for (int i = 0; i < kCopies; ++i) cache.Evict(Key(i).sha256);
  const uint64_t held = kCopies * PageBytes(kSize);
  const auto swept = std::chrono::steady_clock::now();  // before the sweep starts: the tier times it from there
  EXPECT_EQ(cache.GetStats().held_by_readers, held);
  for (void* map : maps) ::munmap(map, kSize);
  const uint64_t right_after = cache.GetStats().held_by_readers;
  if (std::chrono::steady_clock::now() - swept < std::chrono::milliseconds(80)) {
    EXPECT_EQ(right_after, held);  // not asked again yet
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(110));
  auto s = cache.GetStats();
  EXPECT_EQ(s.held_by_readers, 0u);
  EXPECT_EQ(s.descriptors, 0u);
}

// A copy held only by readers: an open file the kernel made on it counts
// until it is closed, and the daemon's own mapping of the copy never does.
TEST(SealedCopyTest, OnlyOtherOpenFilesCountAsReaders) {
  auto copy = SealedOf(2 * kMiB, 'r');
  ASSERT_TRUE(copy->readers_visible());
  EXPECT_FALSE(SealedCopy::OpenElsewhere(copy->fd()));  // its own mapping is no reader
  const int other = ::open(("/proc/self/fd/" + std::to_string(copy->fd())).c_str(), O_RDONLY);
  ASSERT_GE(other, 0);
  EXPECT_TRUE(SealedCopy::OpenElsewhere(copy->fd()));
  ::close(other);
  EXPECT_FALSE(SealedCopy::OpenElsewhere(copy->fd()));
}

}  // namespace
}  // namespace ckptfs
