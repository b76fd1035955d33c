// CacheTier: what every tier of the cache answers, whatever it holds. Both
// tiers hold verified bytes of source files keyed by the file's SHA-256, so
// checkpoints that share a file share them:
//   the host tier (FileCache): whole files, each a sealed memfd copy, which
//     opens are passed through to and loaders register for DMA;
//   the chunk tier (ChunkCache): 4 MiB chunk slots the chunk path serves
//     reads from, composed over the host tier (a chunk loaded while its file
//     is resident whole is copied from that copy, read through CopyOut).
//
// As in CernVM-FS's cache.h, the tiers share one interface and are composed
// rather than wired to each other: `ckptfsctl unpin`, `evict` and the per-
// checkpoint figures of `stats` go to every tier through it, and the chunk
// tier reads the tier below it through it. What a tier hands a reader
// differs with what it holds (a sealed copy to pass through, a chunk to read
// from), but claims are one discipline: a claim is an RAII guard
// (FileCache::Reservation, ChunkClaim) that publishes when committed and
// gives its room back when dropped uncommitted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "ckptfs/hashes.h"

namespace ckptfs {

class CacheTier {
 public:
  // Bytes of one file a tier holds (file bytes, not the memory they take),
  // and of those the pinned ones.
  struct Residency {
    uint64_t bytes = 0, pinned = 0;
  };

  virtual ~CacheTier() = default;

  // The tier's name in `stats` and the control protocol (kTierHost,
  // kTierChunks).
  virtual const char* name() const = 0;
  // Copies `len` bytes of file `file` from `offset` into `dst` when the tier
  // holds them, verified, right now: no fill, no wait for one in flight, not
  // counted as a use. False when it does not hold all of them.
  virtual bool CopyOut(const Sha256Digest& file, uint64_t offset, size_t len, uint8_t* dst) const = 0;
  // Every form of file `file`: returns the file bytes unpinned / dropped.
  // Evict leaves what a reader holds to that reader.
  virtual uint64_t Unpin(const Sha256Digest& file) = 0;
  virtual uint64_t Evict(const Sha256Digest& file) = 0;
  // Every file the tier holds bytes of, in one pass (for stats).
  virtual std::map<Sha256Digest, Residency> ResidencyByFile() const = 0;
};

}  // namespace ckptfs
