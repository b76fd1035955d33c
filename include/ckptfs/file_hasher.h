// FileHasher: reads a file once, front to back, in chunk-sized preads, and
// computes in that single pass its SHA-256 and its chunk table. The SHA-256 is
// inherently sequential and runs on the calling thread; each chunk's XXH3-128
// is handed to a helper pool and runs beside it on the same buffer.
//
// The result is trusted only if the file did not change while it was read:
// the stamp must equal the one the caller expects before and after, and the
// file must hold exactly stamp.size bytes. Otherwise Hash() returns a
// Status with code kChanged, and the caller should re-stat and retry.
#pragma once

#include <atomic>
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <string>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/status.h"
#include "ckptfs/thread_pool.h"

namespace ckptfs {

class FileHasher {
 public:
  // Called with the bytes just read; used for progress.
  using BytesCallback = std::function<void(uint64_t)>;
  // Test seam: called after chunk `index` of `path` was read and before it is
  // hashed, so a test can change the file at a known moment.
  using ChunkReadHook = std::function<void(const std::string& path, uint64_t index)>;

  // `chunk_pool` runs the chunk hashes; it may be shared by many hashers.
  explicit FileHasher(ThreadPool* chunk_pool) : chunk_pool_(chunk_pool) {}

  void set_progress(BytesCallback cb) { progress_ = std::move(cb); }
  // The canonical source root the hashed paths lie in (see OpenSourceFile).
  void set_source_root(std::string root) { root_ = std::move(root); }
  void set_chunk_read_hook(ChunkReadHook hook) { hook_ = std::move(hook); }
  // When *cancel turns true, Hash gives up at its next chunk.
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  // `observed`, if given, receives the stat of the opened file, so that a
  // caller retrying after kChanged learns what the path now is without
  // looking it up again.
  Result<FileHashes> Hash(const std::string& path, const FileStamp& expected, struct stat* observed = nullptr) const;

  // Files opened for reading by every FileHasher in this process, so tests can
  // prove that a run served from the index read nothing.
  static uint64_t files_opened() { return files_opened_.load(); }

 private:
  ThreadPool* chunk_pool_;
  std::string root_;
  BytesCallback progress_;
  ChunkReadHook hook_;
  const std::atomic<bool>* cancel_ = nullptr;
  static std::atomic<uint64_t> files_opened_;
};

}  // namespace ckptfs
