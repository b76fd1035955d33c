// The host tier's page reserve (PageReserve) and how FileCache lends it room
// and hands its pages to fills.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "cache_sizing.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/page_reserve.h"
#include "ckptfs/sealed_copy.h"
#include "kernel_tuning.h"
#include "mount_options.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kPage = PageReserve::kPageBytes;

FileKey Key(int n) {
  FileKey k;
  k.sha256[0] = static_cast<uint8_t>(n);
  return k;
}

// The bytes the budget counts: copies, fills, evicted copies held, and the
// reserve's pages not promised to a fill.
uint64_t Counted(const FileCache::Stats& s) {
  return s.used + s.filling + s.held_by_readers + s.reserve.target * kPage - s.reserve_promised;
}

// Waits (at most 30 s) until the reserve holds `pages`.
bool ReserveReaches(FileCache& cache, uint64_t pages) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto s = cache.GetStats();
    if (s.reserve.pages == pages && s.reserve.target == pages) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The kB of 2 MiB pages mapped in the mapping that holds `address`
// (/proc/self/smaps: FilePmdMapped, ShmemPmdMapped for older kernels).
uint64_t HugeKibMappedAt(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  uint64_t kib = 0;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t from = 0, to = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> from >> dash >> to && dash == '-' && line.find(':') > line.find(' ')) {
      inside = from <= at && at < to;
      continue;
    }
    if (!inside) continue;
    for (const char* key : {"FilePmdMapped:", "ShmemPmdMapped:"}) {
      if (line.rfind(key, 0) == 0) kib += std::stoull(line.substr(std::strlen(key)));
    }
  }
  return kib;
}

// The daemon asks for shmem huge pages the same way before it keeps a
// reserve (shmem_huge=advise, the default); a reserve is made only where
// the kernel may give memfds 2 MiB pages.
void AllowShmemHugePages() {
  auto asked = daemon::AskForShmemHugePages();
  ASSERT_TRUE(asked.ok()) << asked.status().message();
  const std::string setting = SealedCopy::ShmemHugePages();
  ASSERT_TRUE(setting == "advise" || setting == "always" || setting == "within_size" || setting == "force")
      << "shmem_enabled=" << setting;
}

// Gives `cache` a reserve of at most `limit` bytes, grown at once (or at
// `pace`), and waits until it holds `pages`.
void KeepGrownReserve(FileCache& cache, uint64_t limit, uint64_t pages,
                      PageReserve::Pace pace = PageReserve::Pace::AtOnce()) {
  AllowShmemHugePages();
  auto made = PageReserve::Create(limit);
  ASSERT_TRUE(made.ok()) << made.status().message();
  cache.KeepPageReserve(std::move(*made), pace);
  ASSERT_TRUE(ReserveReaches(cache, pages)) << "the reserve did not reach " << pages << " pages";
}

TEST(PageReserveTest, HoldsWhatItIsLentAndFreesFromTheTop) {
  auto made = PageReserve::Create(4 * kPage + kPage / 2);
  ASSERT_TRUE(made.ok()) << made.status().message();
  PageReserve& reserve = **made;
  EXPECT_EQ(reserve.limit_pages(), 4u);                      // whole pages only
  EXPECT_EQ(reserve.GrowOne(), PageReserve::Growth::kNone);  // nothing lent yet
  reserve.Raise(9);
  EXPECT_EQ(reserve.target(), 4u);  // never past its limit
  for (int i = 0; i < 4; ++i) EXPECT_EQ(reserve.GrowOne(), PageReserve::Growth::kGrew);
  EXPECT_EQ(reserve.GrowOne(), PageReserve::Growth::kNone);
  EXPECT_EQ(reserve.GetStats().pages, 4u);
  EXPECT_EQ(reserve.Lower(3), 3u);
  EXPECT_EQ(reserve.GetStats().pages, 4u);  // held until trimmed
  reserve.Trim();
  EXPECT_EQ(reserve.GetStats().pages, 1u);
  EXPECT_EQ(reserve.GetStats().given, 3u);
  EXPECT_EQ(reserve.Lower(5), 1u);  // no lower than 0
  reserve.Trim();
  EXPECT_EQ(reserve.GetStats().pages, 0u);
  EXPECT_EQ(reserve.GetStats().grown, 4u);
}

// The reserve grows only into free room and while no fill is under way, and
// every claim short of room takes its pages back before it evicts a copy:
// copies, fills and reserve together never pass the tier's capacity.
TEST(PageReserveTest, TheReserveLivesInTheTiersFreeRoomOnly) {
  FileCache cache(16 * kMiB);
  ASSERT_NO_FATAL_FAILURE(KeepGrownReserve(cache, 64 * kMiB, 8));
  EXPECT_EQ(Counted(cache.GetStats()), 16 * kMiB);

  // A fill someone asked for: the spare pages make room, nothing is evicted.
  auto claim = cache.Claim(Key(1), 6 * kMiB, /*pin=*/false, /*wait=*/true);
  ASSERT_TRUE(claim.ok() && claim->fill) << claim.status().message();
  auto s = cache.GetStats();
  EXPECT_EQ(s.reserve.pages, 5u);
  EXPECT_LE(Counted(s), 16 * kMiB);
  // While it is under way the reserve does not grow back.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(cache.GetStats().reserve.target, 5u);
  auto copy = SealedCopy::Create("ckptfs:test", 6 * kMiB);
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE((*copy)->Seal().ok());
  ASSERT_TRUE(cache.Publish(std::move(claim->fill), std::move(*copy)));

  // A fill nobody asked for yet (fill_on_index) counts the spare pages as
  // free room; one larger than the free room is refused and leaves them.
  auto too_big = cache.Claim(Key(2), 12 * kMiB, false, false, FileCache::Room::kFreeOnly);
  EXPECT_FALSE(too_big.ok());
  EXPECT_EQ(cache.GetStats().reserve.pages, 5u);
  auto fits = cache.Claim(Key(3), 10 * kMiB, false, false, FileCache::Room::kFreeOnly);
  ASSERT_TRUE(fits.ok() && fits->fill) << fits.status().message();
  s = cache.GetStats();
  EXPECT_EQ(s.reserve.pages, 0u);
  EXPECT_LE(Counted(s), 16 * kMiB);
  EXPECT_TRUE(cache.Find(Key(1), /*use=*/false));  // not evicted
  fits->fill.reset();                              // abandoned: the room is free again, and the reserve takes it
  ASSERT_TRUE(ReserveReaches(cache, 5));
  EXPECT_EQ(Counted(cache.GetStats()), 16 * kMiB);
}

// A fill made with take_reserve is promised as many of the reserve's pages
// as its file has whole 2 MiB pages, and takes two before each 4 MiB it
// writes: its copy's mapping then holds 2 MiB pages, and the copy is the
// bytes written. The reserve's other pages stay spare.
TEST(PageReserveTest, AFillWritesIntoTheReservesPages) {
  FileCache cache(32 * kMiB);
  ASSERT_NO_FATAL_FAILURE(KeepGrownReserve(cache, 12 * kMiB, 6));

  const uint64_t size = 8 * kMiB + 12345;
  auto claim = cache.Claim(Key(1), size, false, false, FileCache::Room::kFreeOnly, /*take_reserve=*/true);
  ASSERT_TRUE(claim.ok() && claim->fill) << claim.status().message();
  EXPECT_EQ(cache.GetStats().reserve_promised, 4 * kPage);  // as many whole pages as the file has
  auto copy = SealedCopy::Create("ckptfs:test", size, SealedCopy::WriteBy::kSmallPageMapping);
  ASSERT_TRUE(copy.ok());
  SealedCopy& c = **copy;
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 13 + 1);
  uint64_t placed = 0;
  for (uint64_t at = 0; at < size; at += 4 * kMiB) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(4 * kMiB, size - at));
    const uint64_t huge = c.HugePagesAt(at, len);
    const uint64_t taken = cache.TakeFromReserve(*claim->fill, len, huge);
    EXPECT_EQ(taken, huge);
    if (taken > 0) {
      ASSERT_TRUE(c.PlaceHugePages(at, taken));
      placed += taken;
    }
    std::memcpy(c.WritableAt(at, len), bytes.data() + at, len);
  }
  // Whole, aligned 2 MiB pages inside the file: 4 of them (the last 12,345
  // bytes are in small pages).
  EXPECT_EQ(placed, 8 * kMiB);
  EXPECT_GE(HugeKibMappedAt(c.WritableAt(0, 1)), 8 * kMiB / 1024);
  auto s = cache.GetStats();
  EXPECT_EQ(s.reserve.pages, 2u);
  EXPECT_EQ(s.reserve_promised, 0u);
  ASSERT_TRUE(c.Seal().ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.data()), size), bytes);
  ASSERT_TRUE(cache.Publish(std::move(claim->fill), std::move(*copy)));
  s = cache.GetStats();
  EXPECT_EQ(s.reserve_promised, 0u);
  EXPECT_LE(Counted(s), 32 * kMiB);
}

// A copy that cannot take 2 MiB pages (offsets not aligned: a stamped
// header before the tensors) still lets its promised pages go as it writes
// as many bytes: else the reserve would hold them while the copy takes as
// much memory again, past the tier's capacity.
TEST(PageReserveTest, PromisedPagesLeaveTheReserveAsTheFillWritesEvenInSmallPages) {
  FileCache cache(16 * kMiB);
  ASSERT_NO_FATAL_FAILURE(KeepGrownReserve(cache, 16 * kMiB, 8));
  auto claim = cache.Claim(Key(1), 8 * kMiB, false, false, FileCache::Room::kFreeOnly, /*take_reserve=*/true);
  ASSERT_TRUE(claim.ok() && claim->fill) << claim.status().message();
  EXPECT_EQ(cache.GetStats().reserve_promised, 8 * kMiB);
  EXPECT_EQ(cache.TakeFromReserve(*claim->fill, 4 * kMiB, /*huge_bytes=*/0), 0u);  // no 2 MiB page for it
  auto s = cache.GetStats();
  EXPECT_EQ(s.reserve.pages, 6u);  // but the chunk's share left the reserve
  EXPECT_EQ(s.reserve_promised, 4 * kMiB);
  EXPECT_LE(Counted(s), 16 * kMiB);
  claim->fill.reset();  // abandoned: what was not taken is spare again
  s = cache.GetStats();
  EXPECT_EQ(s.reserve_promised, 0u);
  EXPECT_EQ(s.reserve.pages, 6u);
}

// Pages the reserve gave to a fill are not taken again from fresh memory
// for a while: the load that follows the fill needs that memory (and the
// CPU that takes it) first. Bound: with 60 s of quiet, nothing grows back
// in the second after the fill, though the room is free again; with
// 300 ms, all of it does.
TEST(PageReserveTest, AfterGivingPagesTheReserveWaitsBeforeItTakesFreshMemory) {
  for (const auto quiet : {std::chrono::milliseconds(60000), std::chrono::milliseconds(300)}) {
    SCOPED_TRACE("quiet " + std::to_string(quiet.count()) + " ms");
    FileCache cache(32 * kMiB);
    PageReserve::Pace pace = PageReserve::Pace::AtOnce();
    pace.quiet_after_giving = quiet;
    ASSERT_NO_FATAL_FAILURE(KeepGrownReserve(cache, 16 * kMiB, 8, pace));
    auto claim = cache.Claim(Key(1), 8 * kMiB, false, false, FileCache::Room::kFreeOnly, /*take_reserve=*/true);
    ASSERT_TRUE(claim.ok() && claim->fill) << claim.status().message();
    cache.TakeFromReserve(*claim->fill, 4 * kMiB, 4 * kMiB);
    cache.TakeFromReserve(*claim->fill, 4 * kMiB, 4 * kMiB);
    EXPECT_EQ(cache.GetStats().reserve.pages, 4u);
    claim->fill.reset();  // the fill is over, and its room free again
    if (quiet > std::chrono::seconds(1)) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      EXPECT_EQ(cache.GetStats().reserve.pages, 4u) << "the reserve grew back right after a fill";
    } else {
      EXPECT_TRUE(ReserveReaches(cache, 8)) << "the reserve never grew back";
    }
  }
}

// Copies let go of during the quiet after a fill wake the reserve, which
// takes their pages while they come fast (memory freed a moment ago is
// still backed). Here every page counts as fast, so that the test does not
// depend on this machine's memory: with 60 s of quiet the reserve grows
// back only because of the eviction.
TEST(PageReserveTest, DuringTheQuietTheReserveTakesThePagesOfEvictedCopies) {
  FileCache cache(32 * kMiB);
  PageReserve::Pace pace = PageReserve::Pace::AtOnce();
  pace.quiet_after_giving = std::chrono::minutes(1);
  pace.recycled_page = std::chrono::minutes(1);
  ASSERT_NO_FATAL_FAILURE(KeepGrownReserve(cache, 16 * kMiB, 8, pace));
  auto claim = cache.Claim(Key(1), 8 * kMiB, false, false, FileCache::Room::kFreeOnly, /*take_reserve=*/true);
  ASSERT_TRUE(claim.ok() && claim->fill) << claim.status().message();
  cache.TakeFromReserve(*claim->fill, 4 * kMiB, 4 * kMiB);
  cache.TakeFromReserve(*claim->fill, 4 * kMiB, 4 * kMiB);
  auto copy = SealedCopy::Create("ckptfs:test", 8 * kMiB);
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE((*copy)->Seal().ok());
  ASSERT_TRUE(cache.Publish(std::move(claim->fill), std::move(*copy)));
  EXPECT_EQ(cache.GetStats().reserve.pages, 4u);  // quiet: the free room waits
  EXPECT_EQ(cache.Evict(Key(1).sha256), 8 * kMiB);
  EXPECT_TRUE(ReserveReaches(cache, 8)) << "the reserve did not take the evicted copy's pages";
}

// page_reserve=: auto is half of the tier, at most 8 GiB, where copies are
// written in 4 KiB pages for want of fast fresh 2 MiB ones (and none
// elsewhere); SIZE is at most the tier; off is none.
TEST(PageReserveTest, ItsSizeIsHalfTheTierAtMost8GiBWhereFreshPagesAreSlow) {
  constexpr uint64_t kGiB = 1ull << 30;
  EXPECT_EQ(daemon::AutoPageReserveBytes(6 * kGiB), 3 * kGiB);
  EXPECT_EQ(daemon::AutoPageReserveBytes(64 * kGiB), 8 * kGiB);
  ASSERT_NO_FATAL_FAILURE(AllowShmemHugePages());
  MountOptions o;
  std::string why;
  if (SealedCopy::PreferredWrite() != SealedCopy::WriteBy::kSmallPageMapping) {
    EXPECT_EQ(daemon::PageReserveBytes(o, 6 * kGiB, &why), 0u);
    EXPECT_NE(why.find("2 MiB pages already"), std::string::npos) << why;
    return;
  }
  EXPECT_EQ(daemon::PageReserveBytes(o, 6 * kGiB, &why), 3 * kGiB);
  EXPECT_EQ(daemon::PageReserveBytes(o, 64 * kGiB, &why), 8 * kGiB);
  o.page_reserve_bytes = 100 * kGiB;
  EXPECT_EQ(daemon::PageReserveBytes(o, 6 * kGiB, &why), 6 * kGiB);
  o.page_reserve_off = true;
  EXPECT_EQ(daemon::PageReserveBytes(o, 6 * kGiB, &why), 0u);
  EXPECT_EQ(why, "page_reserve=off");
}

// The growing thread runs at its caller's priority, never below: at idle
// priority busy CPUs starved it while it held the process's mmap lock (it
// takes pages) and kept a restart's old daemon waiting to join it.
TEST(PageReserveTest, ItsThreadRunsAtItsCallersPriority) {
  auto made = PageReserve::Create(4 * kPage);
  ASSERT_TRUE(made.ok()) << made.status().message();
  (*made)->StartGrowing([] { return false; }, PageReserve::Pace::Background());
  bool found = false;
  for (int attempt = 0; attempt < 3000 && !found; ++attempt) {  // until the thread has named itself
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      if (!std::getline(comm, name) || name != "ckptfs-reserve") continue;
      found = true;
      std::ifstream stat(task.path() / "stat");
      std::string line;
      ASSERT_TRUE(std::getline(stat, line));
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::vector<std::string> fields(3);  // fields[3] is field 3 (state), as proc(5) counts
      for (std::string f; rest >> f;) fields.push_back(f);
      ASSERT_GT(fields.size(), 41u) << line;
      errno = 0;
      const int our_nice = ::getpriority(PRIO_PROCESS, 0);
      EXPECT_EQ(std::stoi(fields[41]), ::sched_getscheduler(0)) << "policy of the reserve's thread";
      EXPECT_LE(std::stoi(fields[19]), our_nice) << "nice of the reserve's thread";
    }
    if (!found) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(found) << "no thread named ckptfs-reserve";
}

// A claim that cannot be granted (here: no descriptor for its memfd) takes
// nothing back from the reserve.
TEST(PageReserveTest, ARefusedClaimLeavesTheReserveAlone) {
  FileCache cache(16 * kMiB, nullptr, /*descriptor_budget=*/0);
  ASSERT_NO_FATAL_FAILURE(KeepGrownReserve(cache, 16 * kMiB, 8));
  auto claim = cache.Claim(Key(1), 6 * kMiB, /*pin=*/false, /*wait=*/true);
  EXPECT_FALSE(claim.ok());
  EXPECT_EQ(cache.GetStats().reserve.pages, 8u);
}

}  // namespace
}  // namespace ckptfs
