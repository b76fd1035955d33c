// The memory the host tier keeps for its next copies (PageReserve), and the
// tier's use of it (FileCache::NewCopy, eviction).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/file_cache.h"
#include "ckptfs/page_reserve.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
constexpr uint64_t kMiB = 1 << 20;

// Waits up to 30 s for `done`; no timing is asserted, only that it happens.
template <class F>
bool Eventually(F done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(PageReserveTest, KeepsWhatItIsGivenWithinTheRoomAndHandsItToNewCopies) {
  PageReserve reserve(64 * kMiB, seconds(300));
  reserve.Keep(16 * kMiB, 64 * kMiB);
  EXPECT_EQ(reserve.held(), 16 * kMiB);
  EXPECT_EQ(reserve.allocated(), 16 * kMiB);  // the kernel gave the memory: it is touched
  // The room shrank (fills claimed it): the reserve gives back the excess.
  reserve.Keep(4 * kMiB, 8 * kMiB);
  EXPECT_EQ(reserve.held(), 8 * kMiB);
  EXPECT_EQ(reserve.allocated(), 8 * kMiB);
  // Handed out in whole 2 MiB pages as the bytes add up, and never more
  // than it holds.
  EXPECT_EQ(reserve.Hand(3 * kMiB), 2 * kMiB);
  EXPECT_EQ(reserve.held(), 6 * kMiB);
  EXPECT_EQ(reserve.Hand(kMiB / 2), 0u);
  EXPECT_EQ(reserve.Hand(kMiB / 2), 2 * kMiB);
  EXPECT_EQ(reserve.Hand(100 * kMiB), 4 * kMiB);
  EXPECT_EQ(reserve.Hand(1), 0u);
  EXPECT_EQ(reserve.allocated(), 0u);
  const auto s = reserve.GetStats();
  EXPECT_EQ(s.kept, 16 * kMiB);
  EXPECT_EQ(s.handed, 8 * kMiB);
  EXPECT_EQ(s.returned, 8 * kMiB);
  // Never past its limit, whatever the room says.
  reserve.Keep(1024 * kMiB, 1024 * kMiB);
  EXPECT_EQ(reserve.held(), 64 * kMiB);
}

TEST(PageReserveTest, WhatNobodyDrewOnGoesBackToTheKernel) {
  PageReserve reserve(64 * kMiB, seconds(1));
  reserve.Keep(8 * kMiB, 64 * kMiB);
  EXPECT_EQ(reserve.held(), 8 * kMiB);
  ASSERT_TRUE(Eventually([&] { return reserve.held() == 0; }));
  EXPECT_EQ(reserve.allocated(), 0u);
  EXPECT_EQ(reserve.GetStats().returned, 8 * kMiB);
}

TEST(PageReserveTest, KeepPagesZeroKeepsNothing) {
  PageReserve reserve(64 * kMiB, seconds(0));
  reserve.Keep(8 * kMiB, 64 * kMiB);
  EXPECT_EQ(reserve.held(), 0u);
  EXPECT_EQ(reserve.allocated(), 0u);
}

// The reserve gives everything back when the machine runs short.
TEST(PageReserveTest, ShortOfMemoryMeansLessAvailableThanHeldOrThanAFewPercent) {
  using M = PageReserve::MemInfo;
  constexpr uint64_t kGiB = 1024 * kMiB;
  EXPECT_FALSE(PageReserve::MemoryIsShort(M{24 * kGiB, 20 * kGiB}, 2 * kGiB));
  EXPECT_TRUE(PageReserve::MemoryIsShort(M{24 * kGiB, 1 * kGiB}, 2 * kGiB));     // less than it holds
  EXPECT_TRUE(PageReserve::MemoryIsShort(M{100 * kGiB, 4 * kGiB}, 1 * kGiB));    // under 5%
  EXPECT_FALSE(PageReserve::MemoryIsShort(std::nullopt, 2 * kGiB));              // unknown: keep
  const fs::path meminfo = fs::temp_directory_path() / ("ckptfs-meminfo-" + std::to_string(::getpid()));
  std::ofstream(meminfo) << "MemTotal:       24576000 kB\nMemFree:        20000000 kB\n"
                            "MemAvailable:   21000000 kB\nBuffers:           1000 kB\n";
  const auto m = PageReserve::MemAvailable(meminfo.string());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->total, 24576000ull << 10);
  EXPECT_EQ(m->available, 21000000ull << 10);
  std::ofstream(meminfo) << "MemTotal: 1 kB\n";
  EXPECT_FALSE(PageReserve::MemAvailable(meminfo.string()).has_value());
  fs::remove(meminfo);
  // This machine's own is readable.
  EXPECT_TRUE(PageReserve::MemAvailable().has_value());
}

// A copy draws on the reserve as it is written, through either way of
// writing, by as much as it writes.
TEST(PageReserveTest, ACopyFreesAsMuchOfTheReserveAsItWrites) {
  for (auto how : {SealedCopy::WriteBy::kHugePageMapping, SealedCopy::WriteBy::kPwrite}) {
    PageReserve reserve(64 * kMiB, seconds(300));
    reserve.Keep(32 * kMiB, 64 * kMiB);
    auto copy = SealedCopy::Create("ckptfs:test", 12 * kMiB, how, &reserve);
    ASSERT_TRUE(copy.ok()) << copy.status().message();
    const std::vector<uint8_t> bytes(4 * kMiB, 0x5a);
    if (uint8_t* at = (*copy)->WritableAt(0, bytes.size())) {
      std::memcpy(at, bytes.data(), bytes.size());
    } else {
      ASSERT_TRUE((*copy)->Write(0, bytes.data(), bytes.size()).ok());
    }
    EXPECT_EQ(reserve.held(), 28 * kMiB);
    ASSERT_TRUE((*copy)->Write(4 * kMiB, bytes.data(), bytes.size()).ok());
    EXPECT_EQ(reserve.held(), 24 * kMiB);
    ASSERT_TRUE((*copy)->Seal().ok());
    EXPECT_EQ((*copy)->data()[4 * kMiB + 1], 0x5a);
    EXPECT_EQ((*copy)->data()[8 * kMiB + 1], 0);
  }
}

// The tier keeps the memory of a copy it evicts (when it held the last
// reference), never more than its free room, and hands it to the next copy.
TEST(PageReserveTest, TheHostTierKeepsAnEvictedCopysMemoryForTheNextCopy) {
  FileCache cache(64 * kMiB, nullptr, FileCache::kNoDescriptorLimit, seconds(300));
  auto fill = [&](int n, uint64_t size) {
    FileKey key;
    key.sha256[0] = static_cast<uint8_t>(n);
    auto claim = cache.Claim(key, size, /*pin=*/false, /*wait=*/true);
    EXPECT_TRUE(claim.ok() && claim->fill);
    auto copy = cache.NewCopy("ckptfs:test", size);
    EXPECT_TRUE(copy.ok());
    const std::vector<uint8_t> bytes(size, static_cast<uint8_t>(n));
    EXPECT_TRUE((*copy)->Write(0, bytes.data(), bytes.size()).ok());
    EXPECT_TRUE((*copy)->Seal().ok());
    return cache.Publish(std::move(claim->fill), std::move(*copy));
  };
  Sha256Digest one{}, two{};
  one[0] = 1;
  two[0] = 2;
  fill(1, 24 * kMiB);
  auto held_by_reader = fill(2, 16 * kMiB);
  EXPECT_EQ(cache.GetStats().kept_pages.held, 0u);
  // A reader holds the second: evicting it frees nothing now, so nothing is
  // kept for it (the reserve is not grown from fresh memory).
  cache.Evict(two);
  EXPECT_EQ(cache.GetStats().kept_pages.held, 0u);
  held_by_reader.reset();
  cache.Evict(one);
  EXPECT_EQ(cache.GetStats().kept_pages.held, 24 * kMiB);
  // A new copy of 40 MiB: claimed room leaves 24 MiB free, and the copy's
  // writes take all the reserve has.
  fill(3, 40 * kMiB);
  auto s = cache.GetStats();
  EXPECT_EQ(s.kept_pages.held, 0u);
  EXPECT_EQ(s.kept_pages.handed, 24 * kMiB);
  EXPECT_EQ(s.used, 40 * kMiB);
  // Copies and reserve together stay within the capacity.
  Sha256Digest three{};
  three[0] = 3;
  fill(4, 20 * kMiB);  // 60 MiB resident
  cache.Evict(three);  // 40 MiB freed, but the room is 44 MiB
  s = cache.GetStats();
  EXPECT_EQ(s.kept_pages.held, 40 * kMiB);
  EXPECT_LE(s.used + s.kept_pages.held, s.capacity);
}

// The reserve is of use only where fresh memory is slow: a VM whose
// balloon device reports free pages to the host.
TEST(PageReserveTest, FreePageReportingIsReadFromSysfs) {
  const fs::path sys = fs::temp_directory_path() / ("ckptfs-sys-" + std::to_string(::getpid()));
  auto write = [&](const std::string& rel, const std::string& text) {
    fs::create_directories((sys / rel).parent_path());
    std::ofstream(sys / rel) << text;
  };
  EXPECT_FALSE(PageReserve::FreePageReporting(sys.string()));  // no such kernel module
  write("module/page_reporting/parameters/page_reporting_order", "9\n");
  EXPECT_FALSE(PageReserve::FreePageReporting(sys.string()));  // and no balloon
  write("bus/virtio/drivers/virtio_balloon/virtio0/features", "0110000000000000\n");
  EXPECT_FALSE(PageReserve::FreePageReporting(sys.string()));  // a balloon without reporting
  write("bus/virtio/drivers/virtio_balloon/virtio0/features", "0110010100000000\n");
  EXPECT_TRUE(PageReserve::FreePageReporting(sys.string()));
  // An order past the buddy allocator's reports nothing (how an operator
  // turns it off).
  write("module/page_reporting/parameters/page_reporting_order", "11\n");
  EXPECT_FALSE(PageReserve::FreePageReporting(sys.string()));
  fs::remove_all(sys);
}

}  // namespace
}  // namespace ckptfs
