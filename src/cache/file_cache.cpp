#include "ckptfs/file_cache.h"

#include <unistd.h>

#include <cstring>

#include <spdlog/spdlog.h>

namespace ckptfs {

uint64_t PageBytes(uint64_t size) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

FileCache::FileCache(uint64_t capacity) : capacity_(capacity) {}

FileCache::Reservation::~Reservation() {
  if (!published_ && cache_ != nullptr) cache_->Abandon(*this);
}

FileCache::CopyPtr FileCache::Find(const FileKey& key, bool use) {
  std::lock_guard lock(mu_);
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

void FileCache::Drop(std::map<FileKey, Entry>::iterator it) {
  const auto& copy = it->second.copy;
  const uint64_t bytes = PageBytes(copy->size());
  used_ -= bytes;
  if (it->second.pinned) {
    pinned_ -= bytes;
    copy->Unlock();
  }
  // Readers may still hold it: remember it to count what they hold.
  if (copy.use_count() > 1) evicted_.push_back(copy);
  lru_.erase(it->second.lru);
  entries_.erase(it);
  ++counters_.evictions;
}

bool FileCache::MakeRoom(uint64_t bytes, const FileKey& keep) {
  auto victim = lru_.end();
  while (used_ + reserved_ + bytes > capacity_) {
    // The least recently used copy that is not pinned.
    victim = lru_.end();
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      if (*it != keep && !entries_.at(*it).pinned) {
        victim = std::prev(it.base());
        break;
      }
    }
    if (victim == lru_.end()) return false;
    Drop(entries_.find(*victim));
  }
  return true;
}

Result<FileCache::Claimed> FileCache::Claim(const FileKey& key, uint64_t size, bool pin, bool wait) {
  const uint64_t bytes = PageBytes(size);
  std::unique_lock lock(mu_);
  for (;;) {
    if (auto it = entries_.find(key); it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return Claimed{it->second.copy, nullptr};
    }
    if (!filling_.count(key)) break;
    if (!wait) return Claimed{};
    filled_.wait(lock);
  }
  if (pin && pinned_ + bytes > capacity_) return PinRefused();
  if (bytes > capacity_) {
    return Status::Full("the file (" + std::to_string(size) + " bytes) is larger than the host tier (" +
                        std::to_string(capacity_) + " bytes)");
  }
  if (!MakeRoom(bytes, key)) {
    return Status::Full("no room in the host tier: " + std::to_string(used_ + reserved_) + " of " +
                        std::to_string(capacity_) + " bytes are pinned or being filled");
  }
  reserved_ += bytes;
  filling_.insert(key);
  return Claimed{nullptr, std::unique_ptr<Reservation>(new Reservation(this, key, bytes, pin))};
}

Status FileCache::PinRefused() const {
  return Status::Full("pinning would exceed the host cache (" + std::to_string(pinned_) + " bytes pinned of " +
                      std::to_string(capacity_) + " for whole files); unpin something or raise cache_size");
}

void FileCache::Abandon(Reservation& fill) {
  std::lock_guard lock(mu_);
  reserved_ -= fill.bytes_;
  filling_.erase(fill.key_);
  ++counters_.fills_abandoned;
  filled_.notify_all();
}

void FileCache::PinLocked(Entry& e) {
  if (e.pinned) return;
  e.pinned = true;
  pinned_ += PageBytes(e.copy->size());
  if (const int err = e.copy->Lock(); err != 0) {
    counters_.locked_memory = false;
    if (!lock_warned_) {
      spdlog::warn("cannot lock {} in memory ({}); pinned files stay resident but unlocked (raise RLIMIT_MEMLOCK, "
                   "e.g. LimitMEMLOCK=infinity in the systemd unit)",
                   e.copy->name(), std::strerror(err));
      lock_warned_ = true;
    }
  }
}

FileCache::CopyPtr FileCache::Publish(std::unique_ptr<Reservation> fill, std::unique_ptr<SealedCopy> copy) {
  std::lock_guard lock(mu_);
  fill->published_ = true;
  reserved_ -= fill->bytes_;
  filling_.erase(fill->key_);
  filled_.notify_all();
  ++counters_.fills;
  counters_.fill_bytes += copy->size();
  counters_.fill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - fill->start_).count();
  lru_.push_front(fill->key_);
  Entry& e = entries_[fill->key_];
  e.copy = std::move(copy);
  e.lru = lru_.begin();
  used_ += PageBytes(e.copy->size());
  if (fill->pin_) PinLocked(e);
  return e.copy;
}

Status FileCache::Pin(const FileKey& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return Status::NotFound("not resident in the host tier");
  if (!it->second.pinned && pinned_ + PageBytes(it->second.copy->size()) > capacity_) return PinRefused();
  PinLocked(it->second);
  return Status::Ok();
}

uint64_t FileCache::Unpin(const Sha256Digest& sha256) {
  std::lock_guard lock(mu_);
  uint64_t bytes = 0;
  for (auto it = entries_.lower_bound(FileKey{sha256, ""}); it != entries_.end() && it->first.sha256 == sha256; ++it) {
    if (!it->second.pinned) continue;
    it->second.pinned = false;
    it->second.copy->Unlock();
    pinned_ -= PageBytes(it->second.copy->size());
    bytes += it->second.copy->size();
  }
  return bytes;
}

uint64_t FileCache::Evict(const Sha256Digest& sha256) {
  std::lock_guard lock(mu_);
  uint64_t bytes = 0;
  for (auto it = entries_.lower_bound(FileKey{sha256, ""}); it != entries_.end() && it->first.sha256 == sha256;) {
    bytes += it->second.copy->size();
    Drop(it++);
  }
  return bytes;
}

FileCache::Stats FileCache::GetStats() const {
  std::lock_guard lock(mu_);
  Stats s = counters_;
  s.capacity = capacity_;
  s.used = used_;
  s.filling = reserved_;
  s.pinned = pinned_;
  s.files = entries_.size();
  std::erase_if(evicted_, [](const auto& w) { return w.expired(); });
  for (const auto& w : evicted_) {
    if (auto c = w.lock()) s.held_by_readers += PageBytes(c->size());
  }
  return s;
}

std::map<Sha256Digest, FileCache::Residency> FileCache::ResidencyByFile() const {
  std::lock_guard lock(mu_);
  std::map<Sha256Digest, Residency> out;
  for (const auto& [key, e] : entries_) {
    Residency& r = out[key.sha256];
    r.bytes += e.copy->size();
    if (e.pinned) r.pinned += e.copy->size();
  }
  return out;
}

}  // namespace ckptfs
