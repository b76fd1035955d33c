// FileFiller: makes a file resident in the host tier (FileCache). The copy
// is read from the source chunk by chunk through the SourceReader, so every
// 4 MiB chunk is checked against the index (the file's stamp before and
// after the read, the chunk's XXH3-128) exactly as on the chunk path, with
// several chunks in flight. With stamp_headers a safetensors file is copied
// in its stamped form (the stamped header, then the source's bytes after the
// original header), so a passthrough reader sees what the chunk path serves.
// Only when every chunk passed is the memfd sealed and published; a chunk
// that fails (the source changed, does not match, or cannot be read)
// abandons the fill, and nothing of it is ever served.
//
// Background fills (fill=open) run one file at a time on a thread of their
// own, so an engine's open is answered at once by the chunk path while its
// file is copied for the next open.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "ckptfs/file_cache.h"
#include "ckptfs/fuse_ops.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/thread_pool.h"

namespace ckptfs::daemon {

struct StampedFile;

// How a file is served: its host-tier key, its size as served, and (with
// stamp_headers) the stamped header that replaces the source's.
struct ServedForm {
  FileKey key;
  uint64_t size = 0;
  std::shared_ptr<const std::string> prefix;  // stamped header; null when served as in the source
  uint64_t source_prefix_len = 0;             // the source header it replaces
};
// Fails only when a stamped header could not be read.
Result<ServedForm> ServedFormOf(FsContext& ctx, const View::NodePtr& file);

class FileFiller {
 public:
  // `depth`: chunk reads in flight per fill; `io`: how the source is read.
  FileFiller(FsContext& ctx, unsigned depth, SourceReader::Io io = SourceReader::Io::kBuffered);
  ~FileFiller();
  FileFiller(const FileFiller&) = delete;
  FileFiller& operator=(const FileFiller&) = delete;

  // The resident copy of `file`, filled now if needed (waiting for a fill of
  // it already in flight). `progress(bytes)` is called on this thread about
  // five times a second; returning false cancels the fill.
  Result<FileCache::CopyPtr> Fill(const View::NodePtr& file, bool pin,
                                  const std::function<bool(uint64_t)>& progress = nullptr);

  // Queues a background fill of `file` (no-op if one is queued or running).
  void Enqueue(const View::NodePtr& file, const FileKey& key);
  // Queues background fills of the weight files beside `file` (same source
  // directory, same suffix: the other shards), in name order, as long as
  // they fit in the tier's free room. An engine that opens one shard opens
  // the others next; their copies then fill while it loads this one. Only
  // free room is used, so this never evicts what is resident. The siblings
  // are looked for on the background thread, not on the caller's (an open).
  void EnqueueSiblings(const View::NodePtr& file);
  // Stops the background thread; fills in flight give up at their next chunk.
  void Stop();

  uint64_t fills_skipped() const { return skipped_.load(); }
  uint64_t fills_failed() const { return failed_.load(); }
  unsigned depth() const { return reads_.size(); }
  SourceReader::Io io() const { return io_; }

 private:
  Status CopyChunks(const View::NodePtr& file, const ServedForm& form, SealedCopy& copy,
                    const std::function<bool(uint64_t)>& progress);
  Status CopyChunk(const View::NodePtr& file, const ServedForm& form, uint64_t chunk, uint8_t* buf, SealedCopy& copy);
  void Report(const View::NodePtr& file, const Status& s);
  void QueueSiblingsOf(const View::NodePtr& file);
  void RunQueue();

  FsContext& ctx_;
  const SourceReader::Io io_;
  ThreadPool reads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<View::NodePtr, FileKey>> queue_;
  std::set<FileKey> queued_;
  std::deque<View::NodePtr> sibling_requests_;  // files whose siblings are to be queued
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> skipped_{0}, failed_{0};
  std::thread worker_;
};

}  // namespace ckptfs::daemon
