#include "ckptfs/page_reserve.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include <spdlog/spdlog.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ckptfs {

Result<std::unique_ptr<PageReserve>> PageReserve::Create(uint64_t limit) {
  const uint64_t pages = limit / kPageBytes;
  if (pages == 0) return Status::Error("a page reserve needs at least one 2 MiB page");
  // Not "ckptfs:..." like the copies: it holds no file and is never
  // handed to the kernel, and tools that list the copies by name skip it.
  UniqueFd fd(::memfd_create("ckptfs-page-reserve", MFD_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno("memfd_create for the page reserve", errno);
  const uint64_t bytes = pages * kPageBytes;
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno("cannot size the page reserve to " + std::to_string(bytes) + " bytes", errno);
  }
  // Nothing is taken yet: the mapping is address space until GrowOne.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno("cannot map the page reserve", errno);
  ::madvise(p, bytes, MADV_HUGEPAGE);
  return std::unique_ptr<PageReserve>(new PageReserve(std::move(fd), static_cast<uint8_t*>(p), pages));
}

PageReserve::~PageReserve() {
  StopGrowing();
  ::munmap(map_, limit_pages_ * kPageBytes);
}

void PageReserve::StartGrowing(std::function<bool()> lend, Pace pace, std::chrono::milliseconds poll) {
  grower_ = std::thread([this, lend = std::move(lend), pace, poll] { GrowLoop(lend, pace, poll); });
}

void PageReserve::StopGrowing() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (grower_.joinable()) grower_.join();
}

void PageReserve::Wake() {
  MutexLock lock(mu_);
  woken_ = true;
  wake_.NotifyAll();
}

// The kernel's free memory (MemFree, not MemAvailable: memory that holds
// nothing); 0 when /proc/meminfo cannot be read.
uint64_t PageReserve::FreeMemory() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    if (key == "MemFree:" && meminfo >> kib) return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// How often the scheduler has taken the CPU from the calling thread for
// another that wanted it.
long PageReserve::InvoluntarySwitches() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nivcsw;
}

PageReserve::Waited PageReserve::WaitUntil(std::chrono::steady_clock::time_point deadline, bool wakeable) {
  MutexLock lock(mu_);
  while (!stopping_ && !(wakeable && woken_) && std::chrono::steady_clock::now() < deadline) {
    wake_.WaitUntil(mu_, deadline);
  }
  if (stopping_) return Waited::kStopped;
  if (!wakeable) return Waited::kTimedOut;  // a Wake meanwhile is for the next wakeable wait
  const bool woken = woken_;
  woken_ = false;
  return woken ? Waited::kWoken : Waited::kTimedOut;
}

std::chrono::steady_clock::time_point PageReserve::last_given() const {
  MutexLock lock(mu_);
  return last_given_;
}

void PageReserve::GrowLoop(const std::function<bool()>& lend, Pace pace, std::chrono::milliseconds poll) {
  using Clock = std::chrono::steady_clock;
  pthread_setname_np(pthread_self(), "ckptfs-reserve");
  // Normal priority, on purpose: a thread at idle priority is starved for
  // seconds on a busy machine, and it cannot take a page without the
  // process's mmap lock (MADV_POPULATE_WRITE) nor take its turn with the
  // locks it shares with fills, so every open behind it waited, and a
  // restart's old daemon lived on for seconds to join it. Its CPU is
  // bounded by resting instead, when others want the CPU (below).
  if (WaitUntil(Clock::now() + pace.start_delay, /*wakeable=*/false) == Waited::kStopped) return;
  bool recycling = false;                 // woken by copies let go of: their pages may come fast
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    const uint64_t free = FreeMemory();
    const Clock::time_point quiet_until = last_given() + pace.quiet_after_giving;
    if (free < kFreeMemoryKept / 2) {
      // The machine needs memory more than the next copy needs fast pages:
      // all it is short of, at once (whoever is taking memory this fast
      // would not wait for a page a poll).
      if (Lower((kFreeMemoryKept - free + kPageBytes - 1) / kPageBytes) > 0) Trim();
    } else if (Clock::now() < quiet_until && !recycling) {
      // Pages were just given: no fresh memory while they are used.
      const Waited waited = WaitUntil(std::min(quiet_until, Clock::now() + poll), /*wakeable=*/true);
      if (waited == Waited::kStopped) return;
      recycling = waited == Waited::kWoken;
      continue;
    } else {
      const auto start = Clock::now();
      const long preempted_before = InvoluntarySwitches();
      const Growth grew = GrowOne();
      if (grew == Growth::kGrew) {
        const auto now = Clock::now();
        if (now - start > pace.recycled_page) recycling = false;  // fresh memory from here on
        // Another thread wanted this CPU while the page was taken (the
        // scheduler preempted this one): rest as long as the page took, so
        // that on busy CPUs it uses at most about half of one. On idle
        // CPUs it grows at the memory's speed, as an idle-priority thread
        // would, without ever being starved while it holds a lock.
        if (pace.rest_when_preempted && InvoluntarySwitches() != preempted_before &&
            WaitUntil(now + (now - start), /*wakeable=*/false) == Waited::kStopped) {
          return;
        }
        continue;
      }
      if (grew == Growth::kRefused) {  // the kernel is short of memory: not again for a while
        if (WaitUntil(Clock::now() + kAfterRefusal, /*wakeable=*/false) == Waited::kStopped) return;
        continue;
      }
      if (free > kFreeMemoryKept && lend()) continue;  // the target went up by a page: take it
    }
    const Waited waited = WaitUntil(Clock::now() + poll, /*wakeable=*/true);
    if (waited == Waited::kStopped) return;
    recycling = waited == Waited::kWoken;
  }
}

void PageReserve::Raise(uint64_t pages) {
  MutexLock lock(mu_);
  target_ = std::min(limit_pages_, target_ + pages);
}

uint64_t PageReserve::Lower(uint64_t pages) {
  MutexLock lock(mu_);
  const uint64_t lowered = std::min(pages, target_);
  target_ -= lowered;
  return lowered;
}

uint64_t PageReserve::target() const {
  MutexLock lock(mu_);
  return target_;
}

uint64_t PageReserve::pages() const {
  MutexLock lock(mu_);
  return pages_;
}

bool PageReserve::Punch(uint64_t first, uint64_t count) {
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first * kPageBytes),
                  static_cast<off_t>(count * kPageBytes)) == 0) {
    return true;
  }
  spdlog::warn("cannot free {} pages of the page reserve: {}", count, std::strerror(errno));
  return false;
}

void PageReserve::Trim() {
  uint64_t from = 0, to = 0;
  {
    MutexLock lock(mu_);
    if (growing_ && growing_at_ >= target_) growth_cancelled_ = true;  // not wanted any more
    if (pages_ <= target_) return;
    from = target_;
    to = pages_;
    pages_ = from;  // the pages at the top go, so that the reserve stays one run from 0
    ++punching_;
  }
  const bool punched = Punch(from, to - from);
  MutexLock lock(mu_);
  --punching_;
  if (punched) {
    given_ += to - from;
    last_given_ = std::chrono::steady_clock::now();
  }
}

PageReserve::Growth PageReserve::GrowOne() {
  uint64_t at = 0;
  {
    MutexLock lock(mu_);
    if (growing_ || punching_ > 0 || pages_ >= target_) return Growth::kNone;
    at = pages_;
    growing_ = true;
    growing_at_ = at;
    growth_cancelled_ = false;
  }
  // Outside the lock: this is the slow part, which no other thread may
  // wait for.
  const auto start = std::chrono::steady_clock::now();
  const int populated = ::madvise(map_ + at * kPageBytes, kPageBytes, MADV_POPULATE_WRITE);
  const int err = errno;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bool keep = false;
  {
    MutexLock lock(mu_);
    keep = populated == 0 && !growth_cancelled_ && pages_ == at && at < target_;
    if (keep) {
      pages_ = at + 1;
      ++grown_;
      grow_seconds_ += took;
      growing_ = false;
      return Growth::kGrew;
    }
  }
  Punch(at, 1);  // refused, or no longer wanted: what was taken of it goes back
  MutexLock lock(mu_);
  growing_ = false;
  if (populated == 0) return Growth::kNone;
  ++refused_;
  if (target_ > pages_) --target_;  // the tier's loan shrinks with what could not be had
  if (refused_ == 1) spdlog::info("the page reserve stops at {} pages: {}", pages_, std::strerror(err));
  return Growth::kRefused;
}

PageReserve::Stats PageReserve::GetStats() const {
  MutexLock lock(mu_);
  return {pages_, target_, limit_pages_, grown_, grow_seconds_, given_, refused_};
}

}  // namespace ckptfs
