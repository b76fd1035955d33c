#include "ckptfs/open_modes.h"

namespace ckptfs::daemon {

OpenModes::Choice OpenModes::Open(uint64_t ino, const std::function<Choice()>& decide,
                                  const std::function<FileCache::CopyPtr()>& resident) {
  MutexLock lock(mu_);
  Held& h = held_[ino];
  if (h.opens++ == 0) {
    h.choice = decide();
    if (observer_) observer_(ino, h.opens, h.choice);
    return h.choice;
  }
  if (observer_) observer_(ino, h.opens, h.choice);
  if (h.choice.passthrough) return h.choice;
  Choice joined;
  joined.copy = resident();
  joined.why = "the file is open through the chunk path by another reader";
  return joined;
}

bool OpenModes::IsOpen(uint64_t ino) const {
  MutexLock lock(mu_);
  return held_.count(ino) != 0;
}

bool OpenModes::Release(uint64_t ino) {
  MutexLock lock(mu_);
  auto it = held_.find(ino);
  if (it == held_.end()) return false;
  --it->second.opens;
  if (observer_) observer_(ino, it->second.opens, it->second.choice);
  if (it->second.opens > 0) return false;
  const bool chunk_path = !it->second.choice.passthrough;
  held_.erase(it);
  return chunk_path;
}

std::vector<std::pair<uint64_t, OpenModes::Held>> OpenModes::Snapshot() const {
  MutexLock lock(mu_);
  return {held_.begin(), held_.end()};
}

void OpenModes::Inherit(uint64_t ino, uint64_t opens, Choice choice) {
  MutexLock lock(mu_);
  Held& h = held_[ino];
  if (h.opens == 0) h.choice = std::move(choice);
  h.opens += opens;
  h.inherited += opens;
  if (observer_) observer_(ino, h.opens, h.choice);
}

bool OpenModes::HasInherited(uint64_t ino) const {
  MutexLock lock(mu_);
  auto it = held_.find(ino);
  return it != held_.end() && it->second.inherited > 0;
}

void OpenModes::SetObserver(Observer observer) {
  MutexLock lock(mu_);
  observer_ = std::move(observer);
}

void OpenModes::ReleaseInherited(uint64_t ino) {
  {
    MutexLock lock(mu_);
    auto it = held_.find(ino);
    if (it == held_.end() || it->second.inherited == 0) return;  // a crash's leftovers: nothing was inherited
    --it->second.inherited;
  }
  Release(ino);
}

size_t OpenModes::inodes() const {
  MutexLock lock(mu_);
  return held_.size();
}

}  // namespace ckptfs::daemon
