#include "ckptfs/open_modes.h"

namespace ckptfs::fuse {

OpenModes::Counted OpenModes::Count(uint64_t ino, uint64_t opens, uint64_t inherited) {
  MutexLock lock(mu_);
  Entry& e = held_[ino];
  if (!e.mode) e.mode = std::make_shared<Mode>();
  e.opens += opens;
  e.opens_since_idle += opens;
  e.inherited += inherited;
  return {e.mode, observer_};
}

void OpenModes::Tell(const std::shared_ptr<const Observer>& observer, uint64_t ino) {
  if (observer && *observer) (*observer)(ino);
}

OpenModes::Choice OpenModes::ChoiceOf(Mode& mode) {
  MutexLock lock(mode.mu);
  return mode.choice;
}

OpenModes::Choice OpenModes::Open(uint64_t ino, const std::function<Choice()>& decide,
                                  const std::function<FileCache::CopyPtr()>& resident) {
  const Counted counted = Count(ino, 1, 0);
  Mode* mode = counted.mode.get();
  Choice in_force;
  bool decided_here = false;
  {
    // Whoever takes the inode's lock first decides; the others of this
    // inode wait for the decision, and no other inode waits at all.
    MutexLock lock(mode->mu);
    if (!mode->decided) {
      mode->choice = decide();
      mode->decided = true;
      decided_here = true;
    }
    in_force = mode->choice;
  }
  Tell(counted.observer, ino);
  if (decided_here || in_force.passthrough) return in_force;
  Choice joined;
  joined.copy = resident();
  joined.why = "the file is open through the chunk path by another reader";
  return joined;
}

bool OpenModes::IsOpen(uint64_t ino) const {
  MutexLock lock(mu_);
  return held_.count(ino) != 0;
}

uint64_t OpenModes::OpensSinceIdle(uint64_t ino) const {
  MutexLock lock(mu_);
  auto it = held_.find(ino);
  return it == held_.end() ? 0 : it->second.opens_since_idle;
}

bool OpenModes::Release(uint64_t ino, uint64_t* opens_since_idle) {
  std::shared_ptr<Mode> last;
  std::shared_ptr<const Observer> observer;
  if (opens_since_idle != nullptr) *opens_since_idle = 0;
  {
    MutexLock lock(mu_);
    auto it = held_.find(ino);
    if (it == held_.end()) return false;
    if (opens_since_idle != nullptr) *opens_since_idle = it->second.opens_since_idle;
    if (--it->second.opens == 0) {
      last = std::move(it->second.mode);
      held_.erase(it);
    }
    observer = observer_;
  }
  Tell(observer, ino);
  // The last open had its mode decided before it was counted out.
  return last && !ChoiceOf(*last).passthrough;
}

std::vector<std::pair<uint64_t, OpenModes::Held>> OpenModes::Snapshot() const {
  std::vector<std::pair<uint64_t, Entry>> entries;
  {
    MutexLock lock(mu_);
    entries.assign(held_.begin(), held_.end());
  }
  std::vector<std::pair<uint64_t, Held>> out;
  out.reserve(entries.size());
  for (auto& [ino, e] : entries) out.push_back({ino, Held{e.opens, e.inherited, ChoiceOf(*e.mode)}});
  return out;
}

std::optional<OpenModes::Held> OpenModes::Find(uint64_t ino) const {
  Entry e;
  {
    MutexLock lock(mu_);
    auto it = held_.find(ino);
    if (it == held_.end()) return std::nullopt;
    e = it->second;
  }
  return Held{e.opens, e.inherited, ChoiceOf(*e.mode)};
}

void OpenModes::Inherit(uint64_t ino, uint64_t opens, Choice choice) {
  if (opens == 0) return;  // nothing open: the next open decides afresh
  const Counted counted = Count(ino, opens, opens);
  {
    Mode& mode = *counted.mode;
    MutexLock lock(mode.mu);
    if (!mode.decided) {
      mode.choice = std::move(choice);
      mode.decided = true;
    }
  }
  Tell(counted.observer, ino);
}

bool OpenModes::HasInherited(uint64_t ino) const {
  MutexLock lock(mu_);
  auto it = held_.find(ino);
  return it != held_.end() && it->second.inherited > 0;
}

void OpenModes::SetObserver(Observer observer) {
  auto shared = std::make_shared<const Observer>(std::move(observer));
  MutexLock lock(mu_);
  observer_ = std::move(shared);
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

}  // namespace ckptfs::fuse
