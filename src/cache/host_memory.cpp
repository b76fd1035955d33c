#include "host_memory.h"
#include "ckptfs/mutex.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

namespace ckptfs {

HostMemory::HostMemory(uint64_t capacity, size_t slot_size) : capacity_(capacity), slot_size_(slot_size) {}

HostMemory::~HostMemory() {
  for (const Slab& s : slabs_) ::munmap(s.base, s.bytes);
}

bool HostMemory::pinned() const { return pinned_.load(); }

uint64_t HostMemory::reserved_bytes() const {
  MutexLock lock(mu_);
  return reserved_;
}

// A slab of `bytes`, pinned if the kernel lets us; null when the system is
// short of memory. Runs without the lock: mapping and locking 64 MiB takes
// milliseconds, and Give must not wait for it.
uint8_t* HostMemory::MapSlab(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  ::madvise(p, bytes, MADV_HUGEPAGE);
  if (pinned_.load() && ::mlock(p, bytes) != 0) {
    const int err = errno;
    pinned_ = false;
    if (!pin_failure_logged_.exchange(true)) {
      spdlog::warn("cannot pin the chunk cache in memory ({}); going on unpinned (raise RLIMIT_MEMLOCK, e.g. "
                   "LimitMEMLOCK=infinity in the systemd unit)",
                   std::strerror(err));
    }
  }
  return static_cast<uint8_t*>(p);
}

uint8_t* HostMemory::Take() {
  size_t bytes = 0;
  {
    MutexLock lock(mu_);
    if (!free_.empty()) {
      uint8_t* slot = free_.back();
      free_.pop_back();
      return slot;
    }
    const uint64_t room = capacity_ - reserved_;
    bytes = static_cast<size_t>(std::min<uint64_t>(kChunksPerSlab, room / slot_size_)) * slot_size_;
    if (bytes == 0) return nullptr;
    reserved_ += bytes;  // claimed now, so that concurrent growth cannot pass the capacity
  }
  uint8_t* base = MapSlab(bytes);
  MutexLock lock(mu_);
  if (base == nullptr) {  // the system is short of memory: the cache stops growing
    reserved_ -= bytes;
    return nullptr;
  }
  slabs_.push_back({base, bytes});
  for (size_t off = slot_size_; off < bytes; off += slot_size_) free_.push_back(base + off);
  return base;
}

void HostMemory::Give(uint8_t* slot) {
  MutexLock lock(mu_);
  free_.push_back(slot);
}

}  // namespace ckptfs
