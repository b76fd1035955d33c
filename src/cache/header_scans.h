// HeaderScans: recognizes a loader that reads the header of every shard
// before it reads any tensor, so that its opens need not wait for copies.
//
// fastsafetensors (nogds) opens each shard with a plain buffered open, reads
// 8 bytes and the JSON header, and closes it, shard after shard; only then
// does it open them again with O_DIRECT and read the tensors with many
// threads. Under fill=wait every one of those header opens would wait for
// its shard's whole copy, so the checkpoint is copied shard by shard before
// a single tensor is read, and the load costs the copy plus the read (1.33x
// native, README "First loads by parallel loaders"). A loader that maps a
// shard for its tensors (safetensors, transformers) holds it open for the
// whole load and gains from waiting: its reads then pass through.
//
// Only safetensors files count (FileServer asks for no other): a loader
// reads config.json and the shard index with short opens too, before it
// maps its shards.
//
// The sign is the close: an opener that closed a file of a checkpoint
// within kShortOpen of its open (after any wait for the copy), with no
// other open of it meanwhile, is scanning headers, and for kWindow after that its first open of each other file of
// the same checkpoint does not wait: the copy is begun and its reads are
// served from it as its chunks are verified, the header's chunk first.
// The first such open is a trial: until it too is closed within kShortOpen
// no other open of the opener goes without waiting. A loader that opens a
// shard, maps it and closes it at once (candle, safe_open with numpy: a
// passthrough map holds no open) looks like a header read at its first
// shard; its second shard, opened on trial, is mapped through the chunk
// path, whose map holds the open, so no close confirms the scan and every
// later shard waits and passes through. It loses passthrough for one shard,
// not for all.
// transformers (safetensors' safe_open, then torch) opens a shard twice,
// maps it each time and closes both at once; a passthrough map holds no
// open (the kernel maps the backing file), so the closes come while the
// load is still reading the map. Two opens of one file that overlap are no
// sign (the FUSE layer tells, see FileServer::Closed), or every shard
// after the first would be loaded through the chunk path. A
// second open of a file it has opened in the window waits as before (a
// loader that reads the metadata of every shard first and then maps them
// gets passthrough for the maps). The first shard's header open still
// waits: nothing has shown yet what its opener is.
//
// An opener is the requesting thread's id as FUSE gives it, in the daemon's
// pid namespace; one the daemon cannot see there (0: a daemon in a pod of
// its own, an engine in another) is never taken for a scan, so its opens
// wait as before.
//
// Only how long an open waits depends on this, never which bytes are
// served. The table is bounded (kMaxOpeners, kMaxFilesPerOpener): an opener
// pushed out of it waits again, as without it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "ckptfs/mutex.h"

namespace ckptfs {

class HeaderScans {
 public:
  using Clock = std::chrono::steady_clock;
  // A header read and a close take microseconds; a load, seconds.
  static constexpr Clock::duration kShortOpen = std::chrono::milliseconds(200);
  // A loader scans all its shards' headers in well under a second.
  static constexpr Clock::duration kWindow = std::chrono::seconds(10);
  static constexpr size_t kMaxOpeners = 128;
  static constexpr size_t kMaxFilesPerOpener = 512;  // with kMaxOpeners: at most about 3 MB

  // An open of `file` (an inode) of `checkpoint` (its sha256-<hex>) by
  // `opener` (the requesting thread's id, as FUSE gives it) at `now`: true
  // when it belongs to a header scan and need not wait for its copy.
  bool OpenIsScan(pid_t opener, const std::string& checkpoint, uint64_t file, Clock::time_point now)
      EXCLUDES(mu_);
  // That open was closed at `now`, `held` after it was answered.
  void Closed(pid_t opener, const std::string& checkpoint, uint64_t file, Clock::duration held,
              Clock::time_point now) EXCLUDES(mu_);

  // Opens OpenIsScan let go without waiting.
  uint64_t scan_opens() const EXCLUDES(mu_);

 private:
  struct Opener {
    std::string checkpoint;          // the checkpoint of its last short open
    Clock::time_point short_close{};  // when it was closed
    std::set<uint64_t> opened;        // files of `checkpoint` it has opened (their next open waits)
    std::optional<uint64_t> trial;    // the file of the open on trial, while unconfirmed
    bool confirmed = false;           // the trial's open was closed short too
    std::list<pid_t>::iterator lru;
  };
  Opener* Find(pid_t opener) REQUIRES(mu_);

  mutable Mutex mu_;
  std::unordered_map<pid_t, Opener> openers_ GUARDED_BY(mu_);
  std::list<pid_t> lru_ GUARDED_BY(mu_);  // most recent first
  uint64_t scan_opens_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckptfs
