#include "ckptfs/page_reserve.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

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
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (grower_.joinable()) grower_.join();
  ::munmap(map_, limit_pages_ * kPageBytes);
}

void PageReserve::StartGrowing(std::function<bool()> lend, std::chrono::milliseconds poll) {
  grower_ = std::thread([this, lend = std::move(lend), poll] { GrowLoop(lend, poll); });
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

void PageReserve::GrowLoop(std::function<bool()> lend, std::chrono::milliseconds poll) {
  pthread_setname_np(pthread_self(), "ckptfs-reserve");
  // Idle priority: taking fresh pages is the host's slow work, worth doing
  // only on a CPU nobody else wants.
  const sched_param idle{};
  ::sched_setscheduler(0, SCHED_IDLE, &idle);
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    const Growth grew = GrowOne();
    if (grew == Growth::kGrew) continue;
    // Only memory that holds nothing is taken: growing never pushes the
    // page cache, or anything else, out.
    if (grew == Growth::kNone && FreeMemory() > kFreeMemoryKept && lend()) continue;  // the target went up
    MutexLock lock(mu_);
    if (grew == Growth::kRefused) {
      // The kernel is short of memory: not again for a while, whatever wakes.
      const auto until = std::chrono::steady_clock::now() + kAfterRefusal;
      while (!stopping_ && wake_.WaitUntil(mu_, until)) {
      }
    } else if (!woken_ && !stopping_) {
      wake_.WaitFor(mu_, poll);
    }
    woken_ = false;
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

void PageReserve::Trim() {
  MutexLock op(op_mu_);
  uint64_t from, to;
  {
    MutexLock lock(mu_);
    if (pages_ <= target_) return;
    from = target_;
    to = pages_;
  }
  // The pages at the top go, so that the reserve stays one run from 0.
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from * kPageBytes),
                  static_cast<off_t>((to - from) * kPageBytes)) != 0) {
    spdlog::warn("cannot free {} pages of the page reserve: {}", to - from, std::strerror(errno));
    return;
  }
  MutexLock lock(mu_);
  pages_ = from;
  given_ += to - from;
}

PageReserve::Growth PageReserve::GrowOne() {
  MutexLock op(op_mu_);
  uint64_t at;
  {
    MutexLock lock(mu_);
    if (pages_ >= target_) return Growth::kNone;
    at = pages_;
  }
  const auto start = std::chrono::steady_clock::now();
  uint8_t* page = map_ + at * kPageBytes;
  if (::madvise(page, kPageBytes, MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(at * kPageBytes),
                static_cast<off_t>(kPageBytes));
    MutexLock lock(mu_);
    ++refused_;
    if (target_ > pages_) --target_;  // the tier's loan shrinks with what could not be had
    if (refused_ == 1) spdlog::info("the page reserve stops at {} pages: {}", pages_, std::strerror(err));
    return Growth::kRefused;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MutexLock lock(mu_);
  pages_ = at + 1;
  ++grown_;
  grow_seconds_ += took;
  return Growth::kGrew;
}

PageReserve::Stats PageReserve::GetStats() const {
  MutexLock lock(mu_);
  return {pages_, target_, limit_pages_, grown_, grow_seconds_, given_, refused_};
}

}  // namespace ckptfs
