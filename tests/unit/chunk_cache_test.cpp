// The chunk cache on its own: capacity, eviction order, pins, single flight,
// per-file unpin and evict, failed fills.
#include "ckptfs/chunk_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

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
  ChunkCache cache({.host_capacity = 4 * kChunkSize});
  Source src;
  for (uint32_t i = 0; i < 20; ++i) {
    auto r = cache.Get(Key(1, i), kChunkSize, src.For(Key(1, i)));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(Holds(*r, Key(1, i)));
    EXPECT_LE(cache.Stats().host.used, 4 * kChunkSize);
  }
  EXPECT_EQ(src.fills.load(), 20);
  auto again = cache.Get(Key(1, 19), kChunkSize, src.For(Key(1, 19)));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(src.fills.load(), 20);  // a hit
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.host.hits, 1u);
  EXPECT_EQ(s.host.misses, 20u);
  EXPECT_EQ(s.host.fills, 20u);
  EXPECT_EQ(s.host.evictions, 16u);
  EXPECT_EQ(s.host.used, 4 * kChunkSize);
}

TEST(ChunkCacheTest, ChunksInRepeatedUseSurviveALargeScan) {
  ChunkCache cache({.host_capacity = 8 * kChunkSize});
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
  ChunkCache cache({.host_capacity = 8 * kChunkSize});
  Source src;
  ASSERT_TRUE(cache.Load(Key(1, 0), kChunkSize, src.For(Key(1, 0)), /*pin=*/false).ok());
  ASSERT_TRUE(cache.Get(Key(1, 1), kChunkSize, src.For(Key(1, 1)), /*readahead=*/true).ok());
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.preload_fills, 1u);
  EXPECT_EQ(s.readahead_fills, 1u);
  EXPECT_EQ(s.host.hits + s.host.misses, 0u);  // neither was a reader's request
  ASSERT_TRUE(cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0))).ok());
  ASSERT_TRUE(cache.Get(Key(1, 1), kChunkSize, src.For(Key(1, 1))).ok());
  s = cache.Stats();
  EXPECT_EQ(s.host.hits, 2u);
  EXPECT_EQ(s.readahead_hits, 1u);  // only the chunk read-ahead filled
  EXPECT_EQ(src.fills, 2);
}

TEST(ChunkCacheTest, ReferencedChunksAreNotEvicted) {
  ChunkCache cache({.host_capacity = 2 * kChunkSize});
  Source src;
  auto held = cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0)));
  ASSERT_TRUE(held.ok());
  for (uint32_t i = 1; i < 10; ++i) ASSERT_TRUE(cache.Get(Key(1, i), kChunkSize, src.For(Key(1, i))).ok());
  EXPECT_TRUE(Holds(*held, Key(1, 0)));  // its slot was not reused
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).host >= kChunkSize, true);
}

TEST(ChunkCacheTest, PinnedChunksStayAndPinsCannotCrowdOutEverything) {
  ChunkCache cache({.host_capacity = 6 * kChunkSize});
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
  EXPECT_EQ(cache.Stats().host.pinned, 4 * kChunkSize);
  EXPECT_EQ(cache.Unpin(Key(7, 0).file), 4 * kChunkSize);
  EXPECT_EQ(cache.Stats().host.pinned, 0u);
}

TEST(ChunkCacheTest, ConcurrentReadersOfAMissingChunkShareOneFill) {
  ChunkCache cache({.host_capacity = 4 * kChunkSize});
  std::atomic<int> fills{0};
  // The fill ends only once the 31 other readers wait for it (or after
  // 60 s, and then the count below fails): they share it, none reads again.
  auto slow_fill = [&](uint8_t* dst, size_t len) {
    ++fills;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (cache.Stats().host.fill_waits < 31 && std::chrono::steady_clock::now() < deadline) {
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
  EXPECT_EQ(cache.Stats().host.fill_waits, 31u);
}

TEST(ChunkCacheTest, FailedFillIsNeverPublished) {
  ChunkCache cache({.host_capacity = 4 * kChunkSize});
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
  ChunkCache cache({.host_capacity = 16 * kChunkSize});
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
  EXPECT_EQ(cache.Stats().host.pinned, 3 * kChunkSize);  // file 2's pins are untouched (whole slots)
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).host, file_bytes);  // unpinned, still resident
  EXPECT_EQ(cache.ResidentBytes(Key(2, 0).file).pinned, file_bytes);

  EXPECT_EQ(cache.Evict(Key(2, 0).file), file_bytes);  // pinned or not
  EXPECT_EQ(cache.ResidentBytes(Key(2, 0).file).host, 0u);
  EXPECT_EQ(cache.Stats().host.pinned, 0u);
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).host, file_bytes);

  // A chunk being read is not dropped; the other one is.
  EXPECT_EQ(cache.Evict(Key(3, 0).file), kChunkSize);
  EXPECT_TRUE(Holds(*held, Key(3, 0)));
  EXPECT_EQ(cache.ResidentBytes(Key(3, 0).file).host, kChunkSize);
  EXPECT_EQ(cache.ResidencyByFile().size(), 2u);  // files 1 and 3
}

TEST(ChunkCacheTest, AllPinnedHostTierServesReadsUncached) {
  ChunkCache cache({.host_capacity = 3 * kChunkSize});
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

}  // namespace
}  // namespace ckptfs::testing
