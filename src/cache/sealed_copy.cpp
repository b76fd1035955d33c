#include "ckptfs/sealed_copy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

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
    return huge ? WriteBy::kHugePageMapping : WriteBy::kPwrite;
  }();
  return how;
}

Result<std::unique_ptr<SealedCopy>> SealedCopy::Create(const std::string& name, uint64_t size, WriteBy how) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Status::FromErrno("memfd_create for " + name, errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno("cannot size the memfd for " + name + " to " + std::to_string(size) + " bytes", errno);
  }
  std::unique_ptr<SealedCopy> copy(new SealedCopy(name, std::move(fd), size));
  if (how == WriteBy::kHugePageMapping && size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, copy->fd(), 0);
    if (p == MAP_FAILED) return Status::FromErrno("cannot map the memfd for " + name, errno);
    copy->map_ = static_cast<uint8_t*>(p);
    ::madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);
  }
  return copy;
}

SealedCopy::~SealedCopy() {
  Unlock();
  Unmap();
}

void SealedCopy::Unmap() {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(size_));
  map_ = nullptr;
}

Status SealedCopy::Write(uint64_t offset, const uint8_t* data, size_t len) {
  if (sealed_) return Status::Error(name_ + " is sealed");
  if (offset + len > size_) return Status::Error(name_ + ": write past its size");
  if (map_ != nullptr) {  // the huge-page mapping
    std::memcpy(map_ + offset, data, len);
    return Status::Ok();
  }
  for (size_t done = 0; done < len;) {
    const ssize_t n = ::pwrite(fd_.get(), data + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno("cannot write the memfd for " + name_, n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

uint8_t* SealedCopy::WritableAt(uint64_t offset, size_t len) const {
  if (sealed_ || map_ == nullptr || offset + len > size_) return nullptr;
  return map_ + offset;
}

Status SealedCopy::Seal() {
  if (sealed_) return Status::Ok();
  Unmap();  // a writable mapping would make the kernel refuse F_SEAL_WRITE; the pages stay
  if (::fcntl(fd_.get(), F_ADD_SEALS, kAllSeals) != 0) return Status::FromErrno("cannot seal the memfd for " + name_, errno);
  if (static_cast<unsigned>(::fcntl(fd_.get(), F_GET_SEALS)) != kAllSeals) {
    return Status::Error("the memfd for " + name_ + " did not keep its seals");
  }
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_.get(), 0);
    if (p == MAP_FAILED) return Status::FromErrno("cannot map the sealed memfd for " + name_, errno);
    map_ = static_cast<uint8_t*>(p);
    ::madvise(map_, static_cast<size_t>(size_), MADV_HUGEPAGE);
  }
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
