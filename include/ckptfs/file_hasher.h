// FileHasher: reads a file once, front to back, and computes in that single
// pass its SHA-256 and its chunk table (XXH3-128 of every 4 MiB chunk), and
// fills the file's host-tier copy from the same bytes when given one.
//
// A pipeline, so that one large file costs about the longest of reading it,
// copying it and SHA-256'ing it, not their sum: SHA-256 is serial and runs in
// file order on the thread that advances the task, while up to kReadAhead
// chunks are read ahead of it on an I/O pool, each followed on the thread
// that read it by its XXH3 and by its write into the copy (when it was not
// read straight into the copy). A file of one chunk is read, hashed and
// copied inline: for small files a hand-off would cost more than the work.
//
// Cold chunks: a chunk not in the page cache (cachestat) is read with
// O_DIRECT, straight from the disk into the copy or the buffer it is hashed
// in, so that an arriving checkpoint is read from the disk once without
// taking page cache (fresh memory, and room others use) for bytes that are
// about to be held in the copy anyway. A cached chunk is read from the page
// cache; a filesystem that refuses O_DIRECT is read buffered.
//
// Holes: where the filesystem says where a file's data lies (SEEK_DATA,
// SEEK_HOLE), a chunk wholly inside a hole is not read. Its bytes are zeros:
// SHA-256 is fed them from a shared zero buffer (still SHA-256 of every byte,
// as sha256sum computes it; a hole costs SHA-256's CPU time, not the disk's),
// its XXH3 is known, and a copy needs nothing written (a memfd reads zeros).
//
// Resumable: FileHashTask::Run returns between two chunks when its caller
// asks it to yield, so that a scheduler can share workers fairly between a
// 15 TB file and everything else; a paused task holds no descriptor and no
// buffer (it opens the file again, checking its stamp, when resumed).
//
// The result is trusted only if the file did not change while it was read:
// the stamp must equal the one the caller expects before and after, and the
// file must hold exactly stamp.size bytes. Otherwise the result is a Status
// with code kChanged, and the caller should re-stat and retry.
#pragma once

#include <sys/stat.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hash_copy.h"
#include "ckptfs/hashes.h"
#include "ckptfs/status.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

class FileHashTask;

class FileHasher {
 public:
  // Called with the bytes just hashed; used for progress.
  using BytesCallback = std::function<void(uint64_t)>;
  // Test seam: called after chunk `index` of `path` was read and before
  // SHA-256 takes it, so a test can change the file at a known moment (the
  // chunks after it may have been read already).
  using ChunkReadHook = std::function<void(const std::string& path, uint64_t index)>;

  // Chunks read ahead of SHA-256 per file (each a 4 MiB buffer, unless read
  // straight into a copy).
  static constexpr unsigned kReadAhead = 4;

  // `io_pool` reads ahead and runs the chunk hashes; it may be shared by many
  // hashers. Null: everything runs on the caller's thread.
  explicit FileHasher(ThreadPool* io_pool) : io_pool_(io_pool) {}

  void set_progress(BytesCallback cb) { progress_ = std::move(cb); }
  // The canonical source root the hashed paths lie in (see OpenSourceFile);
  // opened once here, for every file this hasher opens.
  void set_source_root(std::string root) { set_source_root(root, OpenSourceRoot(root)); }
  // The same with `root` opened already (OpenSourceRoot), so that many
  // hashers of one root hold one descriptor: a queued indexing job holds
  // its hasher, and a writer of SRC can queue thousands of jobs.
  void set_source_root(std::string root, std::shared_ptr<UniqueFd> root_fd);
  // An O_PATH descriptor of `root`; null for "/" or "", or when it cannot
  // be opened now (then every file's open tries again and says why).
  static std::shared_ptr<UniqueFd> OpenSourceRoot(const std::string& root);
  void set_chunk_read_hook(ChunkReadHook hook) { hook_ = std::move(hook); }
  // When *cancel turns true, hashing gives up at its next chunk.
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  struct TaskOptions {
    std::unique_ptr<HashCopy> copy;            // filled from the hashed bytes
    std::atomic<uint64_t>* hashed = nullptr;   // counts the bytes hashed (for status)
    std::function<bool()> cancelled;           // a second reason to give up, asked at every chunk
  };
  // A task hashing `path`, expected to be `expected`; nothing is opened
  // until it runs. The hasher must outlive it.
  std::unique_ptr<FileHashTask> Start(const std::string& path, const FileStamp& expected,
                                      TaskOptions extra) const;

  // Runs a task to the end. `observed`, if given, receives the stat of the
  // opened file, so that a caller retrying after kChanged learns what the
  // path now is without looking it up again.
  Result<FileHashes> Hash(const std::string& path, const FileStamp& expected,
                          struct stat* observed = nullptr) const;

  // Files opened for reading by every FileHasher in this process, so tests can
  // prove that a run served from the index read nothing.
  static uint64_t files_opened() { return files_opened_.load(); }
  // Bytes every FileHasher in this process read with O_DIRECT.
  static uint64_t direct_bytes_read() { return direct_bytes_read_.load(); }

 private:
  friend class FileHashTask;
  bool Cancelled() const { return cancel_ != nullptr && cancel_->load(); }

  ThreadPool* io_pool_;
  std::string root_;
  std::shared_ptr<UniqueFd> root_fd_;  // O_PATH descriptor of root_, when it could be opened
  BytesCallback progress_;
  ChunkReadHook hook_;
  const std::atomic<bool>* cancel_ = nullptr;
  static std::atomic<uint64_t> files_opened_;
  static std::atomic<uint64_t> direct_bytes_read_;
};

class FileHashTask {
 public:
  ~FileHashTask();  // waits for the reads in flight
  FileHashTask(const FileHashTask&) = delete;
  FileHashTask& operator=(const FileHashTask&) = delete;

  // Hashes chunks in order until the file is done (true), or until `yield`,
  // asked between two chunks, answers true (false: call Run again later; the
  // task has let go of its descriptor and buffers meanwhile).
  bool Run(const std::function<bool()>& yield = nullptr);
  // After Run returned true: the hashes (the copy published), or why not.
  Result<FileHashes> TakeResult();
  // The stat of the file as last opened (st_ino 0 if it never was).
  const struct stat& observed() const { return observed_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return expected_.size; }

 private:
  friend class FileHasher;
  struct FreeBuffer {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  // One chunk being read (or known to be a hole) ahead of SHA-256.
  struct Slot {
    uint64_t chunk = 0;
    bool hole = false;
    uint8_t* data = nullptr;  // where its bytes are: a buffer, the copy, or the zero buffer
    std::unique_ptr<uint8_t, FreeBuffer> buffer;  // aligned for O_DIRECT
    std::future<void> read;
    int64_t got = 0;      // bytes read, or -errno
    bool probed = false;  // the read asked for a byte past the end (a file that grew shows)
  };

  FileHashTask(const FileHasher& hasher, std::string path, FileStamp expected, FileHasher::TaskOptions extra);
  bool Cancelled() const { return hasher_.Cancelled() || (cancelled_ && cancelled_()); }
  Status Open();
  void Release();  // waits for reads, drops buffers and the descriptor
  bool ChunkIsHole(uint64_t begin, uint64_t end);
  void Submit(uint64_t chunk);
  void Read(Slot& slot);
  Status Consume(uint64_t chunk);
  Status Finish();
  uint64_t ChunkLen(uint64_t chunk) const;

  const FileHasher& hasher_;
  const std::string path_;
  const FileStamp expected_;
  std::unique_ptr<HashCopy> copy_;
  std::atomic<uint64_t>* hashed_;
  std::function<bool()> cancelled_;
  const uint64_t chunks_;
  const bool pipelined_;  // more than one chunk and an I/O pool
  UniqueFd fd_;
  UniqueFd direct_fd_;  // the same file opened O_DIRECT, for cold chunks (pipelined tasks only)
  std::atomic<bool> direct_refused_{false};
  std::atomic<bool> copy_failed_{false};  // a write into the copy failed: it is not published
  struct stat observed_ {};
  bool opened_once_ = false;
  // What SEEK_DATA/SEEK_HOLE said: [region_, hole_end_) is a hole,
  // [hole_end_, data_end_) data; asked again past data_end_.
  bool holes_known_ = true;
  uint64_t region_ = 0, hole_end_ = 0, data_end_ = 0;
  bool region_valid_ = false;
  bool growth_checked_ = false;  // the last read asked for a byte past the end
  std::array<Slot, FileHasher::kReadAhead> slots_;
  uint64_t next_read_ = 0;  // next chunk to submit
  uint64_t next_hash_ = 0;  // next chunk SHA-256 takes
  Sha256 sha_;
  FileHashes out_;
  Status failure_;
  bool done_ = false;
};

}  // namespace ckptfs
