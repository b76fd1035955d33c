// FileCache: the host tier (see cache_tier.h). Whole verified files, each
// in a SealedCopy (a sealed memfd), keyed by the file's SHA-256 and the form
// it is served in, so every checkpoint and every name that holds a file
// shares one copy.
//
// Budget: `capacity` bounds the memory of the copies the tier holds plus the
// fills in flight (each file counts its size rounded up to whole pages, so a
// small config costs 4 KiB, not a 4 MiB chunk slot). A fill that needs room
// evicts the least recently used unpinned copies; if that is not enough it
// is refused, never squeezed in. Evicting a copy drops the tier's reference
// only: readers that still hold it keep its pages until they let go, and
// those pages stay in the budget ("held by readers") until then, so that no
// reader can take memory past `capacity` by holding evicted copies. Readers
// are the daemon's own (an open file's handle, a reply in flight: the copy's
// reference count) and the kernel's (a passthrough open, and every mapping
// of one, also after its close, which the daemon is not told of: the tier
// keeps the copy's read-only descriptor and asks the kernel,
// SealedCopy::OpenElsewhere). Held copies are looked at again when a claim
// is short of room and in GetStats (with more than 64 of them, at most
// every 100 ms: each costs a lease under the lock every open takes).
// Evicting for room skips copies the daemon's readers use, which would free
// nothing; when the copies not in use cannot
// make room, nothing is evicted. (A resident copy is not asked about
// kernel readers: see InUse.)
//
// Descriptors: a copy in a memfd holds one of the daemon's descriptors
// (small files are kept in memory and hold none: SealedCopy::kMemory), and
// `descriptor_budget` bounds how many the resident copies, the fills in
// flight and the held copies hold together, exactly as `capacity` bounds
// their bytes: a fill
// that needs a descriptor evicts the least recently used unpinned copy that
// holds one, or is refused (kFull) and its file is served by the chunk
// path. A copy the tier lets go of closes its descriptor as soon as no
// reader holds it; until then the descriptor is counted as held.
//
// Page reserve (page_reserve=; see page_reserve.h): where taking fresh
// memory is slow, the tier lends part of its free room to a store of 2 MiB
// pages, which a fill made with Claim(take_reserve) gets back two pages
// before each 4 MiB chunk it writes (TakeFromReserve). The pages it holds
// count in the budget like copies; a claim short of room takes them back
// before it evicts anything, so the tier's memory stays within `capacity`.
// Pages promised to a fill count in its reservation instead, and leave the
// reserve as the fill writes as many bytes, whether its copy can take them
// as 2 MiB pages or not.
//
// Single flight: one fill per key at a time; others wait for it or, if they
// only wanted to start one (a background fill), go away.
//
// Pinned copies are locked in memory: registered with the gpu= device when
// there is one (cudaHostRegister: page-locked, so that an engine's copy of
// them to the device is a DMA), else, or when the device refuses, with mlock
// (one warning when that too is refused). Locking a large copy
// takes time, so it runs outside the lock Find and Claim take: a second
// mutex, taken first, orders pins, unpins and evictions of pinned copies so
// that a copy is locked exactly while it is pinned.
#pragma once

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/cache_tier.h"
#include "ckptfs/device_memory.h"
#include "ckptfs/hashes.h"
#include "ckptfs/mutex.h"
#include "ckptfs/page_reserve.h"
#include "ckptfs/sealed_copy.h"
#include "ckptfs/status.h"

namespace ckptfs {

struct FileKey {
  Sha256Digest sha256{};
  // "" for the source's bytes; "stamped:sha256-<checkpoint>" for a
  // safetensors file served with a stamped header (it differs per checkpoint).
  std::string form;
  auto operator<=>(const FileKey&) const = default;
};

class FileCache final : public CacheTier {
 public:
  using CopyPtr = std::shared_ptr<const SealedCopy>;

  static constexpr uint64_t kNoDescriptorLimit = ~uint64_t{0};
  // `device`: the gpu= device, which pinned copies are registered with;
  // null without one. It must outlive the cache.
  explicit FileCache(uint64_t capacity, DeviceMemory* device = nullptr,
                     uint64_t descriptor_budget = kNoDescriptorLimit);
  ~FileCache() override;
  FileCache(const FileCache&) = delete;
  FileCache& operator=(const FileCache&) = delete;

  // The resident copy of `key`, or null. `use` counts a hit or a miss and
  // makes the copy the most recently used.
  CopyPtr Find(const FileKey& key, bool use = true);

  // Room for one fill, given back unless the fill is published.
  class Reservation {
   public:
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    const FileKey& key() const { return key_; }
    // Whether reserve pages were promised to this fill when it was claimed
    // (none can be later): only then has TakeFromReserve anything to do.
    bool promised_reserve_pages() const { return promised_at_claim_; }

   private:
    friend class FileCache;
    Reservation(FileCache* cache, FileKey key, uint64_t bytes, bool descriptor, bool pin)
        : cache_(cache), key_(std::move(key)), bytes_(bytes), descriptor_(descriptor), pin_(pin),
          start_(std::chrono::steady_clock::now()) {}
    FileCache* cache_;
    FileKey key_;
    uint64_t bytes_;
    bool descriptor_;  // room for one descriptor (a memfd) was reserved
    bool pin_;
    bool published_ = false;
    uint64_t lease_ = 0;  // bytes of reserve pages promised to this fill, not taken yet
    bool promised_at_claim_ = false;
    std::chrono::steady_clock::time_point start_;
  };
  // What Claim found: the copy already resident, or room for this caller to
  // fill it; both null when another fill of it is in flight and `wait` is
  // false.
  struct Claimed {
    CopyPtr resident;
    std::unique_ptr<Reservation> fill;
  };
  // How a claim may find room: by evicting the least recently used unpinned
  // copies (a fill someone asked for), or only in free room and spare
  // descriptors (a fill nobody asked for yet, fill_on_index: it must not push
  // out what was used).
  enum class Room { kEvict, kFreeOnly };
  // The fill reserves `size` bytes (in whole pages) and, when a copy of
  // that size holds a memfd (SealedCopy::NeedsDescriptor), a descriptor.
  // kFull with the reason when the file cannot fit (or, with `pin`, when the
  // pins would exceed the tier, or no descriptor can be freed).
  // `take_reserve`: the fill writes its copy through a mapping and will ask
  // for the reserve's pages as it goes (TakeFromReserve): as many as it
  // could use are promised to it.
  Result<Claimed> Claim(const FileKey& key, uint64_t size, bool pin, bool wait, Room room = Room::kEvict,
                        bool take_reserve = false);

  // Keeps a page reserve from now on, and starts its growing thread.
  void KeepPageReserve(std::unique_ptr<PageReserve> reserve, PageReserve::Pace pace = PageReserve::Pace::Background())
      EXCLUDES(mu_);
  // Called by `fill` before it writes a chunk of `chunk_bytes` into its
  // copy: frees the reserve pages promised to it for that many bytes (so
  // that the memory the chunk takes was the reserve's, whatever pages it
  // lands in), and returns how many of the first `huge_bytes` (whole 2 MiB
  // pages) the copy may take as 2 MiB pages at once.
  uint64_t TakeFromReserve(Reservation& fill, uint64_t chunk_bytes, uint64_t huge_bytes) EXCLUDES(mu_);
  // TakeFromReserve for the chunk at [offset, offset + len) of `copy`, whose
  // 2 MiB pages are then placed at once where the chunk is written in place
  // (read straight into the copy): the kernel hands out the pages just
  // freed, still backed. Returns the bytes placed in 2 MiB pages.
  uint64_t PlaceReservePages(Reservation& fill, SealedCopy& copy, uint64_t offset, uint64_t len, bool in_place)
      EXCLUDES(mu_);
  // Makes a sealed copy resident (pinned if the claim asked for it).
  CopyPtr Publish(std::unique_ptr<Reservation> fill, std::unique_ptr<SealedCopy> copy);
  // The same for a copy its filler shares with readers of it in progress.
  CopyPtr Publish(std::unique_ptr<Reservation> fill, std::shared_ptr<SealedCopy> copy);
  // The same for a fill claimed under a provisional key because its own was
  // not known yet (the indexer learns a file's SHA-256 as it copies it):
  // resident under `key`. When `key` is resident or being filled already,
  // the copy is dropped, the room given back, and the resident copy (or
  // null) returned.
  CopyPtr PublishAs(std::unique_ptr<Reservation> fill, const FileKey& key, std::unique_ptr<SealedCopy> copy);
  // Evicts up to `count` of the least recently used unpinned copies that
  // hold a descriptor (the daemon ran out: its source reads come first);
  // returns how many.
  size_t ShedDescriptors(size_t count);

  // Pins the resident copy of `key` (registered with the device, or mlock;
  // see Stats::registered and Stats::locked_memory).
  Status Pin(const FileKey& key);

  // CacheTier. CopyOut copies from the source's bytes (the form ""), not a
  // stamped form.
  const char* name() const override;
  bool CopyOut(const Sha256Digest& file, uint64_t offset, size_t len, uint8_t* dst) const override EXCLUDES(mu_);
  uint64_t Unpin(const Sha256Digest& sha256) override EXCLUDES(pin_mu_, mu_);
  uint64_t Evict(const Sha256Digest& sha256) override EXCLUDES(pin_mu_, mu_);
  std::map<Sha256Digest, Residency> ResidencyByFile() const override EXCLUDES(mu_);

  struct Stats {
    uint64_t capacity = 0;
    uint64_t used = 0;      // resident copies, in whole pages
    uint64_t filling = 0;   // reserved by fills in flight
    uint64_t pinned = 0;
    uint64_t held_by_readers = 0;  // evicted copies readers still hold (in `used`'s budget)
    uint64_t files = 0;
    uint64_t hits = 0, misses = 0, fills = 0, evictions = 0;
    uint64_t fill_bytes = 0;
    double fill_seconds = 0;
    uint64_t fills_abandoned = 0;
    uint64_t descriptors = 0;        // held by resident copies and fills in flight
    uint64_t descriptor_budget = 0;  // kNoDescriptorLimit: none
    uint64_t in_memory = 0;          // resident copies held without a descriptor
    bool locked_memory = true;  // false once the kernel refused to mlock a pinned copy
    uint64_t registered = 0;    // pinned bytes registered with the gpu= device
    bool page_reserve = false;  // one is kept
    PageReserve::Stats reserve;
    uint64_t reserve_promised = 0;  // bytes promised to fills in flight
  };
  // Looks at the held copies again first (see above).
  Stats GetStats() EXCLUDES(mu_);

 private:
  struct Entry {
    std::shared_ptr<SealedCopy> copy;
    bool pinned = false;
    bool descriptor = false;  // the copy held a memfd when it was published
    std::list<FileKey>::iterator lru;
  };
  // Copies the tier let go of, closed and dropped by the caller after it
  // unlocks: the last reference unmaps a copy and frees its pages, which
  // takes time for a large file and must not hold up Find.
  // Then the reserve frees what the tier took back from it (`trim`), and
  // its thread is told that memory was let go of (`wake`).
  struct Released {
    Released() = default;
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;
    ~Released();
    std::vector<CopyPtr> copies;
    std::vector<UniqueFd> descriptors;
    PageReserve* trim = nullptr;
    PageReserve* wake = nullptr;
  };
  // An evicted copy that readers may still hold: the daemon's (while `copy`
  // lives) or the kernel's (`descriptor` open elsewhere).
  struct HeldCopy {
    std::weak_ptr<const SealedCopy> copy;
    UniqueFd descriptor;  // read-only; invalid for a copy without a memfd
    uint64_t bytes = 0;
  };
  class PageLock;
  void Abandon(Reservation& fill) EXCLUDES(mu_);
  Status PinRefused() const REQUIRES(mu_);
  Status NoRoomForBytes() const REQUIRES(mu_);
  Status NoRoomForDescriptor() const REQUIRES(mu_);
  Status MakeRoom(uint64_t bytes, bool descriptor, const FileKey& keep, Released& released) REQUIRES(mu_);
  // The descriptors held by copies that evicting cannot take: pinned, in
  // use, being filled, held by readers of evicted copies, or `keep`.
  size_t DescriptorsNoEvictionFrees(const FileKey& keep) const REQUIRES(mu_);
  // Forgets the held copies no reader holds any more (their descriptors go
  // to `released`, closed after the lock).
  void SweepHeld(Released& released) REQUIRES(mu_);
  // Whether one of the daemon's readers holds the copy (a reference):
  // evicting it would free nothing.
  static bool InUse(const Entry& e);
  // Bytes of the resident unpinned copies in use.
  uint64_t InUse() const REQUIRES(mu_);
  // Bytes the budget counts now: resident copies, fills under way, and
  // evicted copies readers still hold.
  uint64_t Taken() const REQUIRES(mu_) { return used_ + reserved_ + held_bytes_ + SpareReserveBytes(); }
  // The reserve's pages not promised to a fill: free room lent out.
  uint64_t SpareReserveBytes() const REQUIRES(mu_);
  // Of those, the ones it holds already (not one it is still taking):
  // what a fill may be promised.
  uint64_t PromisableReserveBytes() const REQUIRES(mu_);
  // Takes spare reserve pages back until `bytes` more fit, if they can.
  void ReclaimSpareReserve(uint64_t bytes, Released& released) REQUIRES(mu_);
  // Gives back what is left of `fill`'s promise.
  void EndLease(Reservation& fill, Released& released) REQUIRES(mu_);
  // The reserve's thread asks: raises its target by a page when the tier
  // has that much free room and no fill in flight.
  bool LendToReserve() EXCLUDES(mu_);
  bool EvictOldest(bool holding_descriptor, const FileKey& keep, Released& released) REQUIRES(mu_);
  void Drop(std::map<FileKey, Entry>::iterator it, Released& released) REQUIRES(mu_);
  // Makes the reserved fill's copy resident (takes mu_).
  CopyPtr Admit(std::unique_ptr<Reservation> fill, std::shared_ptr<SealedCopy> copy) EXCLUDES(mu_);
  void MarkPinned(Entry& e) REQUIRES(mu_);
  void LockPages(const FileKey& key) EXCLUDES(mu_, pin_mu_);

  const uint64_t capacity_;
  DeviceMemory* const device_;
  const uint64_t descriptor_budget_;
  // Taken before mu_, never while holding it; guards page_locks_.
  Mutex pin_mu_ ACQUIRED_BEFORE(mu_);
  std::map<const SealedCopy*, std::unique_ptr<PageLock>> page_locks_ GUARDED_BY(pin_mu_);
  std::atomic<uint64_t> registered_{0};
  std::atomic<bool> locked_memory_{true};
  std::atomic<bool> lock_warned_{false}, register_warned_{false};
  mutable Mutex mu_;
  CondVar filled_;
  std::map<FileKey, Entry> entries_ GUARDED_BY(mu_);
  std::list<FileKey> lru_ GUARDED_BY(mu_);  // front: most recently used
  std::set<FileKey> filling_ GUARDED_BY(mu_);
  uint64_t used_ GUARDED_BY(mu_) = 0, reserved_ GUARDED_BY(mu_) = 0, pinned_ GUARDED_BY(mu_) = 0;
  uint64_t descriptors_ GUARDED_BY(mu_) = 0;  // of resident and held copies, and reserved by fills
  std::vector<HeldCopy> held_ GUARDED_BY(mu_);
  uint64_t held_bytes_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_sweep_ GUARDED_BY(mu_);
  // Set once, before any fill (KeepPageReserve); destroyed first.
  std::unique_ptr<PageReserve> reserve_;
  uint64_t reserve_promised_ GUARDED_BY(mu_) = 0;
  Stats counters_ GUARDED_BY(mu_);
};

// Memory a copy of `size` bytes takes: whole pages.
uint64_t PageBytes(uint64_t size);

}  // namespace ckptfs
