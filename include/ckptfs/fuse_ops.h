// The FUSE low-level operations over a View. File reads are served from the
// ChunkCache: a chunk is filled by the SourceReader, which checks the file's
// stamp and the chunk's XXH3-128 before it is published, so a byte that does
// not belong to a name is never served under it.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <functional>

#include "ckptfs/chunk_cache.h"
#include "ckptfs/refused_files.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/view.h"

namespace ckptfs::daemon {

class HeaderStamper;

struct FsContext {
  View* view = nullptr;
  ChunkCache* cache = nullptr;
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
  // A fill found the source changed: rescan.
  std::function<void()> on_source_changed;
  // A fill found a chunk that does not match the index: withdraw the digest.
  std::function<void(const View::Node& file, const Status& why)> on_corrupt_chunk;
  // Set once the kernel's INIT has been answered; the BDI read-ahead can only
  // be raised after that (the kernel lowers it to the INIT reply's value).
  std::function<void()> on_init;
  RefusedFiles refused;  // files found changed or damaged: fail fast
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> failed_reads{0};
};

// The verified chunk `index` of `file`, from the cache or filled from the
// source; failures are reported to the context's callbacks.
Result<ChunkCache::Ref> FetchChunk(FsContext& ctx, const View::NodePtr& file, uint64_t index, bool readahead);

// Called with every failed fill of `file`: the first failure of a file is
// logged and reported (a damaged chunk withdraws the digest, a changed source
// asks for a rescan), later ones only counted, and the file is refused from
// then on (see RefusedFiles).
void ReportSourceFailure(FsContext& ctx, const View::Node& file, const Status& s);

fuse_lowlevel_ops MakeOperations();

}  // namespace ckptfs::daemon
