#include "cache_sizing.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <spdlog/spdlog.h>

#include "ckptfs/chunk_cache.h"
#include "ckptfs/page_reserve.h"
#include "ckptfs/sealed_copy.h"
#include "ckptfs/thread_pool.h"

namespace ckptfs::daemon {

uint64_t PhysicalMemory() {
  return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

uint64_t HostCacheBytes(const MountOptions& o) {
  const uint64_t ram = PhysicalMemory();
  uint64_t bytes = o.cache_size;
  if (bytes == 0) bytes = static_cast<uint64_t>(static_cast<double>(ram) * (o.cache_percent > 0 ? o.cache_percent : 25) / 100);
  const uint64_t ceiling = ram / 10 * 9;
  if (bytes > ceiling) {
    spdlog::warn("cache_size={} is more than this machine's memory allows; using {} bytes (90% of {})", bytes,
                 ceiling, ram);
    bytes = ceiling;
  }
  return std::max<uint64_t>(bytes / kChunkSize * kChunkSize, 4 * kChunkSize);
}

uint64_t ChunkCacheBytes(const MountOptions& o, uint64_t host_bytes) {
  if (o.fill == FillPolicy::kOff) return host_bytes;
  constexpr uint64_t kMin = 4 * kChunkSize, kMax = 64 * kChunkSize;
  return std::min(host_bytes, std::clamp(host_bytes / 8 / kChunkSize * kChunkSize, kMin, kMax));
}

uint64_t AutoPageReserveBytes(uint64_t tier_bytes) { return std::min(tier_bytes / 2, kAutoPageReserveMax); }

uint64_t PageReserveBytes(const MountOptions& o, uint64_t tier_bytes, std::string* why) {
  if (o.page_reserve_off) {
    *why = "page_reserve=off";
    return 0;
  }
  const std::string shmem = SealedCopy::ShmemHugePages();
  if (shmem == "never" || shmem == "deny" || shmem == "unknown") {
    *why = "shmem_enabled=" + shmem + " gives memfds no 2 MiB pages";
    return 0;
  }
  if (SealedCopy::PreferredWrite() != SealedCopy::WriteBy::kSmallPageMapping) {
    *why = "copies are written in 2 MiB pages already (fresh memory is not slow here)";
    return 0;
  }
  const uint64_t bytes = o.page_reserve_bytes > 0 ? o.page_reserve_bytes : AutoPageReserveBytes(tier_bytes);
  const uint64_t pages = std::min(bytes, tier_bytes) / PageReserve::kPageBytes;
  if (pages == 0) *why = "the host tier is smaller than one 2 MiB page";
  return pages * PageReserve::kPageBytes;
}

uint64_t DescriptorBudget(const MountOptions& o) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  const uint64_t limit = lim.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 20 : lim.rlim_cur;
  const uint64_t fuse_threads = std::max(4u, 2 * EffectiveThreads(o.threads));
  const uint64_t reserve = kDescriptorReserve + 8 * fuse_threads;
  uint64_t maps = 65530;  // the kernel's default
  std::ifstream("/proc/sys/vm/max_map_count") >> maps;
  return std::min({limit / 2, limit > reserve ? limit - reserve : 0, maps / 4});
}

unsigned FillDepth(const MountOptions& o) { return o.fill_depth ? o.fill_depth : kDefaultFillDepth; }

}  // namespace ckptfs::daemon
