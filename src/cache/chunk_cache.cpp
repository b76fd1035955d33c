#include "ckptfs/chunk_cache.h"

#include <cstring>

namespace ckptfs {

ChunkCache::Ref::Ref(Ref&& o) noexcept
    : tier_(std::exchange(o.tier_, nullptr)),
      entry_(std::exchange(o.entry_, nullptr)),
      owned_(std::move(o.owned_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

ChunkCache::Ref& ChunkCache::Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    Release();
    tier_ = std::exchange(o.tier_, nullptr);
    entry_ = std::exchange(o.entry_, nullptr);
    owned_ = std::move(o.owned_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

ChunkCache::Ref::~Ref() { Release(); }

void ChunkCache::Ref::Release() {
  if (tier_ != nullptr && entry_ != nullptr) tier_->Release(static_cast<HostChunkTier::Entry*>(entry_));
  tier_ = nullptr;
  entry_ = nullptr;
}

ChunkCache::ChunkCache(Options options)
    : options_(options),
      host_(std::make_unique<HostChunkTier>(HostChunkTier::Options{.capacity = options_.host_capacity})) {}

ChunkCache::~ChunkCache() = default;

// A claimed slot filled by `fill` (which reads the source unless
// `fill_reads_source` is false); published only if that succeeded.
Status ChunkCache::FillClaimed(const HostChunkTier::Claimed& claimed, size_t len, const FillFn& fill, Use use,
                               bool fill_reads_source) {
  if (Status s = fill(claimed.slot, len); !s.ok()) {
    host_->Abort(claimed.entry);
    return s;
  }
  host_->Commit(claimed.entry, use, fill_reads_source);
  return Status::Ok();
}

Result<ChunkCache::Ref> ChunkCache::Get(const ChunkKey& key, size_t len, const FillFn& fill, bool readahead) {
  const Use use = readahead ? Use::kReadAhead : Use::kRead;
  auto claimed = host_->Claim(key, len, use);
  if (claimed.ok() && !claimed->present) {
    if (Status s = FillClaimed(*claimed, len, fill, use); !s.ok()) return s;
  }
  if (claimed.ok()) {
    Ref r;
    r.tier_ = host_.get();
    r.entry_ = claimed->entry;
    r.data_ = claimed->slot;
    r.size_ = len;
    return r;
  }
  if (claimed.status().code() != Status::Code::kFull) return claimed.status();
  // No slot could be freed: serve this read from a private buffer.
  ++uncached_reads_;
  Ref r;
  r.owned_.reset(new uint8_t[len]);
  if (Status s = fill(r.owned_.get(), len); !s.ok()) return s;
  r.data_ = r.owned_.get();
  r.size_ = len;
  return r;
}

const uint8_t* ChunkCache::InResidentFile(const ChunkKey& key, size_t len, FileCache::CopyPtr& hold) const {
  if (options_.files == nullptr) return nullptr;
  hold = options_.files->Find(FileKey{key.file, ""}, /*use=*/false);
  const uint64_t offset = static_cast<uint64_t>(key.index) * kChunkSize;
  if (!hold || hold->data() == nullptr || offset + len > hold->size()) return nullptr;
  return hold->data() + offset;
}

Status ChunkCache::Load(const ChunkKey& key, size_t len, const FillFn& fill, bool pin) {
  if (pin) {
    if (Status s = host_->CheckPinRoom(key); !s.ok()) return s;
  }
  auto claimed = host_->Claim(key, len, Use::kPreload);
  if (!claimed.ok()) return claimed.status();
  if (!claimed->present) {
    FileCache::CopyPtr hold;
    const uint8_t* resident = InResidentFile(key, len, hold);
    auto from_copy = [&](uint8_t* dst, size_t n) {
      std::memcpy(dst, resident, n);
      ++host_copy_fills_;
      return Status::Ok();
    };
    Status s = resident != nullptr ? FillClaimed(*claimed, len, from_copy, Use::kPreload, false)
                                   : FillClaimed(*claimed, len, fill, Use::kPreload);
    if (!s.ok()) return s;
  }
  if (pin) host_->Pin(claimed->entry);
  host_->Release(claimed->entry);
  return Status::Ok();
}

uint64_t ChunkCache::Unpin(const Sha256Digest& file) {
  return host_->Unpin(file);
}

uint64_t ChunkCache::Evict(const Sha256Digest& file) {
  return host_->Evict(file);
}

ChunkCache::Residency ChunkCache::ResidentBytes(const Sha256Digest& file) const {
  Residency r;
  host_->AddResidency(file, r);
  return r;
}

std::map<Sha256Digest, ChunkCache::Residency> ChunkCache::ResidencyByFile() const {
  std::map<Sha256Digest, Residency> out;
  host_->AddResidency(out);
  return out;
}

void ChunkCache::CountVerificationFailure() { ++verification_failures_; }

CacheStats ChunkCache::Stats() const {
  const HostChunkTier::Counters host = host_->Stats();
  CacheStats s;
  s.host = host.tier;
  s.host.fills_from_host_copy = host_copy_fills_.load();
  s.host_pinned_memory = host.memory_locked;
  s.readahead_fills = host.readahead_fills;
  s.readahead_hits = host.readahead_hits;
  s.preload_fills = host.preload_fills;
  s.verification_failures = verification_failures_.load();
  s.uncached_reads = uncached_reads_.load();
  return s;
}

}  // namespace ckptfs
