// PageReserve: 2 MiB pages the host tier keeps for its next copies, on a
// machine where taking fresh memory is slow.
//
// Why: on a VM that reports free memory to its hypervisor (free page
// reporting, SealedCopy::FreshMemoryIsSlow), memory the guest freed a
// couple of seconds ago has been handed back, and the first touch of each
// of its 2 MiB pages costs the host far more than 512 small ones do
// (0.09-0.68 GB/s, against 1.5 GB/s in 4 KiB pages). Copies are written in
// 4 KiB pages there, which costs the indexer a fault per 4 KiB (about half
// its CPU time while a 1.5 GB checkpoint arrives on 2 CPUs) and makes loads
// from them slower. But a 2 MiB page freed an instant before it is taken
// again is still backed: a copy filled that way ran at 13 GB/s. So the
// tier keeps a store of 2 MiB pages (in a memfd of its own) and frees two
// of them just before a fill writes each 4 MiB chunk, which then takes
// them (SealedCopy::PlaceHugePages): memory the tier keeps rather than
// frees and takes again.
//
// Growth: a thread adds one page at a time while the tier's lender
// (FileCache::LendToReserve) says there is free room and no fill in flight,
// and the machine has more than kFreeMemoryKept of memory that holds
// nothing (so the page cache is never pushed out for it); below half of
// that it gives back at once what free memory is short of it. It starts
// 5 s after the mount (a mount that lives less needs none). After the
// reserve gave pages (to a fill, to a claim, to the machine) it takes no
// fresh memory for 10 s: the load that follows a fill needs the same slow
// fresh memory and CPU (a first load by fastsafetensors took 1.45-1.58x
// its native load while the reserve grew back beside it, 1.04-1.20x
// without); pages freed a moment ago (copies let go of: Wake) come fast
// and are taken meanwhile, until one comes slowly. It rests after a page
// as long as the page took when another thread wanted its CPU meanwhile
// (so that on busy CPUs it uses at most about half of one), and takes a
// page without holding any lock a fill waits on. It runs at normal
// priority: at idle priority it was starved for seconds on busy CPUs while
// it held the process's mmap lock (taking a page) or had to be joined (an
// unmount, a restart's old daemon), and all of that waited. It takes fresh
// memory after a mount (0.45 GB/s here) and, at memory speed, the pages of
// copies just evicted.
//
// Accounting is the lender's: the reserve's `target` is the number of pages
// the tier has lent it, which the tier raises (Raise) and lowers (Lower,
// then Trim to free them now) under its own lock; `pages` is what the
// reserve holds, which follows the target (Trim, GrowOne).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "ckptfs/mutex.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

class PageReserve {
 public:
  static constexpr uint64_t kPageBytes = 2ull << 20;
  // The thread grows the reserve only while the machine has more free
  // memory (MemFree) than this, and gives pages back below half of it.
  static constexpr uint64_t kFreeMemoryKept = 1ull << 30;

  // A reserve of at most `limit` bytes (whole pages), empty; no thread yet.
  static Result<std::unique_ptr<PageReserve>> Create(uint64_t limit);
  ~PageReserve();
  PageReserve(const PageReserve&) = delete;
  PageReserve& operator=(const PageReserve&) = delete;

  // How the growing thread runs. The daemon's: from 5 s after the start,
  // taking no fresh memory for 10 s after the reserve gave pages, resting
  // after a page it was preempted in as long as the page took. Tests grow
  // it at once and without rest, or choose.
  struct Pace {
    std::chrono::milliseconds start_delay{5000};
    std::chrono::milliseconds quiet_after_giving{10000};
    bool rest_when_preempted = true;
    // A page taken faster than this was memory freed a moment ago, still
    // backed (0.13 ms here), which the quiet does not hold back; fresh
    // memory takes 3-5 ms.
    std::chrono::microseconds recycled_page{1000};
    static Pace Background() { return {}; }
    static Pace AtOnce() {
      Pace pace;
      pace.start_delay = pace.quiet_after_giving = std::chrono::milliseconds(0);
      pace.rest_when_preempted = false;
      return pace;
    }
  };
  // Starts the thread that grows the reserve: it asks `lend` (which raises
  // the target by one page and says true, or says false when the tier has
  // no room to lend now) and takes one page per yes; it asks again at least
  // every `poll` and after each Wake.
  void StartGrowing(std::function<bool()> lend, Pace pace = Pace::Background(),
                    std::chrono::milliseconds poll = std::chrono::milliseconds(250));
  // Stops that thread and waits for it (the destructor does too): from
  // then on nothing calls `lend`.
  void StopGrowing() EXCLUDES(mu_);
  // Asks the growing thread to look for room now (copies were let go of).
  void Wake() EXCLUDES(mu_);

  // The target, in pages. Lower never takes it below 0 and returns how many
  // pages it took off.
  void Raise(uint64_t pages) EXCLUDES(mu_);
  uint64_t Lower(uint64_t pages) EXCLUDES(mu_);
  uint64_t target() const EXCLUDES(mu_);
  // The pages held now (not one being taken).
  uint64_t pages() const EXCLUDES(mu_);
  uint64_t limit_pages() const { return limit_pages_; }

  // Frees the pages held above the target (to the kernel's allocator,
  // where the next allocation finds them).
  void Trim() EXCLUDES(mu_);
  // Takes one page if the reserve holds fewer than its target. When the
  // kernel refuses, the target is lowered to what is held.
  enum class Growth { kGrew, kNone, kRefused };
  Growth GrowOne() EXCLUDES(mu_);

  struct Stats {
    uint64_t pages = 0;       // held now
    uint64_t target = 0;      // lent by the tier
    uint64_t limit = 0;       // at most, in pages
    uint64_t grown = 0;       // pages taken, ever
    double grow_seconds = 0;  // the time those took
    uint64_t given = 0;       // pages freed for copies, room or free memory, ever
    uint64_t refused = 0;     // pages the kernel would not give
  };
  Stats GetStats() const EXCLUDES(mu_);

  static uint64_t FreeMemory();

 private:
  PageReserve(UniqueFd fd, uint8_t* map, uint64_t limit_pages)
      : fd_(std::move(fd)), map_(map), limit_pages_(limit_pages) {}
  static long InvoluntarySwitches();
  void GrowLoop(const std::function<bool()>& lend, Pace pace, std::chrono::milliseconds poll) EXCLUDES(mu_);
  // Waits until `deadline`, a Wake (when `wakeable`) or a stop.
  enum class Waited { kStopped, kWoken, kTimedOut };
  Waited WaitUntil(std::chrono::steady_clock::time_point deadline, bool wakeable) EXCLUDES(mu_);
  std::chrono::steady_clock::time_point last_given() const EXCLUDES(mu_);
  bool Punch(uint64_t first, uint64_t count);
  // How long the thread stops growing after the kernel refused a page.
  static constexpr std::chrono::seconds kAfterRefusal{10};

  const UniqueFd fd_;
  uint8_t* const map_;  // the whole limit, asking for huge pages
  const uint64_t limit_pages_;
  mutable Mutex mu_;
  uint64_t pages_ GUARDED_BY(mu_) = 0;
  uint64_t target_ GUARDED_BY(mu_) = 0;
  // GrowOne takes the page at `growing_at_` (== pages_ when it began)
  // outside the lock; a Trim that takes the target to it or below cancels
  // it. Trims free pages outside the lock too (`punching_`), and no page
  // is taken meanwhile, which could be one they free.
  bool growing_ GUARDED_BY(mu_) = false;
  uint64_t growing_at_ GUARDED_BY(mu_) = 0;
  bool growth_cancelled_ GUARDED_BY(mu_) = false;
  int punching_ GUARDED_BY(mu_) = 0;
  uint64_t grown_ GUARDED_BY(mu_) = 0, given_ GUARDED_BY(mu_) = 0, refused_ GUARDED_BY(mu_) = 0;
  double grow_seconds_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_given_ GUARDED_BY(mu_) = std::chrono::steady_clock::time_point::min();
  CondVar wake_;
  bool woken_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread grower_;
};

}  // namespace ckptfs
