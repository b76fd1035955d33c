#include "ckptfs/file_cache.h"
#include "ckptfs/mutex.h"

#include <unistd.h>

#include <cstring>

#include <spdlog/spdlog.h>

namespace ckptfs {

uint64_t PageBytes(uint64_t size) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

// A pinned copy's pages, locked for as long as this lives: registered with
// the gpu= device, or else mlocked.
class FileCache::PageLock {
 public:
  PageLock(FileCache& cache, CopyPtr copy) : cache_(cache), copy_(std::move(copy)) {
    const uint64_t bytes = PageBytes(copy_->size());
    if (cache_.device_ != nullptr && copy_->data() != nullptr && !copy_->in_memory()) {
      Status s = cache_.device_->RegisterHost(copy_->data(), copy_->size());
      if (s.ok()) {
        registered_ = true;
        cache_.registered_ += bytes;
        return;
      }
      if (!cache_.register_warned_.exchange(true)) {
        spdlog::warn("cannot register {} with {} ({}); pinned files are locked with mlock instead", copy_->name(),
                     cache_.device_->Describe(), s.message());
      }
    }
    if (const int err = copy_->Lock(); err != 0) {
      cache_.locked_memory_ = false;
      if (!cache_.lock_warned_.exchange(true)) {
        spdlog::warn("cannot lock {} in memory ({}); pinned files stay resident but unlocked (raise RLIMIT_MEMLOCK, "
                     "e.g. LimitMEMLOCK=infinity in the systemd unit)",
                     copy_->name(), std::strerror(err));
      }
    }
  }
  ~PageLock() {
    if (!registered_) {
      copy_->Unlock();
      return;
    }
    cache_.device_->UnregisterHost(copy_->data());
    cache_.registered_ -= PageBytes(copy_->size());
  }
  PageLock(const PageLock&) = delete;
  PageLock& operator=(const PageLock&) = delete;

 private:
  FileCache& cache_;
  const CopyPtr copy_;
  bool registered_ = false;
};

FileCache::FileCache(uint64_t capacity, DeviceMemory* device, uint64_t descriptor_budget)
    : capacity_(capacity), device_(device), descriptor_budget_(descriptor_budget) {}

// The reserve's thread first: it calls LendToReserve. Then the page
// locks: each one updates registered_ and locked_memory_ as it goes, which
// are destroyed before page_locks_ would be.
FileCache::~FileCache() {
  if (reserve_) reserve_->StopGrowing();
  reserve_.reset();
  page_locks_.clear();
}

FileCache::Released::~Released() {
  copies.clear();  // their pages go back to the kernel here, unless a reader holds them
  descriptors.clear();
  if (trim != nullptr) trim->Trim();
  if (wake != nullptr) wake->Wake();
}

void FileCache::KeepPageReserve(std::unique_ptr<PageReserve> reserve, PageReserve::Pace pace) {
  reserve_ = std::move(reserve);
  reserve_->StartGrowing([this] { return LendToReserve(); }, pace);
}

uint64_t FileCache::SpareReserveBytes() const {
  if (!reserve_) return 0;
  const uint64_t lent = reserve_->target() * PageReserve::kPageBytes;
  return lent > reserve_promised_ ? lent - reserve_promised_ : 0;
}

uint64_t FileCache::PromisableReserveBytes() const {
  if (!reserve_) return 0;
  const uint64_t held = std::min(reserve_->target(), reserve_->pages()) * PageReserve::kPageBytes;
  return held > reserve_promised_ ? held - reserve_promised_ : 0;
}

void FileCache::ReclaimSpareReserve(uint64_t bytes, Released& released) {
  const uint64_t spare = SpareReserveBytes();
  if (spare == 0 || Taken() + bytes <= capacity_) return;
  const uint64_t short_by = Taken() + bytes - capacity_;
  const uint64_t pages = (std::min(spare, short_by) + PageReserve::kPageBytes - 1) / PageReserve::kPageBytes;
  reserve_->Lower(pages);
  released.trim = reserve_.get();
}

void FileCache::EndLease(Reservation& fill, Released& released) {
  reserve_promised_ -= fill.lease_;
  fill.lease_ = 0;
  // Pages its copy did not use are spare again, and may not fit beside it.
  ReclaimSpareReserve(0, released);
}

bool FileCache::LendToReserve() {
  MutexLock lock(mu_);
  if (!reserve_ || reserved_ > 0 || reserve_->target() >= reserve_->limit_pages()) return false;
  if (Taken() + PageReserve::kPageBytes > capacity_) return false;
  reserve_->Raise(1);
  return true;
}

uint64_t FileCache::TakeFromReserve(Reservation& fill, uint64_t chunk_bytes, uint64_t huge_bytes) {
  constexpr uint64_t kPage = PageReserve::kPageBytes;
  if (!fill.promised_reserve_pages()) return 0;  // without the lock every open takes: most fills
  uint64_t freed = 0;
  {
    MutexLock lock(mu_);
    if (!reserve_ || fill.lease_ == 0) return 0;
    const uint64_t release = std::min(fill.lease_, (chunk_bytes + kPage - 1) / kPage * kPage);
    fill.lease_ -= release;
    reserve_promised_ -= release;
    freed = reserve_->Lower(release / kPage) * kPage;  // fewer if the reserve gave pages back meanwhile
  }
  if (freed > 0) reserve_->Trim();
  return std::min(freed, huge_bytes / kPage * kPage);
}

uint64_t FileCache::PlaceReservePages(Reservation& fill, SealedCopy& copy, uint64_t offset, uint64_t len,
                                      bool in_place) {
  if (!fill.promised_reserve_pages()) return 0;
  const uint64_t freed = TakeFromReserve(fill, len, in_place ? copy.HugePagesAt(offset, len) : 0);
  return freed > 0 && copy.PlaceHugePages(offset, freed) ? freed : 0;
}

FileCache::Reservation::~Reservation() {
  if (!published_ && cache_ != nullptr) cache_->Abandon(*this);
}

FileCache::CopyPtr FileCache::Find(const FileKey& key, bool use) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (use) ++counters_.misses;
    return nullptr;
  }
  if (use) {
    ++counters_.hits;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  return it->second.copy;
}

// The copy goes to `released` (see Released).
void FileCache::Drop(std::map<FileKey, Entry>::iterator it, Released& released) {
  const auto& copy = it->second.copy;
  const uint64_t bytes = PageBytes(copy->size());
  used_ -= bytes;
  if (it->second.pinned) pinned_ -= bytes;  // its pages are unlocked by the caller (Evict)
  // Readers may still hold it: then its pages stay in the budget, and its
  // descriptor counted, until they let go (SweepHeld).
  // (No FUSE open holds it when the count is 1, so none can be attaching
  // to it as the kernel is asked.) A copy whose readers the kernel would
  // not tell was never passed through: its descriptor can go.
  UniqueFd descriptor = copy->TakeDescriptor();
  if (descriptor.valid() && !copy->readers_visible()) {
    released.descriptors.push_back(std::move(descriptor));
  }
  const bool held =
      copy.use_count() > 1 || (descriptor.valid() && SealedCopy::OpenElsewhere(descriptor.get()));
  if (held) {
    held_bytes_ += bytes;
    if (!descriptor.valid() && it->second.descriptor) --descriptors_;
    held_.push_back(HeldCopy{copy, std::move(descriptor), bytes});
  } else {
    if (it->second.descriptor) --descriptors_;
    if (descriptor.valid()) released.descriptors.push_back(std::move(descriptor));
  }
  released.copies.push_back(std::move(it->second.copy));
  released.wake = reserve_.get();  // the copy's pages may be free in a moment: the reserve takes them
  lru_.erase(it->second.lru);
  entries_.erase(it);
  ++counters_.evictions;
}

// Evicts the least recently used unpinned copy other than `keep` (one that
// holds a descriptor, if asked); false when there is none.
bool FileCache::EvictOldest(bool holding_descriptor, const FileKey& keep, Released& released) {
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    const Entry& e = entries_.at(*it);
    if (*it == keep || e.pinned || (holding_descriptor && !e.descriptor) || InUse(e)) continue;
    Drop(entries_.find(*it), released);
    return true;
  }
  return false;
}

void FileCache::SweepHeld(Released& released) {
  // Each held copy whose daemon readers are gone costs the kernel a lease
  // and its release, under mu_, which every open takes: with many held
  // copies (a reader mapping thousands of small files) at most one sweep
  // per kSweepEvery, so that stats in a loop cannot stall the opens.
  constexpr size_t kSweepAlways = 64;
  constexpr auto kSweepEvery = std::chrono::milliseconds(100);
  const auto now = std::chrono::steady_clock::now();
  if (held_.size() > kSweepAlways && now - last_sweep_ < kSweepEvery) return;
  last_sweep_ = now;
  for (auto it = held_.begin(); it != held_.end();) {
    if (!it->copy.expired() || (it->descriptor.valid() && SealedCopy::OpenElsewhere(it->descriptor.get()))) {
      ++it;
      continue;
    }
    held_bytes_ -= it->bytes;
    if (it->descriptor.valid()) {
      --descriptors_;
      released.descriptors.push_back(std::move(it->descriptor));
    }
    released.wake = reserve_.get();  // its pages are free in a moment, as an evicted copy's
    it = held_.erase(it);
  }
}

// Only the daemon's readers: the kernel is not asked about a resident copy,
// which an open may be attaching to at that very moment (see
// SealedCopy::OpenElsewhere). A copy that only a mapping holds may
// therefore be evicted in vain; it then stays in the budget as held.
bool FileCache::InUse(const Entry& e) { return e.copy.use_count() > 1; }

uint64_t FileCache::InUse() const {
  uint64_t bytes = 0;
  for (const auto& [key, e] : entries_) {
    if (!e.pinned && InUse(e)) bytes += PageBytes(e.copy->size());
  }
  return bytes;
}

size_t FileCache::DescriptorsNoEvictionFrees(const FileKey& keep) const {
  size_t freed = 0;
  for (const auto& [key, e] : entries_) {
    if (e.descriptor && key != keep && !e.pinned && !InUse(e)) ++freed;
  }
  return descriptors_ - freed;
}

Status FileCache::NoRoomForBytes() const {
  return Status::Full("no room in the host tier: " + std::to_string(Taken()) + " of " + std::to_string(capacity_) +
                      " bytes are in copies in use or pinned, being filled, or held by readers of evicted copies (" +
                      std::to_string(held_bytes_) + " bytes)");
}

Status FileCache::NoRoomForDescriptor() const {
  return Status::Full("no descriptor for another copy in the host tier: " + std::to_string(descriptors_) + " of " +
                      std::to_string(descriptor_budget_) + " are held by pinned copies, fills or readers");
}

Status FileCache::MakeRoom(uint64_t bytes, bool descriptor, const FileKey& keep, Released& released) {
  // Evicting cannot free what is pinned, being filled, held by readers or
  // in use: when that leaves no room, in bytes or in descriptors, evict
  // nothing (not copies for bytes, then refuse for want of a descriptor).
  if (Taken() + bytes > capacity_ && pinned_ + reserved_ + held_bytes_ + InUse() + bytes > capacity_) {
    return NoRoomForBytes();
  }
  if (descriptor && descriptors_ + 1 > descriptor_budget_ &&
      DescriptorsNoEvictionFrees(keep) + 1 > descriptor_budget_) {
    return NoRoomForDescriptor();
  }
  // The claim can be made: the reserve's spare pages are free room lent
  // out, taken back before anything is evicted.
  ReclaimSpareReserve(bytes, released);
  if (Taken() + bytes > capacity_) {
    std::vector<FileKey> oldest_first(lru_.rbegin(), lru_.rend());
    for (const FileKey& k : oldest_first) {
      if (Taken() + bytes <= capacity_) break;
      auto it = entries_.find(k);
      if (k == keep || it->second.pinned || InUse(it->second)) continue;
      Drop(it, released);
    }
    if (Taken() + bytes > capacity_) return NoRoomForBytes();
  }
  while (descriptor && descriptors_ + 1 > descriptor_budget_) {
    if (!EvictOldest(/*holding_descriptor=*/true, keep, released)) return NoRoomForDescriptor();
  }
  return Status::Ok();
}

Result<FileCache::Claimed> FileCache::Claim(const FileKey& key, uint64_t size, bool pin, bool wait, Room room,
                                            bool take_reserve) {
  const uint64_t bytes = PageBytes(size);
  const bool descriptor = SealedCopy::NeedsDescriptor(size);
  Released released;  // declared before the lock: let go of after it
  MutexLock lock(mu_);
  if (Taken() + bytes > capacity_ || (descriptor && descriptors_ + 1 > descriptor_budget_)) {
    SweepHeld(released);  // only when room is short
  }
  for (;;) {
    if (auto it = entries_.find(key); it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return Claimed{it->second.copy, nullptr};
    }
    if (!filling_.count(key)) break;
    if (!wait) return Claimed{};
    filled_.Wait(mu_);
  }
  if (pin && pinned_ + bytes > capacity_) return PinRefused();
  if (bytes > capacity_) {
    return Status::Full("the file (" + std::to_string(size) + " bytes) is larger than the host tier (" +
                        std::to_string(capacity_) + " bytes)");
  }
  // The reserve's pages this fill can use are promised to it: they leave
  // the spare room, and come back if the claim fails.
  const uint64_t lease =
      take_reserve ? std::min(PromisableReserveBytes(), bytes / PageReserve::kPageBytes * PageReserve::kPageBytes) : 0;
  reserve_promised_ += lease;
  Status room_made = Status::Ok();
  // Free room counts the reserve's spare pages (taken back below only for
  // a claim that will then fit).
  if (room == Room::kFreeOnly &&
      (Taken() - SpareReserveBytes() + bytes > capacity_ || (descriptor && descriptors_ + 1 > descriptor_budget_))) {
    room_made =
        Status::Full("no free room in the host tier: " + std::to_string(Taken()) + " of " + std::to_string(capacity_) +
                     " bytes and " + std::to_string(descriptors_) + " of " + std::to_string(descriptor_budget_) +
                     " descriptors are used, being filled or held by readers");
  }
  if (room_made.ok()) room_made = MakeRoom(bytes, descriptor, key, released);
  if (!room_made.ok()) {
    reserve_promised_ -= lease;
    return room_made;
  }
  reserved_ += bytes;
  if (descriptor) ++descriptors_;
  filling_.insert(key);
  std::unique_ptr<Reservation> fill(new Reservation(this, key, bytes, descriptor, pin));
  fill->lease_ = lease;
  fill->promised_at_claim_ = lease > 0;
  return Claimed{nullptr, std::move(fill)};
}

Status FileCache::PinRefused() const {
  return Status::Full("pinning would exceed the host tier (" + std::to_string(pinned_) + " bytes pinned of " +
                      std::to_string(capacity_) + " for whole files); unpin something or raise cache_size");
}

void FileCache::Abandon(Reservation& fill) {
  Released released;
  MutexLock lock(mu_);
  reserved_ -= fill.bytes_;
  EndLease(fill, released);
  if (fill.descriptor_) --descriptors_;
  filling_.erase(fill.key_);
  ++counters_.fills_abandoned;
  filled_.NotifyAll();
}

void FileCache::MarkPinned(Entry& e) {
  if (e.pinned) return;
  e.pinned = true;
  pinned_ += PageBytes(e.copy->size());
}

// Locks the pages of `key`'s copy if it is (still) pinned and not locked
// yet. Under pin_mu_ only: Unpin and Evict, which unlock, wait for it.
void FileCache::LockPages(const FileKey& key) {
  MutexLock pin_lock(pin_mu_);
  CopyPtr copy;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || !it->second.pinned) return;
    copy = it->second.copy;
  }
  if (page_locks_.count(copy.get())) return;
  page_locks_.emplace(copy.get(), std::make_unique<PageLock>(*this, copy));
}

FileCache::CopyPtr FileCache::Publish(std::unique_ptr<Reservation> fill, std::unique_ptr<SealedCopy> copy) {
  return Publish(std::move(fill), std::shared_ptr<SealedCopy>(std::move(copy)));
}

FileCache::CopyPtr FileCache::Publish(std::unique_ptr<Reservation> fill, std::shared_ptr<SealedCopy> copy) {
  const bool pin = fill->pin_;
  const FileKey key = fill->key_;
  CopyPtr published = Admit(std::move(fill), std::move(copy));
  if (pin) LockPages(key);
  return published;
}

FileCache::CopyPtr FileCache::PublishAs(std::unique_ptr<Reservation> fill, const FileKey& key,
                                        std::unique_ptr<SealedCopy> copy) {
  bool taken = false;
  CopyPtr resident;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(key);
    taken = it != entries_.end() || filling_.count(key) > 0;
    if (taken) {
      if (it != entries_.end()) resident = it->second.copy;
    } else {
      filling_.erase(fill->key_);
      fill->key_ = key;
      filling_.insert(key);
    }
  }
  if (taken) return resident;  // `fill` gives its room back as it goes
  return Publish(std::move(fill), std::move(copy));
}

FileCache::CopyPtr FileCache::Admit(std::unique_ptr<Reservation> fill, std::shared_ptr<SealedCopy> copy) {
  Released released;
  MutexLock lock(mu_);
  fill->published_ = true;
  reserved_ -= fill->bytes_;
  // The reserved descriptor becomes the copy's; a copy made otherwise than
  // its size suggests is counted as it is.
  const bool descriptor = copy->holds_descriptor();
  if (fill->descriptor_ != descriptor) descriptor ? ++descriptors_ : --descriptors_;
  filling_.erase(fill->key_);
  filled_.NotifyAll();
  ++counters_.fills;
  counters_.fill_bytes += copy->size();
  counters_.fill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - fill->start_).count();
  lru_.push_front(fill->key_);
  Entry& e = entries_[fill->key_];
  e.copy = std::move(copy);
  e.descriptor = descriptor;
  e.lru = lru_.begin();
  used_ += PageBytes(e.copy->size());
  if (fill->pin_) MarkPinned(e);
  EndLease(*fill, released);
  return e.copy;
}

Status FileCache::Pin(const FileKey& key) {
  {
    MutexLock lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return Status::NotFound("not resident in the host tier");
    if (!it->second.pinned && pinned_ + PageBytes(it->second.copy->size()) > capacity_) return PinRefused();
    MarkPinned(it->second);
  }
  LockPages(key);
  return Status::Ok();
}

uint64_t FileCache::Unpin(const Sha256Digest& sha256) {
  MutexLock pin_lock(pin_mu_);
  std::vector<const SealedCopy*> unpinned;
  uint64_t bytes = 0;
  {
    MutexLock lock(mu_);
    for (auto it = entries_.lower_bound(FileKey{sha256, ""}); it != entries_.end() && it->first.sha256 == sha256;
         ++it) {
      if (!it->second.pinned) continue;
      it->second.pinned = false;
      pinned_ -= PageBytes(it->second.copy->size());
      bytes += it->second.copy->size();
      unpinned.push_back(it->second.copy.get());
    }
  }
  for (const SealedCopy* c : unpinned) page_locks_.erase(c);
  return bytes;
}

uint64_t FileCache::Evict(const Sha256Digest& sha256) {
  MutexLock pin_lock(pin_mu_);
  Released dropped;
  uint64_t bytes = 0;
  {
    MutexLock lock(mu_);
    for (auto it = entries_.lower_bound(FileKey{sha256, ""}); it != entries_.end() && it->first.sha256 == sha256;) {
      bytes += it->second.copy->size();
      Drop(it++, dropped);
    }
  }
  for (const CopyPtr& c : dropped.copies) page_locks_.erase(c.get());
  return bytes;
}

size_t FileCache::ShedDescriptors(size_t count) {
  Released released;
  MutexLock lock(mu_);
  SweepHeld(released);
  size_t shed = 0;
  while (shed < count && EvictOldest(/*holding_descriptor=*/true, FileKey{}, released)) ++shed;
  return shed;
}

FileCache::Stats FileCache::GetStats() {
  Released released;
  MutexLock lock(mu_);
  SweepHeld(released);
  Stats s = counters_;
  s.locked_memory = locked_memory_.load();
  s.registered = registered_.load();
  s.capacity = capacity_;
  s.used = used_;
  s.filling = reserved_;
  s.pinned = pinned_;
  s.files = entries_.size();
  s.descriptors = descriptors_;
  s.descriptor_budget = descriptor_budget_;
  for (const auto& [key, e] : entries_) s.in_memory += e.copy->in_memory() ? 1 : 0;
  s.held_by_readers = held_bytes_;
  if (reserve_) {
    s.page_reserve = true;
    s.reserve = reserve_->GetStats();
    s.reserve_promised = reserve_promised_;
  }
  return s;
}

const char* FileCache::name() const { return "host"; }

bool FileCache::CopyOut(const Sha256Digest& file, uint64_t offset, size_t len, uint8_t* dst) const {
  CopyPtr copy;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(FileKey{file, ""});
    if (it == entries_.end()) return false;
    copy = it->second.copy;  // kept alive past the lock, the copy made outside it
  }
  if (copy->data() == nullptr || offset > copy->size() || len > copy->size() - offset) return false;
  std::memcpy(dst, copy->data() + offset, len);
  return true;
}

std::map<Sha256Digest, CacheTier::Residency> FileCache::ResidencyByFile() const {
  MutexLock lock(mu_);
  std::map<Sha256Digest, Residency> out;
  for (const auto& [key, e] : entries_) {
    Residency& r = out[key.sha256];
    r.bytes += e.copy->size();
    if (e.pinned) r.pinned += e.copy->size();
  }
  return out;
}

}  // namespace ckptfs
