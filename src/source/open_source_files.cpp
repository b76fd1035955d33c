#include "open_source_files.h"

#include <fcntl.h>

#include <cerrno>

namespace ckptfs {

Result<OpenSourceFiles::FilePtr> OpenSourceFiles::Open(const std::string& path, const FileStamp& stamp,
                                                      bool direct) {
  const Key key{path, direct};
  {
    MutexLock lock(mu_);
    auto it = open_.find(key);
    if (it != open_.end() && it->second.stamp == stamp) {
      lru_.splice(lru_.begin(), lru_, it->second.in_lru);
      return it->second.file;
    }
  }
  // Opened with no lock held: two readers of a file not kept may both open
  // it, and the second to finish is kept.
  auto opened = OpenSourceFile(root_, path);
  if (!opened.ok()) return opened.status();
  auto file = std::make_shared<File>();
  file->fd = std::move(opened->fd);
  file->st = opened->st;
  if (direct) {
    const int flags = ::fcntl(file->fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(file->fd.get(), F_SETFL, flags | O_DIRECT) != 0) {
      return Status::FromErrno("cannot read " + path + " with O_DIRECT", errno);
    }
  }
  MutexLock lock(mu_);
  auto it = open_.find(key);
  if (it != open_.end()) {
    lru_.erase(it->second.in_lru);
    open_.erase(it);
  }
  lru_.push_front(key);
  open_.emplace(key, Entry{file, stamp, lru_.begin()});
  while (open_.size() > capacity_) {
    open_.erase(lru_.back());  // a reader still holding it keeps it open until done
    lru_.pop_back();
  }
  return FilePtr(file);
}

void OpenSourceFiles::Forget(const std::string& path) {
  MutexLock lock(mu_);
  for (bool direct : {false, true}) {
    auto it = open_.find(Key{path, direct});
    if (it == open_.end()) continue;
    lru_.erase(it->second.in_lru);
    open_.erase(it);
  }
}

size_t OpenSourceFiles::size() const {
  MutexLock lock(mu_);
  return open_.size();
}

}  // namespace ckptfs
