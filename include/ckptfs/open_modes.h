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
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckptfs/file_cache.h"
#include "ckptfs/mutex.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs::daemon {

class OpenModes {
 public:
  struct Choice {
    bool passthrough = false;
    FileCache::CopyPtr copy;                   // passthrough: the backing copy; else a resident copy to read from, if any
    std::shared_ptr<CopyAttachment> backing;   // passthrough: the kernel's backing id
    const char* why = "";                      // the chunk path: why
  };

  // Registers an open of `ino`. For the first open `decide` chooses; a
  // later one joins the choice in force (for the chunk path it may still
  // bring its own resident copy, from `resident`).
  Choice Open(uint64_t ino, const std::function<Choice()>& decide, const std::function<FileCache::CopyPtr()>& resident);
  // An open of `ino` ended (released, or its reply never reached the kernel).
  // True when that was the last open of an inode served by the chunk path
  // (the kernel may hold page cache for it that passthrough will not use).
  bool Release(uint64_t ino);
  size_t inodes() const;
  // `ino` has open files now: a new open of it will join their mode.
  bool IsOpen(uint64_t ino) const;

  // Hand-over between daemons (ckptfsctl restart): the inodes with open
  // files, how many, and how they are served; the successor takes them on
  // with Inherit, so that its opens join the mode the kernel holds. Opens
  // inherited are ended by ReleaseInherited (a release for a handle the
  // successor never gave).
  struct Held {
    uint64_t opens = 0;
    uint64_t inherited = 0;
    Choice choice;
  };
  std::vector<std::pair<uint64_t, Held>> Snapshot() const;
  void Inherit(uint64_t ino, uint64_t opens, Choice choice);
  void ReleaseInherited(uint64_t ino);
  // Some opens of `ino` were inherited and not yet released.
  bool HasInherited(uint64_t ino) const;
  // Told of every change, under the lock (so in order): the inode, its open
  // count now (0: forgotten) and its choice. For a supervisor that hands
  // the record to the successor of a daemon that crashed.
  using Observer = std::function<void(uint64_t ino, uint64_t opens, const Choice& choice)>;
  void SetObserver(Observer observer);

 private:
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Held> held_ GUARDED_BY(mu_);
  Observer observer_;
};

}  // namespace ckptfs::daemon
