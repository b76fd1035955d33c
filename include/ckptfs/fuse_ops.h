// The FUSE low-level operations over a View: each decodes its request,
// checks the caller's access, asks the View or the FileServer, and replies.
// An open of a file that is resident in the host tier (a verified, sealed
// memfd) is answered with kernel passthrough to that memfd, so reads and
// mmap never reach the daemon; any other open is read through the
// FileServer (its copy, a copy being made, or the verified chunk path).
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/fair_pool.h"
#include "ckptfs/file_server.h"
#include "ckptfs/mutex.h"
#include "ckptfs/open_modes.h"
#include "ckptfs/unique_fd.h"
#include "ckptfs/view.h"

namespace ckptfs::fuse {

class KernelPassthrough;
class ConnectionIo;
class OpenHandles;

std::shared_ptr<OpenHandles> MakeOpenHandles();

// How opens were answered, for stats: passthrough, or the chunk path and why.
class OpenCounts {
 public:
  void Count(const std::string& how);
  std::map<std::string, uint64_t> Get() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, uint64_t> counts_ GUARDED_BY(mu_);
};

struct FsContext {
  View* view = nullptr;
  FileServer* server = nullptr;  // the bytes of the view's files
  std::shared_ptr<KernelPassthrough> passthrough;  // set by AttachConnection
  std::shared_ptr<ConnectionIo> connection;        // set by AttachConnection
  // Open files and directories by the number the kernel holds (fh), so that
  // a daemon that took the connection over can serve handles it never gave.
  std::shared_ptr<OpenHandles> handles = MakeOpenHandles();
  OpenModes open_modes;
  OpenCounts opens;
  uint64_t readahead = 4ull << 20;  // the kernel's, for INIT
  // Kernel cache lifetimes: digest directories never change; the root and
  // by-name/ change when the source does.
  double immutable_timeout_s = 86400;
  double mutable_timeout_s = 1;
  // Test seam (CKPTFS_TEST_ENTRY_REPLY_DELAY_MS, test_hooks.h): a lookup's
  // worker waits this long after its reply, so that a test can have the
  // kernel FORGET the entry meanwhile. Zero in production.
  std::chrono::milliseconds entry_reply_delay{0};
  // Set once the kernel's INIT has been answered; the BDI read-ahead can only
  // be raised after that (the kernel lowers it to the INIT reply's value).
  std::function<void()> on_init;
  // Drops the kernel's page cache of inode `ino` (notify_inval_inode): a
  // file read through the chunk path that is now resident will be opened
  // with passthrough, and such an open would otherwise pay for dropping it.
  // Called off the request's thread.
  std::function<void(InodeId ino)> drop_page_cache;
  ThreadPool* background = nullptr;  // where drop_page_cache runs
  // Where reads that may wait for a whole file's SHA-256 run and reply
  // (FileServer::MayWaitForAProof), so that they hold no FUSE thread: four
  // such reads of one user held all four threads of a mount for the 10 s
  // of a 2 GiB file's proof, and every other user's requests waited. A
  // share of its threads per uid, so that one user's proofs leave threads
  // for others' too. Null under verify=xxh3.
  FairPool* proving_reads = nullptr;
  // Where the other reads that may read the source run and reply
  // (FileServer::MayReadTheSource: no copy of the file is resident), a
  // share of its threads per uid too: the FUSE threads take requests in
  // the kernel's order, so one user's twelve readers of the chunk path
  // made another user's read of a 512 MiB file wait behind theirs (0.23 s
  // alone, 7.6 s: tests/bench/bench_fair_share.sh). Null: read on the FUSE
  // thread.
  FairPool* source_reads = nullptr;
  // The kernel's bound on the reads (read-ahead) it has in flight to the
  // daemon at once, set at INIT (the kernel's default, 12, queues one
  // user's read-ahead behind another's before the daemon sees it).
  unsigned max_background = 0;  // 0: the kernel's default
  // Access decisions that needed a caller's supplementary groups and could
  // not read them (the caller is outside the daemon's PID namespace: pid 0
  // there, as for a daemon in a container or a pod without hostPID): those
  // grant only what every set of groups would (ckptfs/ownership.h). For
  // status; each cause logged once (a bit each, request_caller.cpp).
  std::atomic<uint64_t> callers_without_groups{0};
  std::atomic<unsigned> groups_causes_logged{0};
  // Lookups in the root and by-name answered ENOENT (a name unknown, or
  // hidden from the caller): the kernel caches none of them. For stats.
  std::atomic<uint64_t> lookups_not_found{0};
};

// How the session talks to /dev/fuse (ConnectionIo, src/fuse/connection_io.h).
struct ConnectionSetup {
  int fd = -1;                        // the connection's /dev/fuse descriptor
  std::vector<uint8_t> adopted_init;  // takeover: the connection's INIT request
  bool shared_device = false;         // a supervisor shares the device (O_NONBLOCK)
  std::vector<UniqueFd> channels;     // its per-thread channels (fuse_channels.h), if any
  std::function<void(const std::vector<uint8_t>&)> on_init_request;  // the first INIT, as sent
};

// The session's custom io and kernel passthrough (after fuse_session_mount,
// or instead of it for an inherited descriptor; before the loop);
// `passthrough_wanted` false with passthrough=off. The session's userdata
// must be `ctx`. Fails only when the custom io cannot be installed.
Status AttachConnection(FsContext& ctx, fuse_session* se, bool passthrough_wanted, ConnectionSetup setup);
// Ends the session loop without taking another request (a hand-over).
void DrainConnection(FsContext& ctx);
// FUSE_NOTIFY_RESEND: requests read by a dead daemon are queued again.
Status ResendRequests(FsContext& ctx);
// The kernel's INIT offered FUSE_HAS_RESEND (protocol 7.40).
bool KernelHasResend(const FsContext& ctx);

// An inode with open files at a hand-over: how many, and the kernel backing
// id its passthrough opens use (0: the chunk path).
struct InheritedInode {
  uint64_t ino = 0;
  uint64_t opens = 0;
  int backing_id = 0;
};
// The draining daemon's side: its inodes with open files; its backing ids
// stay open when it exits.
std::vector<InheritedInode> HandOverOpenInodes(FsContext& ctx);
// The successor's side, before it reads a request: opens of those inodes
// join the mode the kernel holds them in; backing ids left by the
// predecessor and not inherited are closed; then requests are admitted.
void InheritOpenInodes(FsContext& ctx, const std::vector<InheritedInode>& inodes);
// Calls `changed` with every inode whose open count or mode changed, at
// once, on the thread of the open or release, so it must not block; a
// supervisor's reporter reads the record with OpenInodeRecord later and
// hands it to the successor of a daemon that crashed.
void WatchOpenInodes(FsContext& ctx, std::function<void(uint64_t ino)> changed);
// `ino`'s record as it stands: opens 0 when none of its files is open.
InheritedInode OpenInodeRecord(const FsContext& ctx, uint64_t ino);
// "on", "off" or "pending" (before INIT), and why.
std::pair<std::string, std::string> PassthroughState(const FsContext& ctx);

fuse_lowlevel_ops MakeOperations();

}  // namespace ckptfs::fuse
