#include "ckptfs/sealed_copy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace ckptfs {

namespace {

constexpr unsigned kAllSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

uint8_t* MapOrNull(int fd, uint64_t size, int prot) {
  if (size == 0) return nullptr;
  void* p = ::mmap(nullptr, static_cast<size_t>(size), prot, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

}  // namespace

Result<std::unique_ptr<SealedCopy>> SealedCopy::Create(const std::string& name, uint64_t size) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Status::FromErrno("memfd_create for " + name, errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno("cannot size the memfd for " + name + " to " + std::to_string(size) + " bytes", errno);
  }
  uint8_t* map = MapOrNull(fd.get(), size, PROT_READ | PROT_WRITE);
  if (size > 0 && map == nullptr) return Status::FromErrno("cannot map the memfd for " + name, errno);
  // Large pages where the kernel's shmem_enabled allows it ("advise" honours
  // this; "never" ignores it): fewer page faults and TLB misses for readers.
  if (map != nullptr) ::madvise(map, static_cast<size_t>(size), MADV_HUGEPAGE);
  return std::unique_ptr<SealedCopy>(new SealedCopy(name, std::move(fd), size, map));
}

SealedCopy::~SealedCopy() { Unmap(); }

void SealedCopy::Unmap() {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(size_));
  map_ = nullptr;
}

Status SealedCopy::Seal() {
  if (sealed_) return Status::Ok();
  // The kernel refuses F_SEAL_WRITE while a writable shared mapping exists;
  // the pages stay in the memfd.
  Unmap();
  if (::fcntl(fd_.get(), F_ADD_SEALS, kAllSeals) != 0) return Status::FromErrno("cannot seal the memfd for " + name_, errno);
  if (static_cast<unsigned>(::fcntl(fd_.get(), F_GET_SEALS)) != kAllSeals) {
    return Status::Error("the memfd for " + name_ + " did not keep its seals");
  }
  map_ = MapOrNull(fd_.get(), size_, PROT_READ);
  if (size_ > 0 && map_ == nullptr) return Status::FromErrno("cannot map the sealed memfd for " + name_, errno);
  if (map_ != nullptr) ::madvise(map_, static_cast<size_t>(size_), MADV_HUGEPAGE);
  sealed_ = true;
  return Status::Ok();
}

int SealedCopy::Lock() const {
  if (locked_ || map_ == nullptr) return 0;
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
    const std::function<std::shared_ptr<CopyAttachment>()>& make) const {
  std::lock_guard lock(attach_mu_);
  if (!attachment_) attachment_ = make();
  return attachment_;
}

}  // namespace ckptfs
