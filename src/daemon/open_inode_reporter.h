// OpenInodeReporter: tells the supervisor, from a thread of its own, the
// record of every inode whose open files changed (how many are open, and the
// backing id of a passthrough one), so that should this daemon crash its
// successor joins the mode the kernel holds each inode in (fd_handover.h).
//
// An open or release only notes its inode; the thread sends each noted
// inode's record as it stands when the link has room. So a supervisor that
// reads its link slowly, or not at all for a while (stopped, swapped out),
// stalls no open, and loses nothing: an inode noted again while it waits is
// sent once, with its latest record. What waits is bounded by the number of
// inodes that were open meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <unordered_set>

#include "ckptfs/fuse_ops.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"

namespace ckptfs::daemon {

class OpenInodeReporter {
 public:
  using ReadRecord = std::function<fuse::InheritedInode(uint64_t ino)>;
  // Sends on `link` (not owned; a SOCK_SEQPACKET socket, on which each
  // message goes whole, so other threads may send on it too).
  OpenInodeReporter(int link, ReadRecord read);
  ~OpenInodeReporter();  // Stop()
  OpenInodeReporter(const OpenInodeReporter&) = delete;
  OpenInodeReporter& operator=(const OpenInodeReporter&) = delete;

  // `ino`'s record changed. Never blocks on the link.
  void Changed(uint64_t ino);
  // Inodes noted and not sent yet (status: open_inode_reports_waiting).
  size_t waiting() const;
  // Ends the thread, first sending for up to `flush_for` what waits (a
  // daemon that exits without handing over leaves the supervisor these
  // records for its successor); what still waits then is not sent, and
  // nothing is read any more. Idempotent.
  void Stop(std::chrono::milliseconds flush_for = std::chrono::milliseconds(0));

 private:
  void Run();
  // Sends `record`, waiting for room on the link while not stopped; logs
  // once (`stalled`) that the supervisor is not reading.
  Status SendWhenRoom(const fuse::InheritedInode& record, bool& stalled);
  bool stopping() const;

  const int link_;
  const ReadRecord read_;
  mutable Mutex mu_;
  CondVar noted_cv_;
  std::unordered_set<uint64_t> noted_ GUARDED_BY(mu_);
  std::unordered_set<uint64_t> in_hand_ GUARDED_BY(mu_);  // taken from noted_ by the thread, not sent yet
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<bool> ended_{false};  // the thread returned (stopped, or the link is gone)
  std::thread thread_;
};

}  // namespace ckptfs::daemon
