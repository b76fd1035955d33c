#include "ckptfs/host_tier_fill.h"

#include <vector>

#include "ckptfs/safetensors_name.h"

namespace ckptfs {

class HostTierFill::Copy : public HashCopy {
 public:
  Copy(HostTierFill& owner, std::unique_ptr<FileCache::Reservation> fill, std::unique_ptr<SealedCopy> copy)
      : owner_(owner),
        fill_(std::move(fill)),
        copy_(std::move(copy)),
        prepared_((copy_->size() + kChunkSize - 1) / kChunkSize, 0) {}
  ~Copy() override {
    if (fill_) ++owner_.abandoned_;  // its room goes back with it
  }

  uint8_t* WritableAt(uint64_t offset, size_t len) override { return copy_->WritableAt(offset, len); }
  // The chunk's memory from the page reserve, once per chunk (a hashing
  // task that yields reads its chunks ahead again).
  void PreparePages(uint64_t offset, size_t len) override {
    const size_t chunk = static_cast<size_t>(offset / kChunkSize);
    if (!fill_ || !fill_->promised_reserve_pages() || chunk >= prepared_.size() || prepared_[chunk]) return;
    prepared_[chunk] = 1;  // each chunk's own element: the I/O threads write distinct ones
    owner_.reserve_bytes_ += owner_.cache_->PlaceReservePages(*fill_, *copy_, offset, len, /*in_place=*/true);
  }
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
  std::vector<uint8_t> prepared_;  // per chunk: PreparePages ran
};

std::unique_ptr<HashCopy> HostTierFill::Begin(const std::string& rel_path, const FileStamp& stamp) {
  if (policy_ == Policy::kOff || cache_ == nullptr) return nullptr;
  if (skip_safetensors_ && IsSafetensorsName(rel_path)) return nullptr;
  // Unique while the file is hashed: the same file is hashed once at a time.
  const FileKey provisional{{}, "indexing:" + stamp.ToString()};
  // A copy written through a mapping of small pages can take the reserve's.
  const bool take_reserve = SealedCopy::CanTakeReservePages(stamp.size);
  auto claim =
      cache_->Claim(provisional, stamp.size, /*pin=*/false, /*wait=*/false, FileCache::Room::kFreeOnly, take_reserve);
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
  return {fills_.load(), bytes_.load(), skipped_.load(), abandoned_.load(), reserve_bytes_.load()};
}

}  // namespace ckptfs
