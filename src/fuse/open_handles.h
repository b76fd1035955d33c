// OpenHandles: open files and directories by the number the kernel holds
// for them (fuse_file_info::fh).
//
// A handle is a number, not a pointer: after a daemon dies, the kernel goes
// on sending the fh values the dead one gave, to whichever daemon took the
// connection over. A number this process never issued is simply unknown
// here (the operation then rebuilds what it needs from the inode, which
// names the file), where a pointer would be dereferenced into garbage.
// Numbers start at a random 64-bit base so that two daemons' handles do not
// meet.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckptfs/file_server.h"
#include "ckptfs/mutex.h"
#include "ckptfs/view.h"

namespace ckptfs::fuse {

// Per open file: what the FileServer reads it through.
struct OpenFile {
  std::shared_ptr<ServedFile> served;
  // Opened by the daemon this one took over from, and counted in the open
  // modes it handed over (released as an inherited open).
  bool inherited = false;
};

// An open directory: its node as it was at opendir. A published node's
// children never change (a new snapshot makes new nodes), so offsets stay
// meaningful while the view changes underneath, and nothing is copied at
// open: a copy of the listing per open cost a directory of 50,000 entries
// 15 MB and 20-40 ms of a FUSE thread each time, and one user's loop of
// opens held every thread and took gigabytes.
// Offsets: 1 is ".", 2 is "..", 3 + k the k-th child (each entry carries
// the offset of the one after it). In the root and by-name, k counts only
// the entries the caller may reach: gaps would tell them how many others
// there are, and when they come and go.
struct DirHandle {
  View::NodePtr dir;
  View::NodePtr parent;   // what ".." names
  bool filtered = false;  // the root and by-name: each caller sees only the entries it may reach
  // Where the last ReadDir stopped (just after the last entry it gave, the
  // offset the kernel asks for next), so that a listing read in order costs
  // each entry once; in a filtered directory, for whom it was counted.
  Mutex mu;
  off_t next_offset GUARDED_BY(mu) = -1;
  std::map<std::string, InodeId>::const_iterator next GUARDED_BY(mu);
  std::pair<uid_t, gid_t> counted_for GUARDED_BY(mu){};
};

class OpenHandles {
 public:
  OpenHandles();

  uint64_t AddFile(std::shared_ptr<OpenFile> file);
  // Registers a handle another daemon issued (rebuilt from its inode); when
  // a concurrent request adopted it first, `file` becomes that one and the
  // result is false.
  bool AdoptFile(uint64_t fh, std::shared_ptr<OpenFile>& file);
  std::shared_ptr<OpenFile> File(uint64_t fh) const;
  // Removes and returns it; null for a handle this process does not hold.
  std::shared_ptr<OpenFile> TakeFile(uint64_t fh);

  uint64_t AddDir(std::shared_ptr<DirHandle> dir);
  void AdoptDir(uint64_t fh, std::shared_ptr<DirHandle> dir);
  std::shared_ptr<DirHandle> Dir(uint64_t fh) const;
  void RemoveDir(uint64_t fh);

 private:
  mutable SharedMutex mu_;
  std::atomic<uint64_t> next_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenFile>> files_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<DirHandle>> dirs_ GUARDED_BY(mu_);
};

}  // namespace ckptfs::fuse
