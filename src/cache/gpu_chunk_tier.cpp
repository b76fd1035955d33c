#include "ckptfs/gpu_chunk_tier.h"

#include <spdlog/spdlog.h>

namespace ckptfs {

GpuChunkTier::GpuChunkTier(DeviceMemory& device, uint64_t capacity) : device_(device), capacity_(capacity) {
  stats_.capacity = capacity;
}

GpuChunkTier::~GpuChunkTier() {
  for (auto& [key, e] : entries_) device_.Free(e.device);
}

void GpuChunkTier::FreeAll(const std::vector<void*>& device_ptrs) {
  for (void* p : device_ptrs) device_.Free(p);
}

void GpuChunkTier::RemoveLocked(Entries::iterator it, std::vector<void*>& to_free) {
  Entry& e = it->second;
  to_free.push_back(e.device);
  used_ -= e.len;
  if (e.pinned) pinned_ -= e.len;
  lru_.erase(e.lru);
  entries_.erase(it);
}

bool GpuChunkTier::MakeRoomLocked(size_t len, std::vector<void*>& to_free) {
  while (used_ + len > capacity_) {
    auto victim = entries_.end();
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      auto found = entries_.find(*it);
      if (!found->second.pinned && found->second.busy == 0) {
        victim = found;
        break;
      }
    }
    if (victim == entries_.end()) return false;
    RemoveLocked(victim, to_free);
    ++stats_.evictions;
  }
  return true;
}

Status GpuChunkTier::PinLocked(Entry& e, bool pin) {
  lru_.splice(lru_.begin(), lru_, e.lru);
  if (!pin || e.pinned) return Status::Ok();
  if (pinned_ + e.len > capacity_) {
    return Status::Full("pinning would exceed gpu_cache_size (" + std::to_string(pinned_) + " bytes pinned of " +
                        std::to_string(capacity_) + ")");
  }
  e.pinned = true;
  pinned_ += e.len;
  return Status::Ok();
}

Status GpuChunkTier::Touch(const ChunkKey& key, bool pin) {
  std::unique_lock lock(mu_);
  inserted_.wait(lock, [&] { return !inserting_.count(key); });
  auto it = entries_.find(key);
  if (it == entries_.end()) return Status::NotFound("not in the GPU tier");
  return PinLocked(it->second, pin);
}

Status GpuChunkTier::Insert(const ChunkKey& key, const uint8_t* src, size_t len, bool pin, From from) {
  std::vector<void*> to_free;
  {
    std::unique_lock lock(mu_);
    inserted_.wait(lock, [&] { return !inserting_.count(key); });
    if (auto it = entries_.find(key); it != entries_.end()) return PinLocked(it->second, pin);
    if (pin && pinned_ + len > capacity_) {
      return Status::Full("pinning would exceed gpu_cache_size (" + std::to_string(pinned_) + " bytes pinned of " +
                          std::to_string(capacity_) + ")");
    }
    const bool room = MakeRoomLocked(len, to_free);
    if (room) {
      used_ += len;  // reserved for this insert
      inserting_.insert(key);
    }
    lock.unlock();
    FreeAll(to_free);
    if (!room) return Status::Full("the GPU tier is full of pinned or busy chunks");
  }
  void* p = device_.Allocate(len);
  Status copied = p == nullptr ? Status::Error(device_.Describe() + " refused " + std::to_string(len) + " bytes")
                               : device_.CopyToDevice(p, src, len);
  return Publish(key, p, len, pin, from, copied);
}

// Ends an insert: the chunk becomes visible, or its reservation is given
// back (and, when the device refused memory, the tier shrinks to what it
// holds and goes on).
Status GpuChunkTier::Publish(const ChunkKey& key, void* p, size_t len, bool pin, From from, Status copied) {
  std::unique_lock lock(mu_);
  inserting_.erase(key);
  inserted_.notify_all();
  if (!copied.ok()) {
    used_ -= len;
    if (p == nullptr) {
      spdlog::warn("GPU tier: {}; shrinking the tier from {} to {} bytes", copied.message(), capacity_, used_);
      capacity_ = used_;
    } else {
      spdlog::warn("GPU tier: {}", copied.message());
    }
    lock.unlock();
    if (p != nullptr) device_.Free(p);
    return copied;
  }
  lru_.push_front(key);
  Entry& e = entries_[key];
  e.device = p;
  e.len = len;
  e.lru = lru_.begin();
  ++stats_.fills;
  if (from == From::kHostCopy) ++stats_.fills_from_host_copy;
  if (pin && pinned_ + len <= capacity_) {  // checked at the start; a shrink since may refuse it
    e.pinned = true;
    pinned_ += len;
  }
  return Status::Ok();
}

Status GpuChunkTier::CopyOut(const ChunkKey& key, uint8_t* dst, size_t len, bool keep) {
  Entry* e = nullptr;
  {
    std::unique_lock lock(mu_);
    inserted_.wait(lock, [&] { return !inserting_.count(key); });
    auto it = entries_.find(key);
    if (it == entries_.end()) return Status::NotFound("not in the GPU tier");
    e = &it->second;
    // A length other than the one stored would leave part of `dst` as it
    // was (another chunk's bytes): the caller reads the source instead.
    if (e->len != len) return Status::NotFound("the GPU tier holds this chunk with another length");
    ++e->busy;  // entries of a std::map stay put; busy keeps this one from being removed
  }
  Status s = device_.CopyToHost(dst, e->device, len);
  std::vector<void*> to_free;
  {
    std::lock_guard lock(mu_);
    --e->busy;
    if (s.ok()) {
      ++stats_.hits;
      if (!keep && !e->pinned && e->busy == 0) RemoveLocked(entries_.find(key), to_free);
    }
  }
  FreeAll(to_free);
  return s;
}

void GpuChunkTier::CountMiss() {
  std::lock_guard lock(mu_);
  ++stats_.misses;
}

uint64_t GpuChunkTier::Unpin(const Sha256Digest& file) {
  std::lock_guard lock(mu_);
  uint64_t bytes = 0;
  for (auto it = entries_.lower_bound(ChunkKey{file, 0}); it != entries_.end() && it->first.file == file; ++it) {
    if (!it->second.pinned) continue;
    it->second.pinned = false;
    pinned_ -= it->second.len;
    bytes += it->second.len;
  }
  return bytes;
}

uint64_t GpuChunkTier::Evict(const Sha256Digest& file) {
  std::vector<void*> to_free;
  uint64_t bytes = 0;
  {
    std::lock_guard lock(mu_);
    for (auto it = entries_.lower_bound(ChunkKey{file, 0}); it != entries_.end() && it->first.file == file;) {
      auto here = it++;
      if (here->second.busy > 0) continue;
      bytes += here->second.len;
      RemoveLocked(here, to_free);
    }
  }
  FreeAll(to_free);
  return bytes;
}

void GpuChunkTier::AddResidency(const Sha256Digest& file, ChunkResidency& r) const {
  std::lock_guard lock(mu_);
  for (auto it = entries_.lower_bound(ChunkKey{file, 0}); it != entries_.end() && it->first.file == file; ++it) {
    r.gpu += it->second.len;
    if (it->second.pinned) r.pinned += it->second.len;
  }
}

void GpuChunkTier::AddResidency(std::map<Sha256Digest, ChunkResidency>& out) const {
  std::lock_guard lock(mu_);
  for (const auto& [key, e] : entries_) {
    ChunkResidency& r = out[key.file];
    r.gpu += e.len;
    if (e.pinned) r.pinned += e.len;
  }
}

TierStats GpuChunkTier::Stats() const {
  std::lock_guard lock(mu_);
  TierStats s = stats_;
  s.capacity = capacity_;
  s.used = used_;
  s.pinned = pinned_;
  return s;
}

}  // namespace ckptfs
