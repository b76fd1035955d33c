// The chunk path's tiers on their own and composed: a slow GPU never holds
// up a host hit, Unpin and Evict touch only the named file, chunks move
// between the tiers with the right bytes, and (issue 12) the GPU tier fills
// from a resident whole-file copy, which is registered with the device while
// pinned. The device is a test double over the simulated device (the GPU is
// the one place a fake is allowed): it can hold one kind of call at a gate
// and records host registrations.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "ckptfs/chunk_cache.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/gpu_chunk_tier.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs::testing {
namespace {

// How long a test waits for something that must happen before it fails;
// never reached when the code is right.
constexpr auto kBound = std::chrono::seconds(20);

ChunkKey Key(uint8_t file, uint32_t index) {
  ChunkKey k;
  k.file.fill(file);
  k.index = index;
  return k;
}

uint8_t ByteOf(const ChunkKey& k) { return static_cast<uint8_t>(k.file[0] * 16 + k.index + 1); }

// Fills a chunk with a byte derived from its key, counting fills.
struct Source {
  std::atomic<int> fills{0};
  ChunkCache::FillFn For(const ChunkKey& k) {
    return [this, k](uint8_t* dst, size_t len) {
      ++fills;
      std::memset(dst, ByteOf(k), len);
      return Status::Ok();
    };
  }
};

bool Holds(const uint8_t* p, size_t len, uint8_t byte) {
  for (size_t i = 0; i < len; i += 4096) {
    if (p[i] != byte) return false;
  }
  return len > 0 && p[len - 1] == byte;
}

class TestDevice final : public DeviceMemory {
 public:
  enum class Op { kNone, kAllocate, kCopyToDevice, kCopyToHost };
  explicit TestDevice(bool refuse_registration = false)
      : inner_(MakeSimulatedDevice(1ull << 30)), refuse_registration_(refuse_registration) {}
  ~TestDevice() override { Open(); }

  // From now on, calls of `op` wait at the gate until Open.
  void Hold(Op op) {
    std::lock_guard lock(mu_);
    held_ = op;
  }
  // Whether a call reached the gate within the bound.
  bool WaitUntilHeld() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return waiting_ > 0; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    held_ = Op::kNone;
    cv_.notify_all();
  }
  std::map<const void*, size_t> registered() const {
    std::lock_guard lock(mu_);
    return registered_;
  }

  std::string Describe() const override { return "test device"; }
  void* Allocate(size_t bytes) override {
    Gate(Op::kAllocate);
    return inner_->Allocate(bytes);
  }
  void Free(void* p) override { inner_->Free(p); }
  Status CopyToDevice(void* dst, const void* src, size_t n) override {
    Gate(Op::kCopyToDevice);
    return inner_->CopyToDevice(dst, src, n);
  }
  Status CopyToHost(void* dst, const void* src, size_t n) override {
    Gate(Op::kCopyToHost);
    return inner_->CopyToHost(dst, src, n);
  }
  uint64_t TotalBytes() const override { return inner_->TotalBytes(); }
  Status RegisterHost(const void* host, size_t n) override {
    if (refuse_registration_) return Status::Error("registration refused by the test");
    std::lock_guard lock(mu_);
    if (!registered_.emplace(host, n).second) return Status::Error("registered twice");
    return Status::Ok();
  }
  void UnregisterHost(const void* host) override {
    std::lock_guard lock(mu_);
    registered_.erase(host);
  }

 private:
  void Gate(Op op) {
    std::unique_lock lock(mu_);
    if (held_ != op) return;
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return held_ != op; });
    --waiting_;
  }

  std::unique_ptr<DeviceMemory> inner_;
  const bool refuse_registration_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Op held_ = Op::kNone;
  int waiting_ = 0;
  std::map<const void*, size_t> registered_;
};

// A GPU call that blocks (a demotion's allocation or copy to the device, or
// a promotion's copy back) while another thread reads a chunk the host tier
// holds: the host hit completes. With one lock over both tiers it waited
// for the device.
class GpuCallBlockingTest : public ::testing::TestWithParam<TestDevice::Op> {};

TEST_P(GpuCallBlockingTest, DoesNotHoldUpAHostHit) {
  TestDevice device;
  ChunkCache cache({.host_capacity = 2 * kChunkSize, .gpu_capacity = 8 * kChunkSize, .device = &device});
  Source src;
  const ChunkKey a = Key(1, 0), b = Key(1, 1), c = Key(1, 2);
  ASSERT_TRUE(cache.Get(a, kChunkSize, src.For(a)).ok());
  ASSERT_TRUE(cache.Get(b, kChunkSize, src.For(b)).ok());
  ChunkKey hit = b, wanted = c;  // demotion: c's fill evicts a, whose copy to the device blocks
  if (GetParam() == TestDevice::Op::kCopyToHost) {
    ASSERT_TRUE(cache.Get(c, kChunkSize, src.For(c)).ok());  // a goes down to the GPU tier
    hit = c, wanted = a;  // promotion: a comes back from the device (b goes down, unblocked)
  }
  device.Hold(GetParam());
  auto blocked = std::async(std::launch::async, [&] { return cache.Get(wanted, kChunkSize, src.For(wanted)).ok(); });
  const bool held = device.WaitUntilHeld();
  if (!held) device.Open();
  ASSERT_TRUE(held) << "the GPU call never came";
  auto host_hit = std::async(std::launch::async, [&] {
    auto r = cache.Get(hit, kChunkSize, src.For(hit));
    return r.ok() && Holds(r->data(), r->size(), ByteOf(hit));
  });
  const bool finished = host_hit.wait_for(kBound) == std::future_status::ready;
  device.Open();
  EXPECT_TRUE(finished) << "a host hit waited for the GPU";
  EXPECT_TRUE(host_hit.get());
  EXPECT_TRUE(blocked.get());
  auto r = cache.Get(wanted, kChunkSize, src.For(wanted));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(Holds(r->data(), r->size(), ByteOf(wanted)));
}

INSTANTIATE_TEST_SUITE_P(EachDeviceCall, GpuCallBlockingTest,
                         ::testing::Values(TestDevice::Op::kAllocate, TestDevice::Op::kCopyToDevice,
                                           TestDevice::Op::kCopyToHost));

// A load into the GPU tier whose copy blocks does not hold up a host hit either.
TEST(ChunkTiersTest, ABlockedGpuLoadDoesNotHoldUpAHostHit) {
  TestDevice device;
  ChunkCache cache({.host_capacity = 4 * kChunkSize, .gpu_capacity = 8 * kChunkSize, .device = &device});
  Source src;
  ASSERT_TRUE(cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0))).ok());
  device.Hold(TestDevice::Op::kCopyToDevice);
  auto load = std::async(std::launch::async, [&] {
    return cache.Load(Key(2, 0), kChunkSize, src.For(Key(2, 0)), Tier::kGpu, /*pin=*/true).ok();
  });
  const bool held = device.WaitUntilHeld();
  if (!held) device.Open();
  ASSERT_TRUE(held) << "the GPU copy never came";
  auto host_hit = std::async(std::launch::async, [&] { return cache.Get(Key(1, 0), kChunkSize, src.For(Key(1, 0))).ok(); });
  const bool finished = host_hit.wait_for(kBound) == std::future_status::ready;
  device.Open();
  EXPECT_TRUE(finished) << "a host hit waited for a GPU load";
  EXPECT_TRUE(host_hit.get());
  EXPECT_TRUE(load.get());
  EXPECT_EQ(cache.Stats().gpu.pinned, kChunkSize);
}

TEST(ChunkTiersTest, UnpinAndEvictTouchOnlyTheNamedFile) {
  auto device = MakeSimulatedDevice(1ull << 30);
  ChunkCache cache({.host_capacity = 16 * kChunkSize, .gpu_capacity = 8 * kChunkSize, .device = device.get()});
  Source src;
  const size_t short_len = 1000;  // a file's short last chunk counts its own bytes
  for (uint32_t i = 0; i < 3; ++i) {
    const size_t len = i == 2 ? short_len : kChunkSize;
    ASSERT_TRUE(cache.Load(Key(1, i), len, src.For(Key(1, i)), Tier::kHost, /*pin=*/true).ok());
    ASSERT_TRUE(cache.Load(Key(2, i), len, src.For(Key(2, i)), Tier::kGpu, /*pin=*/true).ok());
  }
  auto held = cache.Get(Key(3, 0), kChunkSize, src.For(Key(3, 0)));
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(cache.Get(Key(3, 1), kChunkSize, src.For(Key(3, 1))).ok());
  const uint64_t file_bytes = 2 * kChunkSize + short_len;

  EXPECT_EQ(cache.Unpin(Key(1, 0).file), file_bytes);
  EXPECT_EQ(cache.Unpin(Key(1, 0).file), 0u);  // nothing left to unpin
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.host.pinned, 0u);
  EXPECT_EQ(s.gpu.pinned, file_bytes);  // file 2's pins are untouched
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).host, file_bytes);  // unpinned, still resident

  // File 2 is in both tiers (a GPU load goes through the host tier).
  EXPECT_EQ(cache.Evict(Key(2, 0).file), 2 * file_bytes);
  EXPECT_EQ(cache.ResidentBytes(Key(2, 0).file).host + cache.ResidentBytes(Key(2, 0).file).gpu, 0u);
  EXPECT_EQ(cache.Stats().gpu.pinned, 0u);
  EXPECT_EQ(cache.ResidentBytes(Key(1, 0).file).host, file_bytes);

  // A chunk being read is not dropped; the other one is.
  EXPECT_EQ(cache.Evict(Key(3, 0).file), kChunkSize);
  EXPECT_TRUE(Holds(held->data(), held->size(), ByteOf(Key(3, 0))));
  EXPECT_EQ(cache.ResidentBytes(Key(3, 0).file).host, kChunkSize);
  const auto by_file = cache.ResidencyByFile();
  EXPECT_EQ(by_file.size(), 2u);  // files 1 and 3
}

TEST(ChunkTiersTest, GpuTierOnItsOwn) {
  auto device = MakeSimulatedDevice(1ull << 30);
  GpuChunkTier gpu(*device, 3 * kChunkSize);
  std::vector<uint8_t> bytes(kChunkSize);
  auto insert = [&](const ChunkKey& k, bool pin) {
    std::memset(bytes.data(), ByteOf(k), bytes.size());
    return gpu.Insert(k, bytes.data(), bytes.size(), pin, GpuChunkTier::From::kHostChunk);
  };
  ASSERT_TRUE(insert(Key(1, 0), /*pin=*/true).ok());
  ASSERT_TRUE(insert(Key(1, 1), false).ok());
  ASSERT_TRUE(insert(Key(1, 2), false).ok());
  ASSERT_TRUE(gpu.Touch(Key(1, 1), false).ok());  // now 1,2 is the least recently used
  ASSERT_TRUE(insert(Key(2, 0), false).ok());
  EXPECT_EQ(gpu.Touch(Key(1, 2), false).code(), Status::Code::kNotFound);
  EXPECT_TRUE(gpu.Touch(Key(1, 0), false).ok());  // pinned: never the victim
  EXPECT_EQ(gpu.Stats().evictions, 1u);

  std::vector<uint8_t> out(kChunkSize);
  ASSERT_TRUE(gpu.CopyOut(Key(1, 1), out.data(), out.size(), /*keep=*/true).ok());
  EXPECT_TRUE(Holds(out.data(), out.size(), ByteOf(Key(1, 1))));
  ASSERT_TRUE(gpu.CopyOut(Key(2, 0), out.data(), out.size(), /*keep=*/false).ok());
  EXPECT_TRUE(Holds(out.data(), out.size(), ByteOf(Key(2, 0))));
  EXPECT_EQ(gpu.Touch(Key(2, 0), false).code(), Status::Code::kNotFound);  // not kept
  ASSERT_TRUE(gpu.CopyOut(Key(1, 0), out.data(), out.size(), /*keep=*/false).ok());
  EXPECT_TRUE(gpu.Touch(Key(1, 0), false).ok());  // pinned copies stay

  // Pins past the tier are refused, and a tier full of pins takes no more.
  ASSERT_TRUE(gpu.Touch(Key(1, 1), /*pin=*/true).ok());
  ASSERT_TRUE(insert(Key(3, 0), true).ok());
  EXPECT_EQ(insert(Key(3, 1), true).code(), Status::Code::kFull);
  EXPECT_EQ(insert(Key(3, 1), false).code(), Status::Code::kFull);
  EXPECT_EQ(gpu.Unpin(Key(1, 0).file), 2 * kChunkSize);
  EXPECT_EQ(gpu.Evict(Key(1, 0).file), 2 * kChunkSize);
  EXPECT_EQ(gpu.Stats().used, kChunkSize);
  EXPECT_EQ(gpu.Stats().pinned, kChunkSize);
}

// A host miss the GPU tier holds is copied back with the right bytes and no
// source read; an unpinned GPU copy is then dropped, a pinned one stays.
TEST(ChunkTiersTest, ChunksMoveBetweenTheTiers) {
  auto device = MakeSimulatedDevice(1ull << 30);
  ChunkCache cache({.host_capacity = 2 * kChunkSize, .gpu_capacity = 8 * kChunkSize, .device = device.get()});
  Source src;
  ASSERT_TRUE(cache.Load(Key(5, 0), kChunkSize, src.For(Key(5, 0)), Tier::kGpu, /*pin=*/true).ok());
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(cache.Get(Key(6, i), kChunkSize, src.For(Key(6, i))).ok());
  EXPECT_EQ(cache.ResidentBytes(Key(5, 0).file).host, 0u);  // pushed out of the host tier
  EXPECT_EQ(cache.ResidentBytes(Key(6, 0).file).gpu, 2 * kChunkSize);  // demoted
  const int fills = src.fills.load();
  for (const ChunkKey& k : {Key(5, 0), Key(6, 0)}) {
    auto r = cache.Get(k, kChunkSize, src.For(k));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(Holds(r->data(), r->size(), ByteOf(k)));
  }
  EXPECT_EQ(src.fills.load(), fills);
  EXPECT_EQ(cache.ResidentBytes(Key(5, 0).file).gpu, kChunkSize);  // pinned: still on the device
  EXPECT_EQ(cache.ResidentBytes(Key(6, 0).file).gpu, 3 * kChunkSize);  // 6,0 came back up; 6,1 to 6,3 went down
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.gpu.hits, 2u);
  EXPECT_EQ(s.host.misses, 6u);
  EXPECT_EQ(s.host.fills, 5u);  // source reads: file 6's four and the load's one; none for the copies back
  EXPECT_EQ(s.preload_fills, 1u);
}

std::shared_ptr<const SealedCopy> Resident(FileCache& files, const FileKey& key, const std::vector<uint8_t>& bytes,
                                           bool pin) {
  auto claim = files.Claim(key, bytes.size(), pin, /*wait=*/true);
  EXPECT_TRUE(claim.ok() && claim->fill);
  auto copy = SealedCopy::Create("ckptfs:test", bytes.size());
  EXPECT_TRUE(copy.ok());
  EXPECT_TRUE((*copy)->Write(0, bytes.data(), bytes.size()).ok());
  EXPECT_TRUE((*copy)->Seal().ok());
  return files.Publish(std::move(claim->fill), std::move(*copy));
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131) >> 12);
  return v;
}

// Issue 12: the GPU tier takes its bytes from the host tier's resident copy,
// not from the source (whose "bytes" here would be wrong).
TEST(ChunkTiersTest, GpuTierFillsFromTheResidentHostCopy) {
  auto device = MakeSimulatedDevice(1ull << 30);
  FileCache files(64 << 20, device.get());
  const std::vector<uint8_t> bytes = Pattern(2 * kChunkSize + 12345);
  const FileKey fkey{Key(4, 0).file, ""};
  auto copy = Resident(files, fkey, bytes, /*pin=*/true);
  ChunkCache cache({.host_capacity = 2 * kChunkSize,
                    .gpu_capacity = 8 * kChunkSize,
                    .device = device.get(),
                    .files = &files});
  std::atomic<int> source_reads{0};
  auto wrong_source = [&](uint8_t* dst, size_t len) {
    ++source_reads;
    std::memset(dst, 0xee, len);
    return Status::Ok();
  };
  for (uint32_t i = 0; i < 3; ++i) {
    const size_t len = std::min<size_t>(kChunkSize, bytes.size() - i * kChunkSize);
    ASSERT_TRUE(cache.Load(Key(4, i), len, wrong_source, Tier::kGpu, /*pin=*/false).ok());
  }
  CacheStats s = cache.Stats();
  EXPECT_EQ(source_reads.load(), 0);
  EXPECT_EQ(s.gpu.fills_from_host_copy, 3u);
  EXPECT_EQ(s.host.used, 0u);  // straight from the copy's mapping, no chunk slot on the way
  // Read back through a host miss: the GPU tier's bytes are the copy's.
  for (uint32_t i = 0; i < 3; ++i) {
    const size_t len = std::min<size_t>(kChunkSize, bytes.size() - i * kChunkSize);
    auto r = cache.Get(Key(4, i), len, wrong_source);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(std::memcmp(r->data(), bytes.data() + i * kChunkSize, len), 0) << "chunk " << i;
  }
  EXPECT_EQ(source_reads.load(), 0);
  EXPECT_EQ(cache.Stats().gpu.hits, 3u);
}

// Issue 12: with the GPU tier on, a pinned copy is registered with the device
// while it is pinned (and unregistered when unpinned or evicted); a device
// that refuses leaves it to mlock.
TEST(ChunkTiersTest, PinnedCopiesAreRegisteredWithTheDevice) {
  TestDevice device;
  FileCache files(64 << 20, &device);
  // Larger than SealedCopy::kMemoryCopyMax: a memfd copy (small files held
  // in the daemon's memory are locked with mlock, never registered).
  const std::vector<uint8_t> bytes = Pattern(SealedCopy::kMemoryCopyMax + 3 * 4096 + 7);
  const FileKey key{Key(7, 0).file, ""};
  auto copy = Resident(files, key, bytes, /*pin=*/true);
  auto reg = device.registered();
  ASSERT_EQ(reg.size(), 1u);
  EXPECT_EQ(reg.begin()->first, copy->data());
  EXPECT_EQ(reg.begin()->second, bytes.size());
  EXPECT_EQ(files.GetStats().registered, PageBytes(bytes.size()));
  EXPECT_EQ(files.Unpin(key.sha256), bytes.size());
  EXPECT_TRUE(device.registered().empty());
  EXPECT_EQ(files.GetStats().registered, 0u);
  ASSERT_TRUE(files.Pin(key).ok());
  ASSERT_TRUE(files.Pin(key).ok());  // pinning twice registers once
  EXPECT_EQ(device.registered().size(), 1u);
  files.Evict(key.sha256);
  EXPECT_TRUE(device.registered().empty());
  EXPECT_EQ(files.GetStats().registered, 0u);

  TestDevice refusing(/*refuse_registration=*/true);
  FileCache locked(64 << 20, &refusing);
  Resident(locked, key, bytes, /*pin=*/true);
  EXPECT_EQ(locked.GetStats().registered, 0u);
  EXPECT_EQ(locked.GetStats().pinned, PageBytes(bytes.size()));  // pinned all the same, with mlock
}

}  // namespace
}  // namespace ckptfs::testing
