// The chunk tier on its own: capacity, eviction order, pins, single flight,
// per-file unpin and evict, failed fills, its claims, and its composition
// over the tier below.
#include "ckptfs/chunk_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "chunk_slots.h"
#include "ckptfs/control_protocol.h"
#include "ckptfs/file_cache.h"

namespace ckptfs::testing {
namespace {

ChunkKey Key(uint8_t file, uint32_t index) {
  ChunkKey k;
  k.file.fill(file);
  k.index = index;
  return k;
}

// Fills a chunk with bytes derived from its key, counting fills.
struct Source {
  std::atomic<int> fills{0};
  ChunkCache::FillFn For(const ChunkKey& k) {
    return [this, k](uint8_t* dst, size_t len) {
      ++fills;
      std::memset(dst, k.file[0] ^ static_cast<uint8_t>(k.index), len);
      return Status::Ok();
    };
  }
};

bool Holds(const ChunkCache::Ref& r, const ChunkKey& k) {
  return r.size() > 0 && r.data()[0] == (k.file[0] ^ static_cast<uint8_t>(k.index)) &&
         r.data()[r.size() - 1] == r.data()[0];
}

TEST(ChunkCacheTest, HitAfterFillAndCapacityNeverExceeded) {
  ChunkCache cache({.capacity = 4 * kChunkSize});
  Source src;
  for (uint32_t i = 0; i < 20; ++i) {
    auto r = cache.Get(Key(1, i), kChunkSize, src.For(Key(1, i)));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(Holds(*r, Key(1, i)));
    EXPECT_LE(cache.Stats().slots.used, 4 * kChunkSize);
  }
  EXPECT_EQ(src.fills.load(), 20);
  auto again = cache.Get(Key(1, 19), kChunkSize, src.For(Key(1, 19)));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(src.fills.load(), 20);  // a hit
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.slots.hits, 1u);
  EXPECT_EQ(s.slots.misses, 20u);
  EXPECT_EQ(s.slots.fills, 20u);
  EXPECT_EQ(s.slots.evictions, 16u);
  EXPECT_EQ(s.slots.used, 4 * kChunkSize);
}

TEST(ChunkCacheTest, ChunksInRepeatedUseSurviveALargeScan) {
  ChunkCache cache({.capacity = 8 * kChunkSize});
  Source src;
  // Two hot chunks, used twice each: promoted to the protected segment.
  for (int round = 0; round < 2; ++round) {
    for (uint32_t i = 0; i < 2; ++i) ASSERT_TRUE(cache.Get(Key(9, i), kChunkSize, src.For(Key(9, i))).ok());
  }
  // A scan of 50 chunks, each used once.
  for (uint32_t i = 0; i < 50; ++i) ASSERT_TRUE(cache.Get(Key(2, i), kChunkSize, src.For(Key(2, i))).ok());
  const int before = src.fills.load();
  for (uint32_t i = 0; i < 2; ++i) ASSERT_TRUE(cache.Get(Key(9, i), kChunkSize, src.For(Key(9, i))).ok());
  EXPECT_EQ(src.fills.load(), before);  // still cached: plain LRU would have lost them
  // And the scan's oldest chunks went first.
  ASSERT_TRUE(cache.Get(Key(2, 0), kChunkSize, src.For(Key(2, 0))).ok());
  EXPECT_EQ(src.fills.load(), before + 1);
}

// ckptfsctl preload is not read-ahead: its fills are counted apart, and a
// read of a preloaded chunk is a plain hit, not a read-ahead hit.
TEST(ChunkCacheTest, PreloadFillsAreCountedApartFromReadAhead) {
  ChunkCache cache({.capacity = 8 * kChunkSize});
  Source src;
  ASSERT_TRUE(cache.Load(Key(1, 0), kChunkSize, src.For(Key(1, 0)), /*pin=*/false).ok());
  ASSERT_TRUE(cache.Get(Key(1, 1), kChunkSize, src.For(Key(1, 1)), /*readahead=*/true).ok());
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.preload_fills, 1u);
  EXPECT_EQ(s.readahead_fills, 1u);
  EXPECT_EQ(s.slots.hits + s.slots.misses, 0u);  // neither was a reader's request
  ASSERT_TRUE(cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0))).ok());
  ASSERT_TRUE(cache.Get(Key(1, 1), kChunkSize, src.For(Key(1, 1))).ok());
  s = cache.Stats();
  EXPECT_EQ(s.slots.hits, 2u);
  EXPECT_EQ(s.readahead_hits, 1u);  // only the chunk read-ahead filled
  EXPECT_EQ(src.fills, 2);
}

TEST(ChunkCacheTest, ReferencedChunksAreNotEvicted) {
  ChunkCache cache({.capacity = 2 * kChunkSize});
  Source src;
  auto held = cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0)));
  ASSERT_TRUE(held.ok());
  for (uint32_t i = 1; i < 10; ++i) ASSERT_TRUE(cache.Get(Key(1, i), kChunkSize, src.For(Key(1, i))).ok());
  EXPECT_TRUE(Holds(*held, Key(1, 0)));  // its slot was not reused
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).bytes >= kChunkSize, true);
}

TEST(ChunkCacheTest, PinnedChunksStayAndPinsCannotCrowdOutEverything) {
  ChunkCache cache({.capacity = 6 * kChunkSize});
  Source src;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(cache.Load(Key(7, i), kChunkSize, src.For(Key(7, i)), /*pin=*/true).ok());
  }
  // A fifth pin would leave fewer than two slots for reads: refused, clearly.
  Status refused = cache.Load(Key(7, 4), kChunkSize, src.For(Key(7, 4)), true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("pinning would exceed"), std::string::npos) << refused.message();
  for (uint32_t i = 0; i < 30; ++i) ASSERT_TRUE(cache.Get(Key(3, i), kChunkSize, src.For(Key(3, i))).ok());
  const int before = src.fills.load();
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(cache.Get(Key(7, i), kChunkSize, src.For(Key(7, i))).ok());
  EXPECT_EQ(src.fills.load(), before);
  EXPECT_EQ(cache.Stats().slots.pinned, 4 * kChunkSize);
  EXPECT_EQ(cache.Unpin(Key(7, 0).file), 4 * kChunkSize);
  EXPECT_EQ(cache.Stats().slots.pinned, 0u);
}

TEST(ChunkCacheTest, ConcurrentReadersOfAMissingChunkShareOneFill) {
  ChunkCache cache({.capacity = 4 * kChunkSize});
  std::atomic<int> fills{0};
  // The fill ends only once the 31 other readers wait for it (or after
  // 60 s, and then the count below fails): they share it, none reads again.
  auto slow_fill = [&](uint8_t* dst, size_t len) {
    ++fills;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (cache.Stats().slots.fill_waits < 31 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    std::memset(dst, 0x5a, len);
    return Status::Ok();
  };
  std::vector<std::thread> readers;
  std::atomic<int> good{0};
  for (int t = 0; t < 32; ++t) {
    readers.emplace_back([&] {
      auto r = cache.Get(Key(4, 0), kChunkSize, slow_fill);
      if (r.ok() && r->data()[0] == 0x5a && r->data()[kChunkSize - 1] == 0x5a) ++good;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(fills.load(), 1);
  EXPECT_EQ(good.load(), 32);
  EXPECT_EQ(cache.Stats().slots.fill_waits, 31u);
}

TEST(ChunkCacheTest, FailedFillIsNeverPublished) {
  ChunkCache cache({.capacity = 4 * kChunkSize});
  auto bad = [](uint8_t* dst, size_t len) {
    std::memset(dst, 0xee, len);  // bytes were written, then the check failed
    return Status::Error("chunk 0 of /src/x: XXH3-128 mismatch");
  };
  auto r = cache.Get(Key(5, 0), kChunkSize, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mismatch"), std::string::npos);
  Source src;
  auto good = cache.Get(Key(5, 0), kChunkSize, src.For(Key(5, 0)));
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(Holds(*good, Key(5, 0)));  // filled anew, not the rejected bytes
  EXPECT_EQ(src.fills.load(), 1);
}

TEST(ChunkCacheTest, UnpinAndEvictTouchOnlyTheNamedFile) {
  ChunkCache cache({.capacity = 16 * kChunkSize});
  Source src;
  const size_t short_len = 1000;  // a file's short last chunk counts its own bytes
  for (uint8_t file : {1, 2}) {
    for (uint32_t i = 0; i < 3; ++i) {
      const size_t len = i == 2 ? short_len : kChunkSize;
      ASSERT_TRUE(cache.Load(Key(file, i), len, src.For(Key(file, i)), /*pin=*/true).ok());
    }
  }
  auto held = cache.Get(Key(3, 0), kChunkSize, src.For(Key(3, 0)));
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(cache.Get(Key(3, 1), kChunkSize, src.For(Key(3, 1))).ok());
  const uint64_t file_bytes = 2 * kChunkSize + short_len;

  EXPECT_EQ(cache.Unpin(Key(1, 0).file), file_bytes);
  EXPECT_EQ(cache.Unpin(Key(1, 0).file), 0u);  // nothing left to unpin
  EXPECT_EQ(cache.Stats().slots.pinned, 3 * kChunkSize);  // file 2's pins are untouched (whole slots)
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).bytes, file_bytes);  // unpinned, still resident
  EXPECT_EQ(cache.ResidentBytes(Key(2, 0).file).pinned, file_bytes);

  EXPECT_EQ(cache.Evict(Key(2, 0).file), file_bytes);  // pinned or not
  EXPECT_EQ(cache.ResidentBytes(Key(2, 0).file).bytes, 0u);
  EXPECT_EQ(cache.Stats().slots.pinned, 0u);
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).bytes, file_bytes);

  // A chunk being read is not dropped; the other one is.
  EXPECT_EQ(cache.Evict(Key(3, 0).file), kChunkSize);
  EXPECT_TRUE(Holds(*held, Key(3, 0)));
  EXPECT_EQ(cache.ResidentBytes(Key(3, 0).file).bytes, kChunkSize);
  EXPECT_EQ(cache.ResidencyByFile().size(), 2u);  // files 1 and 3
}

TEST(ChunkCacheTest, AllPinnedChunkTierServesReadsUncached) {
  ChunkCache cache({.capacity = 3 * kChunkSize});
  Source src;
  ASSERT_TRUE(cache.Load(Key(1, 0), kChunkSize, src.For(Key(1, 0)), true).ok());
  std::vector<ChunkCache::Ref> held;
  for (uint32_t i = 0; i < 2; ++i) {
    auto r = cache.Get(Key(2, i), kChunkSize, src.For(Key(2, i)));
    ASSERT_TRUE(r.ok());
    held.push_back(std::move(*r));
  }
  auto extra = cache.Get(Key(3, 0), kChunkSize, src.For(Key(3, 0)));
  ASSERT_TRUE(extra.ok());
  EXPECT_TRUE(Holds(*extra, Key(3, 0)));
  EXPECT_EQ(cache.Stats().uncached_reads, 1u);
}

// A claim is a guard: dropped uncommitted, its slot goes back; dropped
// committed, its reference goes, so the chunk may be evicted. With one slot,
// each next claim below needs the slot the last one let go of.
TEST(ChunkSlotsTest, ADroppedClaimLetsGoOfItsSlot) {
  ChunkSlots slots({.capacity = kChunkSize});
  using Use = ChunkClaim::Use;
  {
    auto filling = slots.Claim(Key(1, 0), kChunkSize, Use::kRead);
    ASSERT_TRUE(filling.ok());
    EXPECT_FALSE(filling->present());
  }  // not committed: aborted
  EXPECT_EQ(slots.Stats().tier.used, 0u);
  {
    auto claim = slots.Claim(Key(2, 0), kChunkSize, Use::kRead);
    ASSERT_TRUE(claim.ok()) << claim.status().message();
    std::memset(claim->data(), 2, kChunkSize);
    claim->Commit(Use::kRead, /*from_source=*/true);
    EXPECT_TRUE(claim->present());
    // Held: the only slot cannot be taken from it.
    EXPECT_EQ(slots.Claim(Key(3, 0), kChunkSize, Use::kRead).status().code(), Status::Code::kFull);
  }  // its reference released
  auto next = slots.Claim(Key(3, 0), kChunkSize, Use::kRead);
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_FALSE(next->present());
  EXPECT_EQ(slots.Stats().tier.evictions, 1u);  // chunk 2 made room
  auto again = slots.Claim(Key(1, 0), kChunkSize, Use::kRead);
  EXPECT_EQ(again.status().code(), Status::Code::kFull);  // the aborted chunk 1 was never published
}

// A waiter for a fill that is dropped claims the chunk itself.
TEST(ChunkSlotsTest, AWaiterOfAnAbortedFillFillsItItself) {
  ChunkSlots slots({.capacity = 2 * kChunkSize});
  using Use = ChunkClaim::Use;
  auto first = slots.Claim(Key(1, 0), kChunkSize, Use::kRead);
  ASSERT_TRUE(first.ok());
  bool waiter_fills = false;
  std::thread waiter([&] {
    auto second = slots.Claim(Key(1, 0), kChunkSize, Use::kRead);
    waiter_fills = second.ok() && !second->present();
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (slots.Stats().tier.fill_waits == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_EQ(slots.Stats().tier.fill_waits, 1u);
  *first = ChunkClaim();  // dropped uncommitted
  waiter.join();
  EXPECT_TRUE(waiter_fills);
}

TEST(ChunkCacheTest, AMovedFromRefPointsAtNothing) {
  ChunkCache cache({.capacity = 4 * kChunkSize});
  Source src;
  auto r = cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0)));
  ASSERT_TRUE(r.ok());
  ChunkCache::Ref moved = std::move(*r);
  EXPECT_TRUE(Holds(moved, Key(1, 0)));
  EXPECT_EQ(r->data(), nullptr);
  EXPECT_EQ(r->size(), 0u);
}

TEST(ChunkCacheTest, CopyOutCopiesOnlyWhatIsPresentAndCountsNoUse) {
  ChunkCache cache({.capacity = 4 * kChunkSize});
  Source src;
  for (uint32_t i = 0; i < 2; ++i) ASSERT_TRUE(cache.Load(Key(1, i), kChunkSize, src.For(Key(1, i)), false).ok());
  std::vector<uint8_t> out(20);
  ASSERT_TRUE(cache.CopyOut(Key(1, 0).file, kChunkSize - 10, out.size(), out.data()));  // across two chunks
  EXPECT_EQ(out[0], 1 ^ 0);
  EXPECT_EQ(out[19], 1 ^ 1);
  EXPECT_FALSE(cache.CopyOut(Key(1, 0).file, 2 * kChunkSize - 10, out.size(), out.data()));  // chunk 2 absent
  EXPECT_FALSE(cache.CopyOut(Key(2, 0).file, 0, out.size(), out.data()));
  EXPECT_EQ(cache.Stats().slots.hits + cache.Stats().slots.misses, 0u);
  EXPECT_EQ(src.fills.load(), 2);
}

// The tier below, as the chunk tier sees it: bytes of files it holds.
class HeldFiles final : public CacheTier {
 public:
  std::map<Sha256Digest, std::vector<uint8_t>> files;
  const char* name() const override { return "held"; }
  bool CopyOut(const Sha256Digest& file, uint64_t offset, size_t len, uint8_t* dst) const override {
    auto it = files.find(file);
    if (it == files.end() || offset + len > it->second.size()) return false;
    std::memcpy(dst, it->second.data() + offset, len);
    return true;
  }
  uint64_t Unpin(const Sha256Digest&) override { return 0; }
  uint64_t Evict(const Sha256Digest&) override { return 0; }
  std::map<Sha256Digest, Residency> ResidencyByFile() const override { return {}; }
};

TEST(ChunkCacheTest, ALoadCopiesWhatTheTierBelowHoldsInsteadOfReadingTheSource) {
  HeldFiles below;
  below.files[Key(7, 0).file] = std::vector<uint8_t>(kChunkSize + 100, 0x77);
  ChunkCache cache({.capacity = 4 * kChunkSize, .below = &below});
  Source src;
  ASSERT_TRUE(cache.Load(Key(7, 1), 100, src.For(Key(7, 1)), /*pin=*/false).ok());
  ASSERT_TRUE(cache.Load(Key(8, 0), kChunkSize, src.For(Key(8, 0)), /*pin=*/false).ok());  // not held below
  EXPECT_EQ(src.fills.load(), 1);
  const CacheStats s = cache.Stats();
  EXPECT_EQ(s.slots.fills_from_host_copy, 1u);
  EXPECT_EQ(s.slots.fills, 1u);  // only the source read counts as a fill
  auto r = cache.Get(Key(7, 1), 100, src.For(Key(7, 1)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data()[99], 0x77);
  EXPECT_EQ(src.fills.load(), 1);
}

TEST(CacheTierTest, TiersAreNamedAsStatsNameThem) {
  FileCache files(kChunkSize);
  ChunkCache chunks({.capacity = 4 * kChunkSize, .below = &files});
  EXPECT_STREQ(files.name(), protocol::kTierHost);
  EXPECT_STREQ(chunks.name(), protocol::kTierChunks);
}

}  // namespace
}  // namespace ckptfs::testing
