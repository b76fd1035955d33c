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
// How the copy is written depends on the kernel's huge-page policy for
// shmem (transparent_hugepage/shmem_enabled). Where a mapping can get 2 MiB
// pages ("advise" with MADV_HUGEPAGE, "always", "within_size", "force") the
// copy is written through a writable mapping (dropped before sealing: the
// kernel refuses F_SEAL_WRITE while one exists), into which a fill reads the
// source directly (WritableAt): one copy of each byte, and a fault per 2 MiB.
// Under "never" or "deny" it is written with pwrite, which lets shmem
// allocate each 4 KiB page as it is written, without the zeroing and the
// page fault per 4 KiB that a mapping costs. Measured on a 750 MB file with
// its source in the page cache, read in 4 MiB chunks, XXH3 included, one
// thread: pwrite from a buffer 1.1-1.3 GB/s; read into a 4 KiB-page mapping
// 0.63-0.67 GB/s; read into a 2 MiB-page mapping 3.5-3.6 GB/s.
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
  // The kernel's policy for huge pages in memfds: the global shmem_enabled
  // ("always", "within_size", "advise", "never", "deny", "force").
  static std::string ShmemHugePages();
  // The value of a transparent_hugepage setting file at `path`: its
  // bracketed word ("always [advise] never"), or the only word of a file that
  // holds one (what a write leaves in a copy of the file); "" when unreadable.
  static std::string ReadHugePageSetting(const std::string& path);
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
  // Before Seal only, for a copy written through a mapping: where the bytes
  // at [offset, offset + len) go, so that a reader can put them there itself
  // (one copy of each byte instead of two) and they are checked where they
  // will be served; there is room up to the end of the last page. Null for a
  // copy written with pwrite, or a range past the end.
  uint8_t* WritableAt(uint64_t offset, size_t len) const;
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
