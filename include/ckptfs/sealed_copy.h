// SealedCopy: a whole file's bytes in a memfd, written once and then sealed
// (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so that nobody,
// root included, can change them afterwards. The host tier keeps verified
// files this way; the kernel may then be handed the memfd as a passthrough
// backing file, because what it serves from it can no longer move.
//
// Life cycle: Create (an empty memfd of the final size), fill with Write,
// Seal (then the copy is mapped read-only for the daemon's own reads). Only
// a sealed copy is ever given out.
//
// How Write fills it depends on the kernel's huge-page policy for shmem
// (transparent_hugepage/shmem_enabled): under "advise" only a mapping with
// MADV_HUGEPAGE gets huge pages, so the copy is written through such a
// mapping (dropped before sealing: the kernel refuses F_SEAL_WRITE while a
// writable mapping exists); otherwise with pwrite, which lets shmem allocate
// each page as it is written, without the zeroing and the page fault per
// 4 KiB a mapping costs (1 GiB: 0.40 s against 0.48 s, measured).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

// Something another layer ties to a copy for as long as the copy lives (the
// FUSE layer's kernel backing id), released with it.
class CopyAttachment {
 public:
  virtual ~CopyAttachment() = default;
};

class SealedCopy {
 public:
  enum class WriteBy { kPwrite, kHugePageMapping };
  // The kernel's policy for 2 MiB pages in shmem: the per-size setting, or
  // the global shmem_enabled it inherits ("always", "advise", "never", ...).
  static std::string ShmemHugePages();
  // What that policy asks for (read once).
  static WriteBy PreferredWrite();

  // An unsealed memfd named `name` (shown in /proc/PID/fd) of `size` bytes.
  static Result<std::unique_ptr<SealedCopy>> Create(const std::string& name, uint64_t size,
                                                    WriteBy how = PreferredWrite());
  ~SealedCopy();
  SealedCopy(const SealedCopy&) = delete;
  SealedCopy& operator=(const SealedCopy&) = delete;

  // Before Seal only: `len` bytes at `offset`.
  Status Write(uint64_t offset, const uint8_t* data, size_t len);
  // Seals the memfd and maps it read-only (huge pages requested for the
  // mapping, where the kernel's shmem_enabled allows them).
  Status Seal();

  bool sealed() const { return sealed_; }
  const uint8_t* data() const { return sealed_ ? map_ : nullptr; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  const std::string& name() const { return name_; }

  // mlock of the mapping; the errno on refusal. Unlock undoes it.
  int Lock() const;
  void Unlock() const;

  // The attachment made by `make` the first time one is asked for (made at
  // most once, under a lock); null if `make` failed.
  std::shared_ptr<CopyAttachment> Attachment(const std::function<std::shared_ptr<CopyAttachment>()>& make) const;

 private:
  SealedCopy(std::string name, UniqueFd fd, uint64_t size) : name_(std::move(name)), fd_(std::move(fd)), size_(size) {}
  void Unmap();

  const std::string name_;
  UniqueFd fd_;
  const uint64_t size_;
  uint8_t* map_ = nullptr;  // writable before Seal (kHugePageMapping), read-only after
  bool sealed_ = false;
  mutable bool locked_ = false;
  mutable std::mutex attach_mu_;
  mutable std::shared_ptr<CopyAttachment> attachment_;
};

}  // namespace ckptfs
