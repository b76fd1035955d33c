#include "ckptfs/sealed_copy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "ckptfs/page_reserve.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ckptfs {

namespace {

constexpr unsigned kAllSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

}  // namespace

// A memfd is a file of the kernel's internal shmem mount, which follows the
// global setting (the per-size ones govern anonymous shared memory only).
std::string SealedCopy::ReadHugePageSetting(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> words;
  for (std::string word; in >> word;) {
    if (word.size() > 2 && word.front() == '[') return word.substr(1, word.size() - 2);
    words.push_back(word);
  }
  return words.size() == 1 ? words[0] : "";
}

std::string SealedCopy::ShmemHugePages() {
  const std::string setting = ReadHugePageSetting("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  return setting.empty() ? "unknown" : setting;
}

SealedCopy::WriteBy SealedCopy::PreferredWrite() {
  static const WriteBy how = [] {
    const std::string s = ShmemHugePages();
    const bool huge = s == "advise" || s == "always" || s == "within_size" || s == "force";
    if (FreshMemoryIsSlow()) return WriteBy::kSmallPageMapping;
    return huge ? WriteBy::kHugePageMapping : WriteBy::kPwrite;
  }();
  return how;
}

namespace {

// VIRTIO_BALLOON_F_REPORTING, a bit of the device's feature string.
constexpr size_t kBalloonReportingBit = 5;
// The buddy allocator's largest order (MAX_PAGE_ORDER on x86-64): a
// page_reporting_order above it reports nothing.
constexpr int kMaxPageOrder = 10;

}  // namespace

bool SealedCopy::FreePageReporting(const std::string& sys) {
  std::ifstream order_file(sys + "/module/page_reporting/parameters/page_reporting_order");
  int order = -1;
  if (!(order_file >> order) || order < 0 || order > kMaxPageOrder) return false;
  const std::string drivers = sys + "/bus/virtio/drivers/virtio_balloon";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(drivers, ec)) {
    if (entry.path().filename().string().rfind("virtio", 0) != 0) continue;
    std::ifstream features(entry.path() / "features");
    std::string bits;
    if (features >> bits && bits.size() > kBalloonReportingBit && bits[kBalloonReportingBit] == '1') return true;
  }
  return false;
}

bool SealedCopy::FreshMemoryIsSlow() {
  static const bool slow = FreePageReporting();
  return slow;
}

SealedCopy::WriteBy SealedCopy::PreferredWriteFor(uint64_t size) {
  return size <= kMemoryCopyMax ? WriteBy::kMemory : PreferredWrite();
}

Result<std::unique_ptr<SealedCopy>> SealedCopy::Create(const std::string& name, uint64_t size) {
  return Create(name, size, PreferredWriteFor(size));
}

namespace {

// Out of descriptors or memory: no room for a copy now, as a full tier.
Status CopyRefused(const std::string& what, int err) {
  if (err == EMFILE || err == ENFILE || err == ENOMEM) return Status::Full(what + ": " + std::strerror(err));
  return Status::FromErrno(what, err);
}

}  // namespace

Result<std::unique_ptr<SealedCopy>> SealedCopy::Create(const std::string& name, uint64_t size, WriteBy how) {
  if (how == WriteBy::kMemory) {
    std::unique_ptr<SealedCopy> copy(new SealedCopy(name, UniqueFd(), size, how));
    if (size > 0) {
      copy->memory_.reset(new (std::nothrow) uint8_t[size]);
      if (!copy->memory_) return CopyRefused("no memory for a copy of " + name, ENOMEM);
      copy->map_ = copy->memory_.get();
    }
    return copy;
  }
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return CopyRefused("memfd_create for " + name, errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno("cannot size the memfd for " + name + " to " + std::to_string(size) + " bytes", errno);
  }
  std::unique_ptr<SealedCopy> copy(new SealedCopy(name, std::move(fd), size, how));
  if (Status s = copy->MapForWriting(); !s.ok()) return s;
  return copy;
}

// k*PageMapping: the mapping the copy is written through. kPwrite: a
// private read-only view of what pwrite put there (ReadableAt), which does
// not keep the kernel from sealing as a shared one would.
Status SealedCopy::MapForWriting() {
  if (size_ == 0) return Status::Ok();
  const bool writable = WrittenThroughMapping();
  void* p = ::mmap(nullptr, static_cast<size_t>(size_), writable ? PROT_READ | PROT_WRITE : PROT_READ,
                   writable ? MAP_SHARED : MAP_PRIVATE, WriterFd(), 0);
  if (p == MAP_FAILED) return CopyRefused("cannot map the memfd for " + name_, errno);
  map_ = static_cast<uint8_t*>(p);
  if (how_ == WriteBy::kHugePageMapping) ::madvise(p, static_cast<size_t>(size_), MADV_HUGEPAGE);
  // 4 KiB pages while it is written, whatever shmem_enabled says ("always"
  // would give 2 MiB). Once sealed, its pages are the kernel's to merge.
  if (how_ == WriteBy::kSmallPageMapping) ::madvise(p, static_cast<size_t>(size_), MADV_NOHUGEPAGE);
  return Status::Ok();
}

// The same pages, read-only, at the same address (MAP_FIXED replaces the
// old mapping in one step: a reader of ReadableAt never finds it unmapped).
Status SealedCopy::MapReadOnly(int flags) {
  void* p = ::mmap(map_, static_cast<size_t>(size_), PROT_READ, flags | MAP_FIXED, WriterFd(), 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    // A MAP_FIXED that fails may leave a hole where the old mapping was:
    // let go of the whole range, so that nothing reads through it
    // (ReadableAt answers null from now on).
    Unmap();
    return Status::FromErrno("cannot map the memfd for " + name_ + " read-only", err);
  }
  ::madvise(p, static_cast<size_t>(size_), MADV_HUGEPAGE);
  return Status::Ok();
}

SealedCopy::~SealedCopy() {
  Unlock();
  Unmap();
}

void SealedCopy::Unmap() {
  if (map_ != nullptr && how_ != WriteBy::kMemory) ::munmap(map_, static_cast<size_t>(size_));
  map_ = nullptr;
}

int SealedCopy::fd() const {
  MutexLock lock(attach_mu_);
  return fd_.get();
}

UniqueFd SealedCopy::TakeDescriptor() const {
  MutexLock lock(attach_mu_);
  return std::move(fd_);
}

bool SealedCopy::OpenElsewhere(int fd) {
  if (::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
    ::fcntl(fd, F_SETLEASE, F_UNLCK);
    return false;
  }
  return true;  // EAGAIN; any other refusal cannot say it is free either
}

bool SealedCopy::LeasesTellReaders() {
  static const bool works = [] {
    auto fail = [](const std::string& why) {
      spdlog::warn("copies in the host tier are not passed through to the kernel: {}; the tier could not tell when "
                   "a reader's mapping lets go of an evicted copy (sysctl fs.leases-enable=1, and a kernel that "
                   "grants leases on memfds, pass them through)",
                   why);
      return false;
    };
    UniqueFd memfd(::memfd_create("ckptfs:lease-check", MFD_CLOEXEC));
    if (!memfd.valid()) return fail(std::string("memfd_create: ") + std::strerror(errno));
    const std::string path = "/proc/self/fd/" + std::to_string(memfd.get());
    UniqueFd mine(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!mine.valid()) return fail("cannot open a memfd again through /proc: " + std::string(std::strerror(errno)));
    if (::fcntl(mine.get(), F_SETLEASE, F_WRLCK) != 0) {
      return fail(std::string("the kernel grants no file lease (") + std::strerror(errno) + ")");
    }
    ::fcntl(mine.get(), F_SETLEASE, F_UNLCK);
    UniqueFd other(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!other.valid() || !OpenElsewhere(mine.get())) return fail("a lease did not see another open file");
    other.reset();
    if (OpenElsewhere(mine.get())) return fail("a lease saw an open file that was closed");
    return true;
  }();
  return works;
}

Status SealedCopy::Write(uint64_t offset, const uint8_t* data, size_t len) {
  if (sealed_) return Status::Error(name_ + " is sealed");
  if (offset + len > size_) return Status::Error(name_ + ": write past its size");
  if (how_ != WriteBy::kPwrite) {  // a mapping, or memory
    if (len > 0) std::memcpy(map_ + offset, data, len);
    return Status::Ok();
  }
  for (size_t done = 0; done < len;) {
    const ssize_t n = ::pwrite(WriterFd(), data + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno("cannot write the memfd for " + name_, n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

uint8_t* SealedCopy::WritableAt(uint64_t offset, size_t len) const {
  if (sealed_ || !WrittenThroughMapping() || offset + len > size_) return nullptr;
  return map_ + offset;
}

uint64_t SealedCopy::HugePagesAt(uint64_t offset, uint64_t len) const {
  constexpr uint64_t kHuge = PageReserve::kPageBytes;
  if (sealed_ || how_ != WriteBy::kSmallPageMapping || map_ == nullptr || offset >= size_) return 0;
  if ((reinterpret_cast<uintptr_t>(map_) + offset) % kHuge != 0) return 0;
  // A huge page must lie inside the mapping, which ends at the last 4 KiB
  // page of the file.
  return std::min(len, size_ - offset) / kHuge * kHuge;
}

bool SealedCopy::PlaceHugePages(uint64_t offset, uint64_t len) {
  if (len == 0 || HugePagesAt(offset, len) < len) return false;
  uint8_t* at = map_ + offset;
  return ::madvise(at, len, MADV_HUGEPAGE) == 0 && ::madvise(at, len, MADV_POPULATE_WRITE) == 0;
}

const uint8_t* SealedCopy::ReadableAt(uint64_t offset, size_t len) const {
  if (map_ == nullptr || offset + len > size_) return nullptr;
  return map_ + offset;
}

Status SealedCopy::Seal() {
  if (sealed_) return Status::Ok();
  if (how_ == WriteBy::kMemory) {
    sealed_ = true;
    return Status::Ok();
  }
  MutexLock lock(remap_mu_);
  remapping_ = true;
  while (mapping_holds_ != 0) remap_cv_.Wait(remap_mu_);
  lock.Unlock();
  Status s = RemapSealed();
  lock.Lock();
  remapping_ = false;
  remap_cv_.NotifyAll();
  return s;
}

// Seal's work, once no reader holds the mapping.
Status SealedCopy::RemapSealed() {
  // A writable mapping would make the kernel refuse F_SEAL_WRITE: replace
  // it with a private read-only one first (the pages stay).
  if (WrittenThroughMapping() && size_ > 0) {
    if (Status s = MapReadOnly(MAP_PRIVATE); !s.ok()) return s;
  }
  if (::fcntl(WriterFd(), F_ADD_SEALS, kAllSeals) != 0) return Status::FromErrno("cannot seal the memfd for " + name_, errno);
  if (static_cast<unsigned>(::fcntl(WriterFd(), F_GET_SEALS)) != kAllSeals) {
    return Status::Error("the memfd for " + name_ + " did not keep its seals");
  }
  if (size_ > 0) {
    if (Status s = MapReadOnly(MAP_SHARED); !s.ok()) return s;
  }
  // From now on the copy holds a read-only descriptor of the memfd, which
  // the kernel is given for passthrough and the host tier asks, once it
  // lets go of the copy, whether anyone still holds the pages
  // (OpenElsewhere). The mapping keeps the pages it maps either way.
  // Without it (no /proc, out of descriptors) or without leases, the copy
  // is never handed to the kernel: readers it could not see would keep
  // pages outside the tier's budget.
  UniqueFd read_only(::open(("/proc/self/fd/" + std::to_string(WriterFd())).c_str(), O_RDONLY | O_CLOEXEC));
  if (read_only.valid() && LeasesTellReaders()) {
    MutexLock lock(attach_mu_);
    fd_ = std::move(read_only);
    readers_visible_ = true;
  }
  sealed_ = true;
  return Status::Ok();
}

SealedCopy::MappingHold SealedCopy::HoldMapping() const {
  MutexLock lock(remap_mu_);
  while (remapping_) remap_cv_.Wait(remap_mu_);
  ++mapping_holds_;
  return MappingHold(this);
}

void SealedCopy::ReleaseHold() const {
  MutexLock lock(remap_mu_);
  if (--mapping_holds_ == 0) remap_cv_.NotifyAll();
}

SealedCopy::MappingHold& SealedCopy::MappingHold::operator=(MappingHold&& other) noexcept {
  if (this != &other) {
    if (copy_ != nullptr) copy_->ReleaseHold();
    copy_ = std::exchange(other.copy_, nullptr);
  }
  return *this;
}

SealedCopy::MappingHold::~MappingHold() {
  if (copy_ != nullptr) copy_->ReleaseHold();
}

int SealedCopy::Lock() const {
  if (locked_ || map_ == nullptr || size_ == 0) return 0;
  if (::mlock(map_, static_cast<size_t>(size_)) != 0) return errno;
  locked_ = true;
  return 0;
}

void SealedCopy::Unlock() const {
  if (!locked_) return;
  ::munlock(map_, static_cast<size_t>(size_));
  locked_ = false;
}

std::shared_ptr<CopyAttachment> SealedCopy::Attachment(
    const std::function<std::shared_ptr<CopyAttachment>(int fd)>& make) const {
  MutexLock lock(attach_mu_);
  if (!attachment_ && fd_.valid() && readers_visible_) attachment_ = make(fd_.get());
  return attachment_;
}

}  // namespace ckptfs
