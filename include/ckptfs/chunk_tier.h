// What the chunk tier is keyed and counted by: the key of a 4 MiB chunk and
// the tier's counters. The tier itself is ChunkCache, its memory the chunk
// slots (src/cache/chunk_slots.h).
#pragma once

#include <compare>
#include <cstdint>

#include "ckptfs/hashes.h"

namespace ckptfs {

// Keyed by the file's SHA-256, so checkpoints that share a file share its
// chunks. Ordered by file first: the tier finds a file's chunks as one range.
struct ChunkKey {
  Sha256Digest file{};
  uint32_t index = 0;
  auto operator<=>(const ChunkKey&) const = default;
};

struct ChunkTierStats {
  uint64_t capacity = 0;
  // Bytes of memory held. Every chunk takes a whole 4 MiB slot, even a
  // file's short last chunk (or a small config file).
  uint64_t used = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t fills = 0;       // chunks read from the source
  uint64_t evictions = 0;
  uint64_t pinned = 0;      // bytes
  // Chunks copied from a resident whole-file copy of the host tier
  // (verified when it was filled) instead of read from the source.
  uint64_t fills_from_host_copy = 0;
  // Requests that found their chunk being filled by another and waited for
  // that fill instead of reading the source again (single flight).
  uint64_t fill_waits = 0;
};

}  // namespace ckptfs
