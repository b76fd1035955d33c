// OpenModes: which way each inode with open files is being served.
//
// The kernel allows one I/O mode per FUSE inode at a time (fs/fuse/iomode.c):
// while a file of an inode is open through passthrough, every other open of
// it must be passthrough to the same backing file, and while one is open
// through the page cache (the chunk path), a passthrough open fails; an open
// that breaks the rule fails with EIO. So the daemon decides once, at the
// first open of an inode, and answers every open that joins it alike until
// the last of them is released; then the inode is forgotten (nothing here
// grows with files that come and go). The kernel ends an open's mode before
// it sends RELEASE, so this record never lags behind the kernel's.
//
// Locking, as libfuse's passthrough_hp keeps it: one short daemon-wide lock
// for the table of open inodes, under which nothing but counting happens, and
// a lock per inode under which its mode is decided (the decision may ask the
// kernel for a backing file: an ioctl). So an open that waits for the kernel
// holds up only the other opens of its own inode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckptfs/file_cache.h"
#include "ckptfs/mutex.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs::fuse {

class OpenModes {
 public:
  struct Choice {
    bool passthrough = false;
    FileCache::CopyPtr copy;                   // passthrough: the backing copy; else a resident copy to read from, if any
    std::shared_ptr<CopyAttachment> backing;   // passthrough: the kernel's backing id
    const char* why = "";                      // the chunk path: why
  };

  // Registers an open of `ino`. For the first open `decide` chooses (under
  // the inode's own lock only); a later one joins the choice in force (for
  // the chunk path it may still bring its own resident copy, from
  // `resident`, called with no lock held).
  Choice Open(uint64_t ino, const std::function<Choice()>& decide, const std::function<FileCache::CopyPtr()>& resident);
  // An open of `ino` ended (released, or its reply never reached the kernel).
  // True when that was the last open of an inode served by the chunk path
  // (the kernel may hold page cache for it that passthrough will not use).
  // `opens_since_idle`, if given, receives OpensSinceIdle as it was before
  // this release, read under the same lock.
  bool Release(uint64_t ino, uint64_t* opens_since_idle = nullptr);
  size_t inodes() const;
  // `ino` has open files now: a new open of it will join their mode.
  bool IsOpen(uint64_t ino) const;
  // The opens `ino` has had since it last had none, those released
  // included (0: none open now). More than 1 before an open's release:
  // that open was not alone (a loader that opened the file again to map
  // it, whose passthrough map does not hold the open: see HeaderScans).
  uint64_t OpensSinceIdle(uint64_t ino) const;

  // Hand-over between daemons (ckptfsctl restart): the inodes with open
  // files, how many, and how they are served; the successor takes them on
  // with Inherit, so that its opens join the mode the kernel holds. Opens
  // inherited are ended by ReleaseInherited (a release for a handle the
  // successor never gave).
  struct Held {
    uint64_t opens = 0;
    uint64_t inherited = 0;
    Choice choice;  // the chunk path while the first open still decides
  };
  std::vector<std::pair<uint64_t, Held>> Snapshot() const;
  void Inherit(uint64_t ino, uint64_t opens, Choice choice);
  void ReleaseInherited(uint64_t ino);
  // Some opens of `ino` were inherited and not yet released.
  bool HasInherited(uint64_t ino) const;
  // `ino`'s record now; nullopt when none of its files is open.
  std::optional<Held> Find(uint64_t ino) const;

  // Told, on the thread that made it and with no lock held, that `ino`'s
  // record changed (an open, a release, a decision); Find() reads it. Cheap
  // and non-blocking, as every open waits for it: a supervisor's reporter
  // (fd_handover.h) only notes the inode and reads its record later, so
  // that what it last sends for an inode is the record as it stands.
  using Observer = std::function<void(uint64_t ino)>;
  void SetObserver(Observer observer);

 private:
  // The part of an inode's record that its first open decides.
  struct Mode {
    Mutex mu;
    bool decided GUARDED_BY(mu) = false;
    Choice choice GUARDED_BY(mu);
  };
  struct Entry {
    uint64_t opens = 0;
    uint64_t opens_since_idle = 0;  // opens counted since the entry was made
    uint64_t inherited = 0;
    std::shared_ptr<Mode> mode;  // shared with the opens under way while the entry is erased
  };
  // The entry of `ino`, made if need be, with `opens` more counted: its mode,
  // and the observer to tell (taken in the same critical section, so that an
  // open takes the table lock once).
  struct Counted {
    std::shared_ptr<Mode> mode;
    std::shared_ptr<const Observer> observer;
  };
  Counted Count(uint64_t ino, uint64_t opens, uint64_t inherited);
  static void Tell(const std::shared_ptr<const Observer>& observer, uint64_t ino);
  static Choice ChoiceOf(Mode& mode);

  mutable Mutex mu_;
  std::unordered_map<uint64_t, Entry> held_ GUARDED_BY(mu_);
  std::shared_ptr<const Observer> observer_ GUARDED_BY(mu_);
};

}  // namespace ckptfs::fuse
