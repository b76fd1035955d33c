#include "ckptfs/chunk_cache.h"

#include <cstring>

#include <spdlog/spdlog.h>

namespace ckptfs {

namespace {
// The protected segment may hold this share of the host tier.
constexpr double kProtectedShare = 0.8;
// Pins leave at least this many host slots for ordinary reads.
constexpr uint64_t kUnpinnedReserveSlots = 2;
}  // namespace

struct ChunkCache::Entry {
  enum class Segment { kNone, kProbation, kProtected };
  ChunkKey key;
  size_t len = 0;
  bool filling = false;  // a fill or a promotion is in flight; others wait
  uint8_t* host = nullptr;
  void* gpu = nullptr;
  int refs = 0;  // live Refs to the host copy
  bool host_pinned = false;
  bool gpu_pinned = false;
  bool readahead = false;  // filled ahead of the reader and not read yet
  Segment segment = Segment::kNone;
  std::list<Entry*>::iterator host_pos;
  bool in_gpu_lru = false;
  std::list<Entry*>::iterator gpu_pos;
};

size_t ChunkCache::KeyHash::operator()(const ChunkKey& k) const {
  uint64_t h;
  std::memcpy(&h, k.file.data(), sizeof h);
  return static_cast<size_t>(h ^ (static_cast<uint64_t>(k.index) * 0x9e3779b97f4a7c15ull));
}

ChunkCache::Ref::Ref(Ref&& o) noexcept
    : cache_(std::exchange(o.cache_, nullptr)),
      entry_(std::exchange(o.entry_, nullptr)),
      owned_(std::move(o.owned_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

ChunkCache::Ref& ChunkCache::Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    Release();
    cache_ = std::exchange(o.cache_, nullptr);
    entry_ = std::exchange(o.entry_, nullptr);
    owned_ = std::move(o.owned_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

ChunkCache::Ref::~Ref() { Release(); }

void ChunkCache::Ref::Release() {
  if (cache_ != nullptr && entry_ != nullptr) cache_->ReleaseRef(static_cast<Entry*>(entry_));
  cache_ = nullptr;
  entry_ = nullptr;
}

ChunkCache::ChunkCache(Options options)
    : options_(options), host_(options.host_capacity, kChunkSize, options.cuda_host_memory) {
  if (options_.device == nullptr) options_.gpu_capacity = 0;
  stats_.gpu_enabled = options_.gpu_capacity > 0;
}

ChunkCache::~ChunkCache() {
  std::lock_guard lock(mu_);
  for (auto& [key, e] : entries_) {
    if (e->gpu) options_.device->Free(e->gpu);
  }
}

void ChunkCache::ReleaseRef(Entry* e) {
  std::lock_guard lock(mu_);
  --e->refs;
}

void ChunkCache::Unlink(Entry* e) {
  if (e->segment == Entry::Segment::kProbation) probation_.erase(e->host_pos);
  if (e->segment == Entry::Segment::kProtected) {
    protected_.erase(e->host_pos);
    protected_bytes_ -= e->len;
  }
  e->segment = Entry::Segment::kNone;
}

void ChunkCache::Erase(Entry* e) {
  Unlink(e);
  if (e->in_gpu_lru) gpu_lru_.erase(e->gpu_pos);
  entries_.erase(e->key);
}

void ChunkCache::Touch(Entry* e) {
  if (e->segment == Entry::Segment::kProtected) {
    protected_.splice(protected_.begin(), protected_, e->host_pos);
    return;
  }
  // A second use: promote, and push the protected segment's oldest back
  // into probation if it has grown past its share.
  Unlink(e);
  protected_.push_front(e);
  e->host_pos = protected_.begin();
  e->segment = Entry::Segment::kProtected;
  protected_bytes_ += e->len;
  const auto limit = static_cast<uint64_t>(kProtectedShare * static_cast<double>(options_.host_capacity));
  while (protected_bytes_ > limit && protected_.size() > 1) {
    Entry* old = protected_.back();
    Unlink(old);
    probation_.push_front(old);
    old->host_pos = probation_.begin();
    old->segment = Entry::Segment::kProbation;
  }
}

bool ChunkCache::MakeGpuRoom(size_t len) {
  while (gpu_used_ + len > options_.gpu_capacity) {
    Entry* victim = nullptr;
    for (auto it = gpu_lru_.rbegin(); it != gpu_lru_.rend(); ++it) {
      if (!(*it)->gpu_pinned && !(*it)->filling) {
        victim = *it;
        break;
      }
    }
    if (victim == nullptr) return false;
    options_.device->Free(victim->gpu);
    victim->gpu = nullptr;
    gpu_lru_.erase(victim->gpu_pos);
    victim->in_gpu_lru = false;
    gpu_used_ -= victim->len;
    ++stats_.gpu.evictions;
    if (victim->host == nullptr) Erase(victim);
  }
  return true;
}

void ChunkCache::DemoteToGpu(Entry* e) {
  if (options_.gpu_capacity == 0 || e->gpu != nullptr || !MakeGpuRoom(e->len)) return;
  void* p = options_.device->Allocate(e->len);
  if (p == nullptr) {
    // The device is out of memory (another process took it): shrink the
    // tier to what it holds and go on.
    spdlog::warn("GPU tier: {} refused {} bytes; shrinking the tier from {} to {} bytes",
                 options_.device->Describe(), e->len, options_.gpu_capacity, gpu_used_);
    options_.gpu_capacity = gpu_used_;
    return;
  }
  if (Status s = options_.device->CopyToDevice(p, e->host, e->len); !s.ok()) {
    spdlog::warn("GPU tier: {}", s.message());
    options_.device->Free(p);
    return;
  }
  e->gpu = p;
  gpu_lru_.push_front(e);
  e->gpu_pos = gpu_lru_.begin();
  e->in_gpu_lru = true;
  gpu_used_ += e->len;
  ++stats_.gpu.fills;
}

bool ChunkCache::EvictOneHost(std::unique_lock<std::mutex>&) {
  auto evictable = [](const Entry* e) { return e->refs == 0 && !e->host_pinned && !e->filling; };
  Entry* victim = nullptr;
  for (auto* list : {&probation_, &protected_}) {
    for (auto it = list->rbegin(); it != list->rend() && victim == nullptr; ++it) {
      if (evictable(*it)) victim = *it;
    }
    if (victim) break;
  }
  if (victim == nullptr) return false;
  DemoteToGpu(victim);
  Unlink(victim);
  host_.Give(victim->host);
  victim->host = nullptr;
  host_used_ -= kChunkSize;
  ++stats_.host.evictions;
  if (victim->gpu == nullptr) Erase(victim);
  return true;
}

uint8_t* ChunkCache::TakeHostSlot(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    if (uint8_t* slot = host_.Take()) return slot;
    if (!EvictOneHost(lock)) return nullptr;
  }
}

Result<ChunkCache::Entry*> ChunkCache::Acquire(const ChunkKey& key, size_t len, const FillFn& fill, Use use,
                                               std::unique_lock<std::mutex>& lock) {
  for (;;) {
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      Entry* e = it->second.get();
      if (e->filling) {
        filled_.wait(lock);
        continue;
      }
      if (e->host != nullptr) {
        if (use == Use::kRead) {
          ++stats_.host.hits;
          if (e->readahead) {
            e->readahead = false;
            ++stats_.readahead_hits;
          }
          Touch(e);
        }
        ++e->refs;
        return e;
      }
      // Only in the GPU tier: copy it back into a host slot.
      e->filling = true;
      uint8_t* slot = TakeHostSlot(lock);
      Status copied = slot ? options_.device->CopyToHost(slot, e->gpu, e->len)
                           : Status::Full("host tier full of pinned or busy chunks");
      if (!copied.ok()) {
        if (slot) host_.Give(slot);
        e->filling = false;
        filled_.notify_all();
        return copied;
      }
      ++stats_.gpu.hits;
      e->host = slot;
      host_used_ += kChunkSize;
      probation_.push_front(e);
      e->host_pos = probation_.begin();
      e->segment = Entry::Segment::kProbation;
      if (!e->gpu_pinned) {  // it lives in the host tier again; a pinned copy stays on the device
        options_.device->Free(e->gpu);
        e->gpu = nullptr;
        gpu_lru_.erase(e->gpu_pos);
        e->in_gpu_lru = false;
        gpu_used_ -= e->len;
      }
      e->filling = false;
      filled_.notify_all();
      ++e->refs;
      return e;
    }

    if (use == Use::kRead) {
      ++stats_.host.misses;
      if (stats_.gpu_enabled) ++stats_.gpu.misses;
    }
    auto owned = std::make_unique<Entry>();
    Entry* e = owned.get();
    e->key = key;
    e->len = len;
    e->filling = true;
    entries_.emplace(key, std::move(owned));
    uint8_t* slot = TakeHostSlot(lock);
    if (slot == nullptr) {
      Erase(e);
      filled_.notify_all();
      return Status::Full("host tier full of pinned or busy chunks");
    }
    lock.unlock();
    Status s = fill(slot, len);
    lock.lock();
    if (!s.ok()) {
      host_.Give(slot);
      Erase(e);
      filled_.notify_all();
      return s;
    }
    e->host = slot;
    host_used_ += kChunkSize;
    e->readahead = use == Use::kReadAhead;
    probation_.push_front(e);
    e->host_pos = probation_.begin();
    e->segment = Entry::Segment::kProbation;
    e->filling = false;
    ++stats_.host.fills;
    if (use == Use::kReadAhead) ++stats_.readahead_fills;
    if (use == Use::kPreload) ++stats_.preload_fills;
    filled_.notify_all();
    ++e->refs;
    return e;
  }
}

Result<ChunkCache::Ref> ChunkCache::Get(const ChunkKey& key, size_t len, const FillFn& fill, bool readahead) {
  std::unique_lock lock(mu_);
  auto e = Acquire(key, len, fill, readahead ? Use::kReadAhead : Use::kRead, lock);
  if (e.ok()) {
    Ref r;
    r.cache_ = this;
    r.entry_ = *e;
    r.data_ = (*e)->host;
    r.size_ = len;
    return r;
  }
  if (e.status().code() != Status::Code::kFull) return e.status();
  // No slot could be freed: serve this read from a private buffer.
  ++stats_.uncached_reads;
  lock.unlock();
  Ref r;
  r.owned_.reset(new uint8_t[len]);
  if (Status s = fill(r.owned_.get(), len); !s.ok()) return s;
  r.data_ = r.owned_.get();
  r.size_ = len;
  return r;
}

Status ChunkCache::Load(const ChunkKey& key, size_t len, const FillFn& fill, Tier tier, bool pin) {
  std::unique_lock lock(mu_);
  if (tier == Tier::kHost) {
    auto it = entries_.find(key);
    const bool already = it != entries_.end() && it->second->host_pinned;
    if (pin && !already &&
        host_pinned_ + kChunkSize + kUnpinnedReserveSlots * kChunkSize > options_.host_capacity) {
      return Status::Error("pinning would exceed the host cache (" + std::to_string(host_pinned_) +
                           " bytes pinned of cache_size=" + std::to_string(options_.host_capacity) +
                           "); unpin something or raise cache_size");
    }
    auto e = Acquire(key, len, fill, Use::kPreload, lock);
    if (!e.ok()) return e.status();
    if (pin && !(*e)->host_pinned) {
      (*e)->host_pinned = true;
      host_pinned_ += kChunkSize;
    }
    --(*e)->refs;
    return Status::Ok();
  }

  if (options_.gpu_capacity == 0) return Status::Error("no GPU tier on this mount (mount with gpu=INDEX)");
  for (;;) {
    auto it = entries_.find(key);
    Entry* e = it == entries_.end() ? nullptr : it->second.get();
    if (e && e->filling) {
      filled_.wait(lock);
      continue;
    }
    if (e && e->gpu) {
      if (pin && !e->gpu_pinned) {
        if (gpu_pinned_ + len > options_.gpu_capacity) {
          return Status::Error("pinning would exceed gpu_cache_size (" + std::to_string(gpu_pinned_) +
                               " bytes pinned)");
        }
        e->gpu_pinned = true;
        gpu_pinned_ += len;
      }
      gpu_lru_.splice(gpu_lru_.begin(), gpu_lru_, e->gpu_pos);
      return Status::Ok();
    }
    if (pin && gpu_pinned_ + len > options_.gpu_capacity) {
      return Status::Error("pinning would exceed gpu_cache_size (" + std::to_string(gpu_pinned_) + " bytes pinned)");
    }
    // Get verified bytes (from the host tier or the source), then copy them over.
    auto got = Acquire(key, len, fill, Use::kPreload, lock);
    if (!got.ok()) return got.status();
    e = *got;
    if (!MakeGpuRoom(len)) {
      --e->refs;
      return Status::Error("the GPU tier is full of pinned chunks");
    }
    void* p = options_.device->Allocate(len);
    if (p == nullptr) {
      --e->refs;
      return Status::Error(options_.device->Describe() + " refused " + std::to_string(len) + " bytes");
    }
    Status s = options_.device->CopyToDevice(p, e->host, len);
    --e->refs;
    if (!s.ok()) {
      options_.device->Free(p);
      return s;
    }
    e->gpu = p;
    gpu_lru_.push_front(e);
    e->gpu_pos = gpu_lru_.begin();
    e->in_gpu_lru = true;
    gpu_used_ += len;
    ++stats_.gpu.fills;
    if (pin) {
      e->gpu_pinned = true;
      gpu_pinned_ += len;
    }
    return Status::Ok();
  }
}

uint64_t ChunkCache::Unpin(const Sha256Digest& file) {
  std::lock_guard lock(mu_);
  uint64_t bytes = 0;
  for (auto& [key, e] : entries_) {
    if (key.file != file) continue;
    if (e->host_pinned) {
      e->host_pinned = false;
      host_pinned_ -= kChunkSize;
      bytes += e->len;
    }
    if (e->gpu_pinned) {
      e->gpu_pinned = false;
      gpu_pinned_ -= e->len;
      bytes += e->len;
    }
  }
  return bytes;
}

uint64_t ChunkCache::Evict(const Sha256Digest& file) {
  std::lock_guard lock(mu_);
  uint64_t bytes = 0;
  std::vector<Entry*> victims;
  for (auto& [key, e] : entries_) {
    if (key.file == file && e->refs == 0 && !e->filling) victims.push_back(e.get());
  }
  for (Entry* e : victims) {
    if (e->host_pinned) host_pinned_ -= kChunkSize;
    if (e->gpu_pinned) gpu_pinned_ -= e->len;
    if (e->host) {
      host_.Give(e->host);
      host_used_ -= kChunkSize;
      bytes += e->len;
    }
    if (e->gpu) {
      options_.device->Free(e->gpu);
      gpu_used_ -= e->len;
      bytes += e->len;
    }
    Erase(e);
  }
  return bytes;
}

ChunkCache::Residency ChunkCache::ResidentBytes(const Sha256Digest& file) const {
  std::lock_guard lock(mu_);
  Residency r;
  for (const auto& [key, e] : entries_) {
    if (key.file != file || e->filling) continue;
    if (e->host) r.host += e->len;
    if (e->gpu) r.gpu += e->len;
    if (e->host_pinned || e->gpu_pinned) r.pinned += e->len;
  }
  return r;
}

std::map<Sha256Digest, ChunkCache::Residency> ChunkCache::ResidencyByFile() const {
  std::lock_guard lock(mu_);
  std::map<Sha256Digest, Residency> out;
  for (const auto& [key, e] : entries_) {
    if (e->filling) continue;
    Residency& r = out[key.file];
    if (e->host) r.host += e->len;
    if (e->gpu) r.gpu += e->len;
    if (e->host_pinned || e->gpu_pinned) r.pinned += e->len;
  }
  return out;
}

void ChunkCache::CountVerificationFailure() {
  std::lock_guard lock(mu_);
  ++stats_.verification_failures;
}

CacheStats ChunkCache::Stats() const {
  std::lock_guard lock(mu_);
  CacheStats s = stats_;
  s.host.capacity = options_.host_capacity;
  s.host_pinned_memory = host_.pinned();
  s.host.used = host_used_;
  s.host.pinned = host_pinned_;
  s.gpu.capacity = options_.gpu_capacity;
  s.gpu.used = gpu_used_;
  s.gpu.pinned = gpu_pinned_;
  return s;
}

}  // namespace ckptfs
