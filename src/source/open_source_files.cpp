#include "open_source_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <tuple>
#include <vector>

#include "retry_eintr.h"
#include "source_file.h"

namespace ckptfs {

bool OpenSourceFiles::Key::operator<(const Key& o) const {
  return std::tie(path, stamp.dev, stamp.ino, stamp.size, stamp.mtime_ns, stamp.ctime_ns) <
         std::tie(o.path, o.stamp.dev, o.stamp.ino, o.stamp.size, o.stamp.mtime_ns, o.stamp.ctime_ns);
}

// Reopened through /proc/self/fd, which names this very file whatever has
// happened to its path since: no second walk of SRC to race with.
int KeptSourceFile::Direct() {
  MutexLock lock(mu_);
  if (direct_tried_) return direct_.get();
  direct_tried_ = true;
  UniqueFd direct = ReopenDirect(fd_.get(), st_);
  if (!direct.valid()) {
    // Out of descriptors or memory passes: try again at the next read. No
    // /proc, or O_DIRECT refused (EINVAL), does not: read buffered.
    if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) direct_tried_ = false;
    return -1;
  }
  direct_ = std::move(direct);
  return direct_.get();
}

OpenSourceFiles::OpenSourceFiles(std::string root, size_t capacity, std::chrono::milliseconds idle)
    : root_(std::move(root)), capacity_(capacity), idle_(idle) {}

OpenSourceFiles::~OpenSourceFiles() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.NotifyAll();
  if (closer_.joinable()) closer_.join();
}

Result<OpenSourceFiles::Handle> OpenSourceFiles::Get(const std::string& path, const FileStamp& stamp, bool* held) {
  Key key{path, stamp};
  Handle kept;
  {
    MutexLock lock(mu_);
    if (auto it = files_.find(key); it != files_.end()) {
      it->second.used = std::chrono::steady_clock::now();
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      kept = it->second.file;
    }
  }
  // The path must still lead to the kept file, as it did when it was
  // opened: a directory on it moved (out of SRC, say) changes nothing the
  // descriptor shows. Checked at every read, as a fresh open would be. A
  // check that could not be made (out of descriptors) fails this read and
  // keeps the file: nothing says it changed.
  if (kept) {
    const Status on_path = CheckSourcePath(root_, path, kept->st());
    if (on_path.ok()) {
      *held = true;
      return kept;
    }
    if (on_path.code() != Status::Code::kChanged) return on_path;
    Forget(path, stamp);
  }
  *held = false;
  auto opened = OpenSourceFile(root_, path);  // outside the lock: opens of other files go on
  if (!opened.ok()) return opened.status();
  ++opens_;
  if (FileStamp::FromStat(opened->st) != stamp) return Status::Changed(path + ": source changed since it was indexed");
  auto file = std::make_shared<KeptSourceFile>(std::move(opened->fd), opened->st);
  if (capacity_ == 0) return file;
  std::vector<Handle> closing;  // closed outside the lock (a close can take a while on NFS)
  MutexLock lock(mu_);
  if (stopping_) return file;
  if (auto it = files_.find(key); it != files_.end()) return it->second.file;  // another reader's open won
  lru_.push_front(key);
  files_.emplace(std::move(key), Entry{file, std::chrono::steady_clock::now(), lru_.begin()});
  while (files_.size() > capacity_) closing.push_back(Erase(files_.find(lru_.back())));
  if (!closer_.joinable()) closer_ = std::thread([this] { CloseIdle(); });
  return file;
}

void OpenSourceFiles::Forget(const std::string& path, const FileStamp& stamp) {
  Handle closing;  // closed outside the lock
  MutexLock lock(mu_);
  if (auto it = files_.find(Key{path, stamp}); it != files_.end()) closing = Erase(it);
}

OpenSourceFiles::Handle OpenSourceFiles::Erase(std::map<Key, Entry>::iterator it) {
  Handle file = std::move(it->second.file);
  lru_.erase(it->second.lru);
  files_.erase(it);
  return file;
}

size_t OpenSourceFiles::open_files() const {
  MutexLock lock(mu_);
  return files_.size();
}

void OpenSourceFiles::CloseIdle() {
  const auto tick = std::max(std::chrono::milliseconds(10), idle_ / 4);
  for (;;) {
    std::vector<Handle> closing;  // closed outside the lock (a close can take a while on NFS)
    MutexLock lock(mu_);
    if (!stopping_) (void)wake_.WaitFor(mu_, tick);
    if (stopping_) return;
    const auto now = std::chrono::steady_clock::now();
    while (!lru_.empty()) {
      auto it = files_.find(lru_.back());
      if (now - it->second.used < idle_) break;
      closing.push_back(Erase(it));
    }
  }
}

}  // namespace ckptfs
