#include "ckptfs/chunk_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "chunk_slots.h"

namespace ckptfs {

ChunkCache::Ref::Ref() = default;

// A moved-from Ref points at nothing: its chunk may be evicted once the new
// owner lets go.
ChunkCache::Ref::Ref(Ref&& o) noexcept
    : claim_(std::move(o.claim_)),
      owned_(std::move(o.owned_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

ChunkCache::Ref& ChunkCache::Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    claim_ = std::move(o.claim_);
    owned_ = std::move(o.owned_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

ChunkCache::Ref::~Ref() = default;

ChunkCache::ChunkCache(Options options)
    : options_(options), slots_(std::make_unique<ChunkSlots>(ChunkSlots::Options{.capacity = options_.capacity})) {}

ChunkCache::~ChunkCache() = default;

namespace {

using Use = ChunkClaim::Use;

// A claimed empty slot filled by `fill` (which reads the source unless
// `from_source` is false), and published only if that succeeded; a failed
// fill's claim goes back as it is dropped.
Status FillClaimed(ChunkClaim& claim, size_t len, const ChunkCache::FillFn& fill, Use use, bool from_source = true) {
  if (Status s = fill(claim.data(), len); !s.ok()) return s;
  claim.Commit(use, from_source);
  return Status::Ok();
}

}  // namespace

Result<ChunkCache::Ref> ChunkCache::Get(const ChunkKey& key, size_t len, const FillFn& fill, bool readahead) {
  const Use use = readahead ? Use::kReadAhead : Use::kRead;
  auto claimed = slots_->Claim(key, len, use);
  Ref r;
  r.size_ = len;
  if (claimed.ok()) {
    if (!claimed->present()) {
      if (Status s = FillClaimed(*claimed, len, fill, use); !s.ok()) return s;
    }
    r.data_ = claimed->data();
    r.claim_ = std::move(*claimed);
    return r;
  }
  if (claimed.status().code() != Status::Code::kFull) return claimed.status();
  // No slot could be freed: serve this read from a private buffer.
  ++uncached_reads_;
  r.owned_.reset(new uint8_t[len]);
  if (Status s = fill(r.owned_.get(), len); !s.ok()) return s;
  r.data_ = r.owned_.get();
  return r;
}

Status ChunkCache::Load(const ChunkKey& key, size_t len, const FillFn& fill, bool pin) {
  if (pin) {
    if (Status s = slots_->CheckPinRoom(key); !s.ok()) return s;
  }
  auto claimed = slots_->Claim(key, len, Use::kPreload);
  if (!claimed.ok()) return claimed.status();
  if (!claimed->present()) {
    const uint64_t offset = static_cast<uint64_t>(key.index) * kChunkSize;
    auto from_below = [&](uint8_t* dst, size_t n) {
      if (options_.below == nullptr || !options_.below->CopyOut(key.file, offset, n, dst)) {
        return Status::NotFound("not held by the tier below");
      }
      ++host_copy_fills_;
      return Status::Ok();
    };
    // The tier below's verified bytes when it holds them, else the source.
    if (!FillClaimed(*claimed, len, from_below, Use::kPreload, /*from_source=*/false).ok()) {
      if (Status s = FillClaimed(*claimed, len, fill, Use::kPreload); !s.ok()) return s;
    }
  }
  if (pin) claimed->Pin();
  return Status::Ok();
}

const char* ChunkCache::name() const { return "chunks"; }

bool ChunkCache::CopyOut(const Sha256Digest& file, uint64_t offset, size_t len, uint8_t* dst) const {
  while (len > 0) {
    const ChunkKey key{file, static_cast<uint32_t>(offset / kChunkSize)};
    const size_t in_chunk = offset % kChunkSize;
    const size_t n = std::min<size_t>(len, kChunkSize - in_chunk);
    const ChunkClaim chunk = slots_->Peek(key);
    if (!chunk || chunk.length() < in_chunk + n) return false;
    std::memcpy(dst, chunk.data() + in_chunk, n);
    dst += n;
    offset += n;
    len -= n;
  }
  return true;
}

uint64_t ChunkCache::Unpin(const Sha256Digest& file) { return slots_->Unpin(file); }

uint64_t ChunkCache::Evict(const Sha256Digest& file) { return slots_->Evict(file); }

CacheTier::Residency ChunkCache::ResidentBytes(const Sha256Digest& file) const {
  Residency r;
  slots_->AddResidency(file, r);
  return r;
}

std::map<Sha256Digest, CacheTier::Residency> ChunkCache::ResidencyByFile() const {
  std::map<Sha256Digest, Residency> out;
  slots_->AddResidency(out);
  return out;
}

void ChunkCache::CountVerificationFailure() { ++verification_failures_; }

CacheStats ChunkCache::Stats() const {
  const ChunkSlots::Counters slots = slots_->Stats();
  CacheStats s;
  s.slots = slots.tier;
  s.slots.fills_from_host_copy = host_copy_fills_.load();
  s.slots_pinned_memory = slots.memory_locked;
  s.readahead_fills = slots.readahead_fills;
  s.readahead_hits = slots.readahead_hits;
  s.preload_fills = slots.preload_fills;
  s.verification_failures = verification_failures_.load();
  s.uncached_reads = uncached_reads_.load();
  return s;
}

}  // namespace ckptfs
