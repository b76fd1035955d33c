// How big each cache tier is, from the mount options and what the machine
// has: the host memory split between whole files and chunks, and how many
// reads one fill keeps in flight.
#pragma once

#include <cstdint>
#include <string>

#include "mount_options.h"

namespace ckptfs::daemon {

uint64_t PhysicalMemory();

// The host tier's size from cache_size, bounded by what the machine has (at
// most 90% of it), in whole chunks, at least 4.
uint64_t HostCacheBytes(const MountOptions& o);

// The chunk path's share of the host cache: 1/8 of it, 16 MiB to 256 MiB
// (enough for a few readers' chunks and their read-ahead); all of it when no
// whole files are kept (fill=off). The rest holds whole files.
uint64_t ChunkCacheBytes(const MountOptions& o, uint64_t host_bytes);

// The page reserve's size (page_reserve=; 0: none): only where copies are
// written in 4 KiB pages for want of fast fresh 2 MiB ones
// (SealedCopy::PreferredWrite is kSmallPageMapping) and shmem may have
// huge pages at all; auto: half of `tier_bytes`, at most
// kAutoPageReserveMax (taking fresh pages costs an idle CPU about 2-10 s a
// GiB on these VMs). Half, not a quarter: a first load by fastsafetensors
// of a 2.7 GB checkpoint into an 8G tier took 1.24-1.25x its native load
// with a quarter (1.9 GB: the third shard's copy went into fresh memory),
// 1.03-1.10x with 3.8 GB. `why` says why there is none.
inline constexpr uint64_t kAutoPageReserveMax = 8ull << 30;
// page_reserve=auto's size where there is a reserve at all.
uint64_t AutoPageReserveBytes(uint64_t tier_bytes);
uint64_t PageReserveBytes(const MountOptions& o, uint64_t tier_bytes, std::string* why);

// How many memfd copies the host tier may hold (each is a descriptor and a
// mapping): half of RLIMIT_NOFILE, less when that would leave the rest of
// the daemon fewer than kDescriptorReserve plus 8 a FUSE thread (each holds
// its /dev/fuse clone and a source file while it reads), and at most a
// quarter of vm.max_map_count.
uint64_t DescriptorBudget(const MountOptions& o);
inline constexpr uint64_t kDescriptorReserve = 512;

// Reads in flight for all fills together (fill_depth=, else
// kDefaultFillDepth): the depth a disk needs to reach its rate with 4 MiB
// reads, whatever the number of CPUs (a cold source is read with O_DIRECT,
// which costs little CPU); see README, measured performance.
inline constexpr unsigned kDefaultFillDepth = 16;
unsigned FillDepth(const MountOptions& o);

}  // namespace ckptfs::daemon
