// HostMemory: the chunk tier's slots. Memory is taken in slabs as the
// cache fills, never all at start, so a cache_size larger than free memory
// costs nothing until it is used. Slabs are pinned: mmap + mlock with
// transparent huge pages requested. (They are read only by the daemon, into
// FUSE replies, so nothing gains from making them DMA-ready.) If the kernel refuses to lock
// (RLIMIT_MEMLOCK), that is logged once and the slabs stay unpinned.
// A slab is mapped and locked outside the lock that Take and Give share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckptfs/mutex.h"

namespace ckptfs {

class HostMemory {
 public:
  static constexpr size_t kChunksPerSlab = 16;  // 64 MiB slabs of 4 MiB chunks

  // `capacity` bytes at most, in `slot_size` slots.
  HostMemory(uint64_t capacity, size_t slot_size);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // A free slot, growing by one slab if allowed; null when full (or when the
  // system refuses more memory).
  uint8_t* Take();
  void Give(uint8_t* slot);

  uint64_t capacity() const { return capacity_; }
  uint64_t reserved_bytes() const;  // slabs taken from the system
  bool pinned() const;

 private:
  uint8_t* MapSlab(size_t bytes);

  mutable Mutex mu_;
  const uint64_t capacity_;
  const size_t slot_size_;
  std::atomic<bool> pinned_{true};
  std::atomic<bool> pin_failure_logged_{false};
  struct Slab {
    uint8_t* base;
    size_t bytes;
  };
  std::vector<Slab> slabs_ GUARDED_BY(mu_);
  std::vector<uint8_t*> free_ GUARDED_BY(mu_);
  uint64_t reserved_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckptfs
