#include "ckptfs/host_tier_fill.h"

#include "ckptfs/safetensors_name.h"

namespace ckptfs {

class HostTierFill::Copy : public HashCopy {
 public:
  Copy(HostTierFill& owner, std::unique_ptr<FileCache::Reservation> fill, std::unique_ptr<SealedCopy> copy)
      : owner_(owner), fill_(std::move(fill)), copy_(std::move(copy)) {}
  ~Copy() override {
    if (fill_) ++owner_.abandoned_;  // its room goes back with it
  }

  uint8_t* WritableAt(uint64_t offset, size_t len) override { return copy_->WritableAt(offset, len); }
  Status Write(uint64_t offset, const uint8_t* data, size_t len) override { return copy_->Write(offset, data, len); }

  void Publish(const FileHashes& hashes) override {
    if (!copy_->Seal().ok()) return;  // abandoned
    const uint64_t size = copy_->size();
    const SealedCopy* mine = copy_.get();
    // Another fill may have made this content resident meanwhile: then that
    // copy stays, and this one is dropped.
    auto resident = owner_.cache_->PublishAs(std::move(fill_), FileKey{hashes.sha256, ""}, std::move(copy_));
    if (resident.get() == mine) {
      ++owner_.fills_;
      owner_.bytes_ += size;
    }
  }

 private:
  HostTierFill& owner_;
  std::unique_ptr<FileCache::Reservation> fill_;
  std::unique_ptr<SealedCopy> copy_;
};

std::unique_ptr<HashCopy> HostTierFill::Begin(const std::string& rel_path, const FileStamp& stamp) {
  if (policy_ == Policy::kOff || cache_ == nullptr) return nullptr;
  if (skip_safetensors_ && IsSafetensorsName(rel_path)) return nullptr;
  // Unique while the file is hashed: the same file is hashed once at a time.
  const FileKey provisional{{}, "indexing:" + stamp.ToString()};
  auto claim = cache_->Claim(provisional, stamp.size, /*pin=*/false, /*wait=*/false, FileCache::Room::kFreeOnly);
  if (!claim.ok() || !claim->fill) {
    ++skipped_;
    return nullptr;
  }
  auto copy = SealedCopy::Create("ckptfs:index:" + std::to_string(stamp.ino), stamp.size);
  if (!copy.ok()) {
    ++skipped_;  // no memfd to be had (descriptors, memory): the claim is given back
    return nullptr;
  }
  return std::make_unique<Copy>(*this, std::move(claim->fill), std::move(*copy));
}

HostTierFill::Stats HostTierFill::GetStats() const {
  return {fills_.load(), bytes_.load(), skipped_.load(), abandoned_.load()};
}

}  // namespace ckptfs
