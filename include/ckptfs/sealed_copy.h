// SealedCopy: a whole file's bytes in a memfd, written once and then sealed
// (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so that nobody,
// root included, can change them afterwards. The host tier keeps verified
// files this way; the kernel may then be handed the memfd as a passthrough
// backing file, because what it serves from it can no longer move.
//
// Life cycle: Create (an empty memfd of the final size), fill with Write,
// Seal (then the copy is mapped read-only for the daemon's own reads). Only
// a sealed copy is ever handed to the kernel; the daemon itself may serve
// verified ranges of one still being filled (ReadableAt).
//
// Small files are held in the daemon's memory instead (kMemory, no memfd):
// the same life cycle, served by the daemon, never passed through; "sealed"
// then means only that Write is refused from then on.
//
// How the copy is written depends on the kernel's huge-page policy for
// shmem (transparent_hugepage/shmem_enabled). Where a mapping can get 2 MiB
// pages ("advise" with MADV_HUGEPAGE, "always", "within_size", "force") the
// copy is written through a writable mapping (dropped before sealing: the
// kernel refuses F_SEAL_WRITE while one exists), into which a fill reads the
// source directly (WritableAt): one copy of each byte, and a fault per 2 MiB.
// (Not on a VM that reports free pages to its host: see below.)
// Under "never" or "deny" it is written with pwrite, which lets shmem
// allocate each 4 KiB page as it is written, without the zeroing and the
// page fault per 4 KiB that a mapping costs. Measured on a 750 MB file with
// its source in the page cache, read in 4 MiB chunks, XXH3 included, one
// thread: pwrite from a buffer 1.1-1.3 GB/s; read into a 4 KiB-page mapping
// 0.63-0.67 GB/s; read into a 2 MiB-page mapping 3.5-3.6 GB/s. Into fresh
// memory on a VM that reports free pages to its host the order turns: the
// first touch of each page faults in the host, and a 2 MiB page costs
// several times what 512 small ones do (a cold 750 MB file read into a
// 2 MiB-page mapping: 0.12-0.23 GB/s, all in clear_page; with pwrite
// 0.46-0.65 GB/s). And pwrite into one memfd takes its inode's lock, so the
// threads that copy one file fault its fresh pages one at a time, where
// page faults through a shared mapping run side by side (3 GB into fresh
// memory, 4 MiB at a time, 2 threads: pwrite 0.43-0.95 GB/s, memcpy into
// a 4 KiB-page mapping 1.00-1.42 GB/s). There copies are written through
// a mapping of 4 KiB pages (kSmallPageMapping), and read into directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ckptfs/mutex.h"
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
  // How the copy is held and written. kPwrite, kHugePageMapping and
  // kSmallPageMapping are memfds (see above); kMemory keeps the bytes in
  // the daemon's own memory, with no descriptor: a small file (a config, a tokenizer's settings) is
  // served from there by the daemon, since passthrough would save it little
  // and a memfd each would let a user who reads 25,000 of them take every
  // descriptor the daemon has.
  enum class WriteBy { kPwrite, kHugePageMapping, kSmallPageMapping, kMemory };
  // Files up to this size are copied kMemory by default.
  static constexpr uint64_t kMemoryCopyMax = 256 << 10;
  // The kernel's policy for huge pages in memfds: the global shmem_enabled
  // ("always", "within_size", "advise", "never", "deny", "force").
  static std::string ShmemHugePages();
  // The value of a transparent_hugepage setting file at `path`: its
  // bracketed word ("always [advise] never"), or the only word of a file that
  // holds one (what a write leaves in a copy of the file); "" when unreadable.
  static std::string ReadHugePageSetting(const std::string& path);
  // How that policy asks a memfd to be written (read once), unless the
  // machine hands freed memory back to a hypervisor (FreePageReporting):
  // there a copy is written through a mapping of 4 KiB pages whatever the
  // policy.
  static WriteBy PreferredWrite();
  // Whether this machine hands freed memory back to a hypervisor, so that a
  // first touch of fresh memory is slow: a virtio-balloon device offering
  // free page reporting, with the kernel's page_reporting_order within the
  // buddy allocator's orders. `sys` is the sysfs root.
  static bool FreePageReporting(const std::string& sys = "/sys");
  // The same, read once for this process.
  static bool FreshMemoryIsSlow();
  // How a copy of `size` bytes is made by default: kMemory up to
  // kMemoryCopyMax, else PreferredWrite().
  static WriteBy PreferredWriteFor(uint64_t size);
  // Whether a copy of `size` bytes made by default holds a descriptor.
  static bool NeedsDescriptor(uint64_t size) { return PreferredWriteFor(size) != WriteBy::kMemory; }
  // Whether a copy of `size` bytes made by default is written in 4 KiB
  // pages, and so can take the page reserve's 2 MiB ones (take_reserve).
  static bool CanTakeReservePages(uint64_t size) { return PreferredWriteFor(size) == WriteBy::kSmallPageMapping; }

  // An unsealed copy named `name` (for a memfd, shown in /proc/PID/fd) of
  // `size` bytes, made PreferredWriteFor(size) or as `how` says. Out of
  // descriptors or memory, kFull.
  static Result<std::unique_ptr<SealedCopy>> Create(const std::string& name, uint64_t size);
  static Result<std::unique_ptr<SealedCopy>> Create(const std::string& name, uint64_t size, WriteBy how);
  ~SealedCopy();
  SealedCopy(const SealedCopy&) = delete;
  SealedCopy& operator=(const SealedCopy&) = delete;

  // Before Seal only: `len` bytes at `offset`.
  Status Write(uint64_t offset, const uint8_t* data, size_t len);
  // Before Seal only, for a copy written through a mapping: where the bytes
  // at [offset, offset + len) go, so that a reader can put them there itself
  // (one copy of each byte instead of two) and they are checked where they
  // will be served; there is room up to the end of the last page. Null for a
  // copy written with pwrite or held in memory, or a range past the end.
  uint8_t* WritableAt(uint64_t offset, size_t len) const;
  // Before Seal, for a copy written through a mapping of 4 KiB pages
  // (kSmallPageMapping): the whole 2 MiB pages of [offset, offset + len)
  // that can be huge (aligned, inside the mapping), from `offset`; 0 if none.
  uint64_t HugePagesAt(uint64_t offset, uint64_t len) const;
  // Gives those pages, of a range HugePagesAt allowed, 2 MiB pages now
  // (MADV_HUGEPAGE, then MADV_POPULATE_WRITE): right after the page reserve
  // freed as many, which the kernel's allocator then hands out again. False
  // if the kernel refused (the range is then written in what it got).
  bool PlaceHugePages(uint64_t offset, uint64_t len);
  bool WrittenThroughMapping() const {
    return how_ == WriteBy::kHugePageMapping || how_ == WriteBy::kSmallPageMapping;
  }
  // Before Seal: the bytes written so far at [offset, offset + len), for
  // the filler's own checks and for the daemon's reads of chunks it has
  // verified while the rest is still being copied (never for the kernel:
  // only a sealed copy is handed to it). Null past the end, and after a
  // Seal that could not map the copy again. Otherwise the address stays
  // valid, with the same bytes, after Seal, for as long as the copy lives.
  const uint8_t* ReadableAt(uint64_t offset, size_t len) const;

  // Held by a reader of ReadableAt's bytes before Seal for as long as it
  // uses them (a FUSE reply in flight from a copy being made). Seal waits
  // for the holds there are and makes new ones wait while it replaces the
  // mapping at that address: the bytes are the same before and after, but
  // the replacement is a write of the range for anyone reasoning about
  // memory (ThreadSanitizer among them), so it must be ordered with the
  // reads. Seal goes first: a steady stream of readers cannot keep it off.
  class MappingHold {
   public:
    MappingHold() = default;
    explicit MappingHold(const SealedCopy* copy) : copy_(copy) {}
    MappingHold(MappingHold&& other) noexcept : copy_(std::exchange(other.copy_, nullptr)) {}
    MappingHold& operator=(MappingHold&& other) noexcept;
    MappingHold(const MappingHold&) = delete;
    MappingHold& operator=(const MappingHold&) = delete;
    ~MappingHold();

   private:
    const SealedCopy* copy_ = nullptr;
  };
  MappingHold HoldMapping() const;
  // Seals the memfd (and maps it read-only, huge pages requested for the
  // mapping where the kernel's shmem_enabled allows them, in place of the
  // mapping it was written or read through, so that ReadableAt's addresses
  // never stop being mapped); a kMemory copy is only marked sealed.
  Status Seal();

  bool sealed() const { return sealed_; }
  const uint8_t* data() const { return sealed_ ? map_ : nullptr; }
  uint64_t size() const { return size_; }
  // The memfd; -1 for a kMemory copy or once TakeDescriptor ran. Once
  // sealed, a descriptor opened read-only (see OpenElsewhere), unless the
  // memfd could not be opened again (no /proc): then the one it was written
  // through, and readers_visible() is false.
  int fd() const;
  bool holds_descriptor() const { return fd() >= 0; }
  bool in_memory() const { return how_ == WriteBy::kMemory; }
  bool readers_visible() const { return readers_visible_; }
  // Hands the memfd over to a host tier that lets go of the copy: its
  // mapping (and every reader of it, and a kernel passthrough backing made
  // from it already) keeps the pages; the tier keeps the descriptor only to
  // learn when the kernel's readers are gone (OpenElsewhere).
  UniqueFd TakeDescriptor() const;
  // Whether the inode of `fd`, a sealed copy's read-only descriptor, has an
  // open file description other than `fd`'s own: a file the kernel opened
  // on it for a passthrough open, which every mapping of such a file keeps
  // too, after its close. The daemon hears of neither (a mapping outlives
  // the RELEASE it sent), so it asks the kernel: a write lease is granted
  // only to the sole opener of a file (fs/locks.c, check_conflicting_open),
  // and is given back at once. The daemon's own mappings come from the
  // descriptor the copy was written through, which no lease counts (a
  // memfd's first descriptor takes no write access). True when the kernel
  // refuses the lease for any reason: nothing then says the copy is free.
  // Never asked of a copy some FUSE open may attach to at that moment: an
  // open with O_NONBLOCK during the lease would fail.
  static bool OpenElsewhere(int fd);
  // Whether leases tell readers apart on this machine (fs.leases-enable,
  // an LSM, /proc): checked once, with one warning when not. Without it no
  // copy is readers_visible(), so none is passed through.
  static bool LeasesTellReaders();
  const std::string& name() const { return name_; }

  // mlock of the mapping; the errno on refusal. Unlock undoes it.
  int Lock() const;
  void Unlock() const;

  // The attachment made by `make` from the memfd the first time one is asked
  // for (made at most once, under a lock that TakeDescriptor takes too,
  // so the descriptor cannot be closed under `make`); null if `make` failed,
  // the copy has no descriptor any more, or its readers would not be
  // visible (readers_visible(): the kernel could keep its pages unseen).
  std::shared_ptr<CopyAttachment> Attachment(const std::function<std::shared_ptr<CopyAttachment>(int fd)>& make) const;

 private:
  SealedCopy(std::string name, UniqueFd fd, uint64_t size, WriteBy how)
      : name_(std::move(name)), fd_(std::move(fd)), size_(size), how_(how) {}
  Status MapForWriting();
  Status MapReadOnly(int flags);
  Status RemapSealed();
  void ReleaseHold() const;
  // The memfd, for the copy's writer (Write, Seal and the mappings they
  // make) without attach_mu_: until the copy is published nobody else has
  // it, and TakeDescriptor, the only other writer of fd_, runs only on a
  // published copy.
  int WriterFd() const NO_THREAD_SAFETY_ANALYSIS { return fd_.get(); }
  void Unmap();

  const std::string name_;
  mutable UniqueFd fd_ GUARDED_BY(attach_mu_);
  const uint64_t size_;
  const WriteBy how_;
  // k*PageMapping: writable before Seal; kPwrite: a private read-only
  // view before Seal (a shared one would keep the kernel from sealing);
  // both read-only and shared after. kMemory: memory_.
  uint8_t* map_ = nullptr;
  std::unique_ptr<uint8_t[]> memory_;
  bool sealed_ = false;
  bool readers_visible_ = false;  // fd_ was opened read-only at Seal
  mutable bool locked_ = false;
  mutable Mutex attach_mu_;
  // MappingHold's: how many readers hold the mapping, and whether Seal is
  // replacing it (then new holds wait).
  mutable Mutex remap_mu_;
  mutable CondVar remap_cv_;
  mutable int mapping_holds_ GUARDED_BY(remap_mu_) = 0;
  bool remapping_ GUARDED_BY(remap_mu_) = false;
  mutable std::shared_ptr<CopyAttachment> attachment_ GUARDED_BY(attach_mu_);
};

}  // namespace ckptfs
