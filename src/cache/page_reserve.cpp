#include "ckptfs/page_reserve.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include <spdlog/spdlog.h>

#include "ckptfs/status.h"

namespace ckptfs {

namespace {

// The unit the reserve holds and frees: one huge page, so that what Hand
// frees is whole pages a huge-page copy can take.
constexpr uint64_t kUnit = 2ull << 20;

#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14
#endif

uint64_t RoundDown(uint64_t n) { return n / kUnit * kUnit; }

// While it holds memory, the reserve looks this often whether the machine
// is running short of it.
constexpr auto kMemoryCheckEvery = std::chrono::seconds(1);

// VIRTIO_BALLOON_F_REPORTING, a bit of the device's feature string.
constexpr size_t kBalloonReportingBit = 5;
// The buddy allocator's largest order (MAX_PAGE_ORDER on x86-64): a
// page_reporting_order above it reports nothing.
constexpr int kMaxPageOrder = 10;

}  // namespace

PageReserve::PageReserve(uint64_t limit, std::chrono::seconds keep) : limit_(RoundDown(limit)), keep_(keep) {}

PageReserve::~PageReserve() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    changed_.NotifyAll();
  }
  if (idle_.joinable()) idle_.join();
  MutexLock lock(mu_);
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(mapped_));
}

Status PageReserve::Open() {
  if (map_ != nullptr) return Status::Ok();
  UniqueFd fd(::memfd_create("ckptfs:page-reserve", MFD_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno("memfd_create for the page reserve", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(limit_)) != 0) {
    return Status::FromErrno("cannot size the page reserve to " + std::to_string(limit_) + " bytes", errno);
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(limit_), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                   fd.get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno("cannot map the page reserve", errno);
  ::madvise(p, static_cast<size_t>(limit_), MADV_HUGEPAGE);
  fd_ = std::move(fd);
  map_ = static_cast<uint8_t*>(p);
  mapped_ = limit_;
  return Status::Ok();
}

void PageReserve::Keep(uint64_t bytes, uint64_t room) {
  if (keep_.count() <= 0 || limit_ == 0) return;
  MutexLock lock(mu_);
  if (stopping_) return;
  const uint64_t target = RoundDown(std::min({held_ + bytes, room, limit_}));
  if (target < held_) {
    stats_.returned += held_ - target;
    Shrink(target);
    return;
  }
  if (target == held_ || MemoryIsShort(MemAvailable(), target)) return;
  if (Status s = Open(); !s.ok()) {
    if (!std::exchange(open_warned_, true)) spdlog::warn("{}; freed copies' memory goes back to the kernel", s.message());
    return;
  }
  // Touched now, while the pages the tier just freed are still the guest's:
  // the kernel hands those out first.
  if (::madvise(map_ + held_, static_cast<size_t>(target - held_), MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(held_),
                static_cast<off_t>(target - held_));  // what it did touch
    spdlog::debug("page reserve: cannot touch {} bytes: {}", target - held_, std::strerror(err));
    return;
  }
  stats_.kept += target - held_;
  held_ = target;
  last_use_ = std::chrono::steady_clock::now();
  if (!idle_.joinable()) idle_ = std::thread([this] { GiveBackWhenIdle(); });
  changed_.NotifyAll();
}

uint64_t PageReserve::Hand(uint64_t bytes) {
  MutexLock lock(mu_);
  if (held_ == 0 || bytes == 0) return 0;
  // Whole pages for what the copies wrote so far: a 3-byte tail or a small
  // file adds to the count instead of taking 2 MiB each.
  owed_ += bytes;
  const uint64_t n = std::min(held_, RoundDown(owed_));
  if (n == 0) return 0;
  stats_.handed += n;
  Shrink(held_ - n);
  owed_ = held_ == 0 ? 0 : owed_ - n;
  last_use_ = std::chrono::steady_clock::now();
  return n;
}

void PageReserve::Shrink(uint64_t to) {
  if (to >= held_) return;
  // Frees the pages (and drops them from the reserve's own mapping).
  ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(to),
              static_cast<off_t>(held_ - to));
  held_ = to;
}

void PageReserve::GiveBackWhenIdle() {
  MutexLock lock(mu_);
  while (!stopping_) {
    if (held_ == 0) {
      changed_.Wait(mu_);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    const auto deadline = last_use_ + keep_;
    if (now < deadline && !MemoryIsShort(MemAvailable(), held_)) {
      changed_.WaitUntil(mu_, std::min(deadline, now + kMemoryCheckEvery));
      continue;
    }
    stats_.returned += held_;
    Shrink(0);
    owed_ = 0;
  }
}

bool PageReserve::MemoryIsShort(std::optional<MemInfo> m, uint64_t held) {
  if (!m) return false;
  return m->available < std::max<uint64_t>(held, m->total / 20);
}

std::optional<PageReserve::MemInfo> PageReserve::MemAvailable(const std::string& meminfo) {
  std::ifstream in(meminfo);
  MemInfo m;
  bool total = false, available = false;
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") {
      total = true;
      m.total = kib << 10;
    } else if (key == "MemAvailable:") {
      available = true;
      m.available = kib << 10;
    }
  }
  if (!total || !available) return std::nullopt;
  return m;
}

uint64_t PageReserve::held() const {
  MutexLock lock(mu_);
  return held_;
}

uint64_t PageReserve::allocated() const {
  MutexLock lock(mu_);
  struct stat st;
  if (!fd_.valid() || ::fstat(fd_.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

PageReserve::Stats PageReserve::GetStats() const {
  MutexLock lock(mu_);
  Stats s = stats_;
  s.held = held_;
  return s;
}

bool PageReserve::FreePageReporting(const std::string& sys) {
  std::ifstream order_file(sys + "/module/page_reporting/parameters/page_reporting_order");
  int order = -1;
  if (!(order_file >> order) || order < 0 || order > kMaxPageOrder) return false;
  const std::string drivers = sys + "/bus/virtio/drivers/virtio_balloon";
  DIR* dir = ::opendir(drivers.c_str());
  if (dir == nullptr) return false;
  bool reporting = false;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("virtio", 0) != 0) continue;
    std::ifstream features(drivers + "/" + name + "/features");
    std::string bits;
    if (features >> bits && bits.size() > kBalloonReportingBit && bits[kBalloonReportingBit] == '1') reporting = true;
  }
  ::closedir(dir);
  return reporting;
}

bool PageReserve::FreshPagesAreSlow() {
  static const bool slow = FreePageReporting();
  return slow;
}

}  // namespace ckptfs
