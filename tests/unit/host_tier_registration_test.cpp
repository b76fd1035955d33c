// Issue 12: with gpu=, a pinned copy of the host tier is registered with the
// device (cudaHostRegister) while it is pinned, so that an engine's copy of
// it to the device is a DMA; unregistered when unpinned or evicted; a device
// that refuses leaves it to mlock. The device is a test double that records
// registrations (the GPU is the one place a fake is allowed).
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <vector>

#include "ckptfs/device_memory.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs::testing {
namespace {

class RecordingDevice final : public DeviceMemory {
 public:
  explicit RecordingDevice(bool refuse_registration = false) : refuse_registration_(refuse_registration) {}

  std::map<const void*, size_t> registered() const {
    std::lock_guard lock(mu_);
    return registered_;
  }

  std::string Describe() const override { return "test device"; }
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
  const bool refuse_registration_;
  mutable std::mutex mu_;
  std::map<const void*, size_t> registered_;
};

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

TEST(HostTierRegistrationTest, PinnedCopiesAreRegisteredWithTheDevice) {
  RecordingDevice device;
  FileCache files(64 << 20, &device);
  // Larger than SealedCopy::kMemoryCopyMax: a memfd copy (small files held
  // in the daemon's memory are locked with mlock, never registered).
  const std::vector<uint8_t> bytes(SealedCopy::kMemoryCopyMax + 3 * 4096 + 7, 0x5a);
  FileKey key;
  key.sha256.fill(7);
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

  RecordingDevice refusing(/*refuse_registration=*/true);
  FileCache locked(64 << 20, &refusing);
  Resident(locked, key, bytes, /*pin=*/true);
  EXPECT_EQ(locked.GetStats().registered, 0u);
  EXPECT_EQ(locked.GetStats().pinned, PageBytes(bytes.size()));  // pinned all the same, with mlock
}

}  // namespace
}  // namespace ckptfs::testing
