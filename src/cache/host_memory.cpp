#include "ckptfs/host_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#ifdef CKPTFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ckptfs {

HostMemory::HostMemory(uint64_t capacity, size_t slot_size, bool use_cuda_host_alloc)
    : capacity_(capacity), slot_size_(slot_size), cuda_(use_cuda_host_alloc) {}

HostMemory::~HostMemory() {
  for (const Slab& s : slabs_) {
#ifdef CKPTFS_HAVE_CUDA
    if (cuda_) {
      cudaFreeHost(s.base);
      continue;
    }
#endif
    ::munmap(s.base, s.bytes);
  }
}

bool HostMemory::pinned() const {
  std::lock_guard lock(mu_);
  return pinned_;
}

uint64_t HostMemory::reserved_bytes() const {
  std::lock_guard lock(mu_);
  return reserved_;
}

bool HostMemory::Grow() {
  const uint64_t room = capacity_ - reserved_;
  const size_t slots = static_cast<size_t>(std::min<uint64_t>(kChunksPerSlab, room / slot_size_));
  if (slots == 0) return false;
  const size_t bytes = slots * slot_size_;
  uint8_t* base = nullptr;
#ifdef CKPTFS_HAVE_CUDA
  if (cuda_) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    base = static_cast<uint8_t*>(p);
  }
#endif
  if (base == nullptr) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;  // the system is short of memory: the cache stops growing
    ::madvise(p, bytes, MADV_HUGEPAGE);
    if (pinned_ && ::mlock(p, bytes) != 0) {
      pinned_ = false;
      if (!pin_failure_logged_) {
        spdlog::warn("cannot pin the chunk cache in memory ({}); going on unpinned (raise RLIMIT_MEMLOCK, e.g. "
                     "LimitMEMLOCK=infinity in the systemd unit)",
                     std::strerror(errno));
        pin_failure_logged_ = true;
      }
    }
    base = static_cast<uint8_t*>(p);
  }
  slabs_.push_back({base, bytes});
  reserved_ += bytes;
  for (size_t i = 0; i < slots; ++i) free_.push_back(base + i * slot_size_);
  return true;
}

uint8_t* HostMemory::Take() {
  std::lock_guard lock(mu_);
  if (free_.empty() && !Grow()) return nullptr;
  uint8_t* slot = free_.back();
  free_.pop_back();
  return slot;
}

void HostMemory::Give(uint8_t* slot) {
  std::lock_guard lock(mu_);
  free_.push_back(slot);
}

}  // namespace ckptfs
