// The FUSE low-level operations over a View. An open of a file that is
// resident in the host tier (FileCache: a verified, sealed memfd) is answered
// with kernel passthrough to that memfd, so reads and mmap never reach the
// daemon; any other open is served by the verified chunk path: reads from the
// ChunkCache, whose chunks the SourceReader fills only after checking the
// file's stamp and the chunk's XXH3-128. Either way a byte that does not
// belong to a name is never served under it.
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

#include "ckptfs/chunk_cache.h"
#include "ckptfs/mutex.h"
#include "ckptfs/refused_files.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/host_tier_fill.h"
#include "ckptfs/open_modes.h"
#include "ckptfs/proven_chunk_tables.h"
#include "ckptfs/serving_policy.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/view.h"

namespace ckptfs::daemon {

class HeaderStamper;
class FileFiller;
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
  ChunkCache* cache = nullptr;  // the chunk path
  FileCache* files = nullptr;   // the host tier of whole files
  FileFiller* filler = nullptr;
  const HostTierFill* index_fill = nullptr;  // fill_on_index, for stats
  FillPolicy fill = kDefaultFillPolicy;
  Verify verify = Verify::kXxh3;
  ProvenChunkTables* proven = nullptr;  // set with verify=sha256
  std::shared_ptr<KernelPassthrough> passthrough;  // set by AttachConnection
  std::shared_ptr<ConnectionIo> connection;        // set by AttachConnection
  // Open files and directories by the number the kernel holds (fh), so that
  // a daemon that took the connection over can serve handles it never gave.
  std::shared_ptr<OpenHandles> handles = MakeOpenHandles();
  OpenModes open_modes;
  OpenCounts opens;
  SourceReader* reader = nullptr;
  ThreadPool* readahead_pool = nullptr;
  HeaderStamper* stamper = nullptr;  // set with stamp_headers
  // Chunks filled ahead of a sequential reader.
  unsigned readahead_chunks = 4;
  // Read-ahead chunks in flight for all readers together, at most: what is
  // read ahead must still be in the cache when the reader gets there, so the
  // daemon bounds it by the host tier's size (a quarter of it).
  uint64_t readahead_budget_chunks = 16;
  std::atomic<uint64_t> readahead_in_flight{0};
  // Chunks the host tier holds, and files open now: each reader's window
  // shrinks so that every reader's current chunk and its read-ahead fit in
  // the cache together (read ahead that is evicted before use is pure waste).
  uint64_t cache_chunks = 64;
  std::atomic<uint64_t> open_files{0};
  uint64_t readahead = 4ull << 20;  // the kernel's, for INIT
  // Kernel cache lifetimes: digest directories never change; the root and
  // by-name/ change when the source does.
  double immutable_timeout_s = 86400;
  double mutable_timeout_s = 1;
  // Test seam (CKPTFS_TEST_ENTRY_REPLY_DELAY_MS, test_hooks.h): a lookup's
  // worker waits this long after its reply, so that a test can have the
  // kernel FORGET the entry meanwhile. Zero in production.
  std::chrono::milliseconds entry_reply_delay{0};
  // A fill found the source changed: rescan.
  std::function<void()> on_source_changed;
  // A read found a copy's chunk that does not match the index although its
  // stamp does: hash that copy again, and withdraw the digest when no other
  // copy served the read (`withdraw`).
  std::function<void(const View::Node& file, const SourceCopy& copy, const Status& why, bool withdraw)>
      on_corrupt_chunk;
  // Set once the kernel's INIT has been answered; the BDI read-ahead can only
  // be raised after that (the kernel lowers it to the INIT reply's value).
  std::function<void()> on_init;
  RefusedFiles refused;  // files found changed or damaged: fail fast
  // Drops the kernel's page cache of inode `ino` (notify_inval_inode): a
  // file read through the chunk path that is now resident will be opened
  // with passthrough, and such an open would otherwise pay for dropping it.
  std::function<void(InodeId ino)> drop_page_cache;
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> failed_reads{0};
};

// The verified chunk `index` of `file`, from the cache or filled from the
// source; failures are reported to the context's callbacks.
Result<ChunkCache::Ref> FetchChunk(FsContext& ctx, const View::NodePtr& file, uint64_t index, bool readahead);

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

// Called with every failed read of `copy` of `file`: the first failure of a
// copy is logged and reported (a damaged chunk has the copy hashed again and,
// unless `served_by_another` copy, withdraws the digest; a changed source
// asks for a rescan), later ones only counted, and the copy is refused from
// then on (see RefusedFiles).
void ReportSourceFailure(FsContext& ctx, const View::Node& file, const SourceCopy& copy, const Status& s,
                         bool served_by_another);
// Every copy of `file` was refused: nothing of it can be read from the source.
bool AllCopiesRefused(const FsContext& ctx, const View::Node& file);
// Chunk `index` of `file` (`len` bytes) into `dst`, from the first of its
// source copies (most trusted first, see View::Node::copies) that is not
// refused and passes every check: the stamp and the chunk's XXH3-128
// (SourceReader::ReadChunk), and the chunk's SHA-256 when `chunk_sha256` is
// given. A copy that fails is reported and the next one tried, so that one
// changed or damaged copy costs no reader an EIO while another still holds
// the bytes. The error is the last copy's.
Status ReadSourceChunk(FsContext& ctx, const View::Node& file, uint64_t index, uint8_t* dst, size_t len,
                       SourceReader::Io io = SourceReader::Io::kBuffered, const Sha256Digest* chunk_sha256 = nullptr);
// The same, checked as the mount's verify= asks: under verify=sha256 each
// chunk against the file's proven chunk table (ProvenChunkTables), proven
// first by a pass over the whole file when there is none yet, except for
// `readahead` (which then fails with kNotFound rather than start one).
Status ReadVerifiedChunk(FsContext& ctx, const View::NodePtr& file, uint64_t index, uint8_t* dst, size_t len,
                         bool readahead = false);

fuse_lowlevel_ops MakeOperations();

}  // namespace ckptfs::daemon
