// PageReserve: memory the host tier keeps when it lets go of copies, handed
// to the next copies it makes instead of being freed and taken again.
//
// Why: on a VM with free page reporting (virtio-balloon), memory the guest
// frees goes back to the host within seconds, and the next first touch of
// each of those pages faults in the host. There a fill into fresh memory
// was the slowest step of an arrival (a 750 MB copy in 2 MiB pages took
// 3.3-6.3 s; into pages the guest still had, 0.22 s). A tier that evicts one
// checkpoint's copies and fills the next one's would pay that every time.
//
// How: when copies are freed, Keep touches as many bytes of a private memfd
// of its own (2 MiB pages where the kernel gives them) while the freed pages
// are still the guest's; a copy about to fault `n` bytes first asks Hand to
// free `n` bytes of the reserve, which the kernel then gives straight back
// to that copy from its free lists. The bytes never move between files (a
// sealed copy's pages are its own); only the memory does.
//
// Bounds: the reserve never holds more than the caller's free room says
// (Keep's `room`: the tier's capacity less its copies and fills), every
// fill hands back what it faults, and a reserve nobody drew on for `keep`
// goes back to the kernel whole, so an idle mount does not sit on memory;
// so does all of it as soon as the machine runs short (MemoryIsShort).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "ckptfs/mutex.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

class PageReserve {
 public:
  // `limit`: the most it may ever hold (the tier's capacity); `keep`: how
  // long it holds memory nobody drew on. A `keep` of zero keeps nothing.
  PageReserve(uint64_t limit, std::chrono::seconds keep);
  ~PageReserve();
  PageReserve(const PageReserve&) = delete;
  PageReserve& operator=(const PageReserve&) = delete;

  // After the tier freed `bytes` of copies: holds that much more, but never
  // more than `room` in all (it gives back the excess when `room` shrank).
  void Keep(uint64_t bytes, uint64_t room) EXCLUDES(mu_);
  // Before a copy faults `bytes`: frees that much of the reserve for it, in
  // whole 2 MiB pages as the bytes asked for add up to them; returns how
  // much it freed now.
  uint64_t Hand(uint64_t bytes) EXCLUDES(mu_);

  uint64_t held() const EXCLUDES(mu_);
  // The memory the kernel has allocated to the reserve's memfd (its
  // st_blocks): what `held` says, seen from the kernel's side.
  uint64_t allocated() const EXCLUDES(mu_);
  struct Stats {
    uint64_t held = 0;    // bytes the reserve holds now
    uint64_t kept = 0;    // bytes taken in since the mount
    uint64_t handed = 0;  // of which handed to new copies
    uint64_t returned = 0;  // given back to the kernel (idle, or room shrank)
  };
  Stats GetStats() const EXCLUDES(mu_);

  // Whether this machine hands freed memory back to a hypervisor (a
  // virtio-balloon device offering free page reporting, with the kernel's
  // page_reporting_order within the buddy allocator's orders), so that a
  // first touch of fresh memory is slow. `sys` is the sysfs root.
  static bool FreePageReporting(const std::string& sys = "/sys");
  // The same, read once for this process.
  static bool FreshPagesAreSlow();

  struct MemInfo {
    uint64_t total = 0, available = 0;  // bytes
  };
  // MemTotal and MemAvailable of /proc/meminfo; nullopt when unreadable.
  static std::optional<MemInfo> MemAvailable(const std::string& meminfo = "/proc/meminfo");
  // Whether the machine is too short of memory for the reserve to hold
  // `held` bytes: less available than the reserve holds, or than 5% of all.
  static bool MemoryIsShort(std::optional<MemInfo> m, uint64_t held);

 private:
  Status Open() REQUIRES(mu_);
  void Shrink(uint64_t to) REQUIRES(mu_);
  void GiveBackWhenIdle() EXCLUDES(mu_);

  const uint64_t limit_;
  const std::chrono::seconds keep_;
  mutable Mutex mu_;
  CondVar changed_;
  UniqueFd fd_ GUARDED_BY(mu_);
  uint8_t* map_ GUARDED_BY(mu_) = nullptr;
  uint64_t mapped_ GUARDED_BY(mu_) = 0;
  uint64_t held_ GUARDED_BY(mu_) = 0;  // [0, held_) of the memfd is touched
  uint64_t owed_ GUARDED_BY(mu_) = 0;  // bytes written by copies, not yet a whole page freed for
  std::chrono::steady_clock::time_point last_use_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool open_warned_ GUARDED_BY(mu_) = false;
  Stats stats_ GUARDED_BY(mu_);
  std::thread idle_;  // started with the first Keep (after fuse_daemonize)
};

}  // namespace ckptfs
