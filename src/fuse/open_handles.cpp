#include "open_handles.h"

#include <sys/random.h>

#include <chrono>

#include "ckptfs/fuse_ops.h"
#include "ckptfs/mutex.h"

namespace ckptfs::fuse {

namespace {

// A random base with the low 32 bits free for this process's count.
uint64_t RandomBase() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != sizeof r) {
    r = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  }
  return (r & ~0xFFFFFFFFull) | 1;  // never 0: libfuse's "no handle"
}

}  // namespace

std::shared_ptr<OpenHandles> MakeOpenHandles() { return std::make_shared<OpenHandles>(); }

OpenHandles::OpenHandles() : next_(RandomBase()) {}

uint64_t OpenHandles::AddFile(std::shared_ptr<OpenFile> file) {
  const uint64_t fh = next_++;
  WriterLock lock(mu_);
  files_[fh] = std::move(file);
  return fh;
}

bool OpenHandles::AdoptFile(uint64_t fh, std::shared_ptr<OpenFile>& file) {
  WriterLock lock(mu_);
  auto [it, inserted] = files_.emplace(fh, file);
  if (!inserted) file = it->second;
  return inserted;
}

std::shared_ptr<OpenFile> OpenHandles::File(uint64_t fh) const {
  ReaderLock lock(mu_);
  auto it = files_.find(fh);
  return it == files_.end() ? nullptr : it->second;
}

std::shared_ptr<OpenFile> OpenHandles::TakeFile(uint64_t fh) {
  WriterLock lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end()) return nullptr;
  auto f = std::move(it->second);
  files_.erase(it);
  return f;
}

uint64_t OpenHandles::AddDir(std::shared_ptr<DirHandle> dir) {
  const uint64_t fh = next_++;
  WriterLock lock(mu_);
  dirs_[fh] = std::move(dir);
  return fh;
}

void OpenHandles::AdoptDir(uint64_t fh, std::shared_ptr<DirHandle> dir) {
  WriterLock lock(mu_);
  dirs_.emplace(fh, std::move(dir));
}

std::shared_ptr<DirHandle> OpenHandles::Dir(uint64_t fh) const {
  ReaderLock lock(mu_);
  auto it = dirs_.find(fh);
  return it == dirs_.end() ? nullptr : it->second;
}

void OpenHandles::RemoveDir(uint64_t fh) {
  WriterLock lock(mu_);
  dirs_.erase(fh);
}

}  // namespace ckptfs::fuse
