#include "chunk_slots.h"

#include <utility>

#include "ckptfs/mutex.h"

namespace ckptfs {

namespace {
// The protected segment may hold this share of the tier.
constexpr double kProtectedShare = 0.8;
// Pins leave at least this many slots for ordinary reads.
constexpr uint64_t kUnpinnedReserveSlots = 2;
}  // namespace

struct ChunkSlot {
  enum class Segment { kNone, kProbation, kProtected };
  ChunkKey key;
  size_t len = 0;
  bool filling = false;  // claimed and not yet committed; others wait
  uint8_t* slot = nullptr;
  int refs = 0;
  bool pinned = false;
  bool readahead = false;  // filled ahead of the reader and not read yet
  Segment segment = Segment::kNone;
  std::list<ChunkSlot*>::iterator pos;
};

ChunkSlots::ChunkSlots(Options options)
    : options_(std::move(options)), memory_(options_.capacity, kChunkSize) {
  counters_.tier.capacity = options_.capacity;
}

ChunkSlots::~ChunkSlots() = default;

ChunkClaim::ChunkClaim(ChunkClaim&& o) noexcept
    : slots_(std::exchange(o.slots_, nullptr)),
      entry_(std::exchange(o.entry_, nullptr)),
      filling_(std::exchange(o.filling_, false)) {}

ChunkClaim& ChunkClaim::operator=(ChunkClaim&& o) noexcept {
  if (this != &o) {
    Reset();
    slots_ = std::exchange(o.slots_, nullptr);
    entry_ = std::exchange(o.entry_, nullptr);
    filling_ = std::exchange(o.filling_, false);
  }
  return *this;
}

ChunkClaim::~ChunkClaim() { Reset(); }

void ChunkClaim::Reset() {
  if (entry_ == nullptr) return;
  if (filling_) {
    slots_->Abort(entry_);
  } else {
    slots_->Release(entry_);
  }
  entry_ = nullptr;
  slots_ = nullptr;
  filling_ = false;
}

uint8_t* ChunkClaim::data() const { return entry_ != nullptr ? entry_->slot : nullptr; }

size_t ChunkClaim::length() const { return entry_ != nullptr ? entry_->len : 0; }

void ChunkClaim::Commit(Use use, bool from_source) {
  if (entry_ == nullptr || !filling_) return;
  slots_->Commit(entry_, use, from_source);
  filling_ = false;
}

void ChunkClaim::Pin() {
  if (present()) slots_->Pin(entry_);
}

void ChunkSlots::Unlink(Entry& e) {
  if (e.segment == Entry::Segment::kProbation) probation_.erase(e.pos);
  if (e.segment == Entry::Segment::kProtected) {
    protected_.erase(e.pos);
    protected_bytes_ -= e.len;
  }
  e.segment = Entry::Segment::kNone;
}

void ChunkSlots::PushProbation(Entry& e) {
  probation_.push_front(&e);
  e.pos = probation_.begin();
  e.segment = Entry::Segment::kProbation;
}

void ChunkSlots::Touch(Entry& e) {
  if (e.segment == Entry::Segment::kProtected) {
    protected_.splice(protected_.begin(), protected_, e.pos);
    return;
  }
  // A second use: promote, and push the protected segment's oldest back
  // into probation if it has grown past its share.
  Unlink(e);
  protected_.push_front(&e);
  e.pos = protected_.begin();
  e.segment = Entry::Segment::kProtected;
  protected_bytes_ += e.len;
  const auto limit = static_cast<uint64_t>(kProtectedShare * static_cast<double>(options_.capacity));
  while (protected_bytes_ > limit && protected_.size() > 1) {
    Entry* old = protected_.back();
    Unlink(*old);
    PushProbation(*old);
  }
}

void ChunkSlots::CountHitLocked(Entry& e, Use use) {
  if (use != Use::kRead) return;
  ++counters_.tier.hits;
  if (e.readahead) {
    e.readahead = false;
    ++counters_.readahead_hits;
  }
  Touch(e);
}

// The slot of the least recently used chunk nobody reads, fills or pinned,
// taken out of the tier; null when there is none.
uint8_t* ChunkSlots::TakeVictimLocked() {
  auto evictable = [](const Entry* e) { return e->refs == 0 && !e->pinned && !e->filling; };
  for (auto* list : {&probation_, &protected_}) {
    for (auto it = list->rbegin(); it != list->rend(); ++it) {
      if (!evictable(*it)) continue;
      Entry& e = **it;
      uint8_t* slot = e.slot;
      const ChunkKey key = e.key;  // e dies with its map entry
      Unlink(e);
      counters_.tier.used -= kChunkSize;
      ++counters_.tier.evictions;
      entries_.erase(key);
      return slot;
    }
  }
  return nullptr;
}

// A free slot: a new one from HostMemory while the tier has room (its slab
// mapped without this tier's lock), else a victim's.
uint8_t* ChunkSlots::TakeSlot() {
  if (uint8_t* slot = memory_.Take()) return slot;
  MutexLock lock(mu_);
  return TakeVictimLocked();
}

Result<ChunkClaim> ChunkSlots::Claim(const ChunkKey& key, size_t len, Use use) {
  MutexLock lock(mu_);
  bool waited = false;
  for (;;) {
    auto it = entries_.find(key);
    if (it == entries_.end()) break;
    Entry& e = *it->second;
    if (e.filling) {
      if (!std::exchange(waited, true)) ++counters_.tier.fill_waits;
      filled_.Wait(mu_);
      continue;
    }
    CountHitLocked(e, use);
    ++e.refs;
    return ChunkClaim(this, &e, /*filling=*/false);
  }
  if (use == Use::kRead) ++counters_.tier.misses;
  auto owned = std::make_unique<Entry>();
  Entry* e = owned.get();
  e->key = key;
  e->len = len;
  e->filling = true;
  entries_.emplace(key, std::move(owned));
  lock.Unlock();
  uint8_t* slot = TakeSlot();
  lock.Lock();
  if (slot == nullptr) {
    entries_.erase(key);
    filled_.NotifyAll();
    return Status::Full("the chunk tier is full of pinned or busy chunks");
  }
  e->slot = slot;
  counters_.tier.used += kChunkSize;
  return ChunkClaim(this, e, /*filling=*/true);
}

ChunkClaim ChunkSlots::Peek(const ChunkKey& key) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second->filling) return ChunkClaim();
  ++it->second->refs;
  return ChunkClaim(this, it->second.get(), /*filling=*/false);
}

void ChunkSlots::Commit(Entry* e, Use use, bool from_source) {
  MutexLock lock(mu_);
  e->filling = false;
  e->readahead = use == Use::kReadAhead && from_source;
  PushProbation(*e);
  if (from_source) {
    ++counters_.tier.fills;
    if (use == Use::kReadAhead) ++counters_.readahead_fills;
    if (use == Use::kPreload) ++counters_.preload_fills;
  }
  ++e->refs;
  filled_.NotifyAll();
}

void ChunkSlots::Abort(Entry* e) {
  uint8_t* slot = e->slot;
  {
    MutexLock lock(mu_);
    counters_.tier.used -= kChunkSize;
    entries_.erase(e->key);
    filled_.NotifyAll();
  }
  memory_.Give(slot);
}

void ChunkSlots::Release(Entry* e) {
  MutexLock lock(mu_);
  --e->refs;
}

Status ChunkSlots::CheckPinRoom(const ChunkKey& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second->pinned) return Status::Ok();
  if (pinned_ + kChunkSize + kUnpinnedReserveSlots * kChunkSize > options_.capacity) {
    return Status::Full("pinning would exceed the chunk tier (" + std::to_string(pinned_) +
                        " bytes pinned of " + std::to_string(options_.capacity) +
                        " for chunks); unpin something or raise cache_size");
  }
  return Status::Ok();
}

void ChunkSlots::Pin(Entry* e) {
  MutexLock lock(mu_);
  if (e->pinned) return;
  e->pinned = true;
  pinned_ += kChunkSize;
}

uint64_t ChunkSlots::Unpin(const Sha256Digest& file) {
  MutexLock lock(mu_);
  uint64_t bytes = 0;
  for (auto it = entries_.lower_bound(ChunkKey{file, 0}); it != entries_.end() && it->first.file == file; ++it) {
    Entry& e = *it->second;
    if (!e.pinned) continue;
    e.pinned = false;
    pinned_ -= kChunkSize;
    bytes += e.len;
  }
  return bytes;
}

uint64_t ChunkSlots::Evict(const Sha256Digest& file) {
  std::vector<uint8_t*> slots;
  uint64_t bytes = 0;
  {
    MutexLock lock(mu_);
    for (auto it = entries_.lower_bound(ChunkKey{file, 0}); it != entries_.end() && it->first.file == file;) {
      Entry& e = *it->second;
      if (e.refs > 0 || e.filling) {
        ++it;
        continue;
      }
      if (e.pinned) pinned_ -= kChunkSize;
      Unlink(e);
      counters_.tier.used -= kChunkSize;
      bytes += e.len;
      slots.push_back(e.slot);
      it = entries_.erase(it);
    }
  }
  for (uint8_t* slot : slots) memory_.Give(slot);
  return bytes;
}

void ChunkSlots::AddResidency(const Sha256Digest& file, CacheTier::Residency& r) const {
  MutexLock lock(mu_);
  for (auto it = entries_.lower_bound(ChunkKey{file, 0}); it != entries_.end() && it->first.file == file; ++it) {
    if (it->second->filling) continue;
    r.bytes += it->second->len;
    if (it->second->pinned) r.pinned += it->second->len;
  }
}

void ChunkSlots::AddResidency(std::map<Sha256Digest, CacheTier::Residency>& out) const {
  MutexLock lock(mu_);
  for (const auto& [key, e] : entries_) {
    if (e->filling) continue;
    CacheTier::Residency& r = out[key.file];
    r.bytes += e->len;
    if (e->pinned) r.pinned += e->len;
  }
}

ChunkSlots::Counters ChunkSlots::Stats() const {
  MutexLock lock(mu_);
  Counters c = counters_;
  c.tier.pinned = pinned_;
  c.memory_locked = memory_.pinned();
  return c;
}

}  // namespace ckptfs
