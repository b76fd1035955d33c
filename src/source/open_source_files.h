// OpenSourceFiles: the source files being read, kept open between chunks,
// bounded like LevelDB's table cache. Without it every 4 MiB chunk would
// open its file for reading and close it again, and the kernel would start
// the file's read-ahead afresh each time; the path is still walked for each
// read (see below), with O_PATH.
//
// An entry is keyed by the path and the stamp it was opened under, and is
// only ever a descriptor of a file that had that stamp when opened through
// OpenSourceFile (inside SRC, no symlink on the way). Before each read from
// a kept file, its path is walked again the same way (O_PATH, nothing
// opened for reading: CheckSourcePath) and must lead to the same inode, so
// a directory on it moved out of SRC ends the keeping as a fresh open would
// fail. Whether the file still holds those bytes is the reader's check after
// each read: a file changed, removed or renamed over changes its ctime (the
// last through its link count), so the fstat after the read sees it, and
// the reader then forgets the entry and opens the path again, as a first
// read would.
//
// A source on a filesystem whose changes this kernel may not see at once
// (NFS and other network or FUSE filesystems: close-to-open consistency, an
// fstat answered from cached attributes) keeps nothing open: the daemon
// asks for capacity 0 there, and each read opens its file afresh.
//
// Bounds: at most `capacity` files (the least recently used is closed), and
// a file not read for `idle` is closed by a thread of its own, so that a
// deleted file's blocks, a busy unmount of SRC or an NFS silly-rename are
// not held for longer than that by a file nobody reads.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "ckptfs/file_stamp.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

// One open source file. `fd` is buffered; `Direct()` is a second
// descriptor of the same file with O_DIRECT, opened at its first use, so
// that direct and buffered readers never change each other's flags.
class KeptSourceFile {
 public:
  KeptSourceFile(UniqueFd fd, const struct stat& st) : fd_(std::move(fd)), st_(st) {}
  int fd() const { return fd_.get(); }
  const struct stat& st() const { return st_; }  // when it was opened
  // The O_DIRECT descriptor, or -1 where the file cannot be read so (a
  // filesystem that refuses O_DIRECT, no /proc to reopen it through): then
  // buffered reads serve.
  int Direct() EXCLUDES(mu_);

 private:
  const UniqueFd fd_;
  const struct stat st_;
  Mutex mu_;
  bool direct_tried_ GUARDED_BY(mu_) = false;
  UniqueFd direct_ GUARDED_BY(mu_);
};

class OpenSourceFiles {
 public:
  using Handle = std::shared_ptr<KeptSourceFile>;

  OpenSourceFiles(std::string root, size_t capacity, std::chrono::milliseconds idle);
  ~OpenSourceFiles();
  OpenSourceFiles(const OpenSourceFiles&) = delete;
  OpenSourceFiles& operator=(const OpenSourceFiles&) = delete;

  // The open file at `path` with `stamp`: one kept open (`*held` true), or
  // opened now through OpenSourceFile and kept (`*held` false). kChanged
  // when the path names a file with another stamp now, or none.
  Result<Handle> Get(const std::string& path, const FileStamp& stamp, bool* held) EXCLUDES(mu_);
  // Closes it (a reader still using it keeps its descriptor until done).
  void Forget(const std::string& path, const FileStamp& stamp) EXCLUDES(mu_);

  size_t open_files() const EXCLUDES(mu_);
  uint64_t opens() const { return opens_.load(); }  // by path, since the start

 private:
  struct Key {
    std::string path;
    FileStamp stamp;
    bool operator<(const Key& o) const;
  };
  struct Entry {
    Handle file;
    std::chrono::steady_clock::time_point used;
    std::list<Key>::iterator lru;  // its place in lru_, most recent first
  };
  // Takes the entry out; its file is closed when the caller lets go of it,
  // which it does after unlocking.
  Handle Erase(std::map<Key, Entry>::iterator it) REQUIRES(mu_);
  void CloseIdle() EXCLUDES(mu_);

  const std::string root_;
  const size_t capacity_;
  const std::chrono::milliseconds idle_;
  mutable Mutex mu_;
  CondVar wake_;
  std::map<Key, Entry> files_ GUARDED_BY(mu_);
  std::list<Key> lru_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> opens_{0};
  std::thread closer_;  // started with the first file kept
};

}  // namespace ckptfs
