#include "header_scans.h"

namespace ckptfs {

HeaderScans::Opener* HeaderScans::Find(pid_t opener) {
  auto it = openers_.find(opener);
  if (it == openers_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return &it->second;
}

bool HeaderScans::OpenIsScan(pid_t opener, const std::string& checkpoint, uint64_t file, Clock::time_point now) {
  if (checkpoint.empty() || opener <= 0) return false;
  MutexLock lock(mu_);
  Opener* o = Find(opener);
  if (o == nullptr || o->checkpoint != checkpoint || now - o->short_close > kWindow) return false;
  if (!o->confirmed && o->trial) return false;  // the trial has not shown a header read yet
  if (o->opened.size() >= kMaxFilesPerOpener || !o->opened.insert(file).second) return false;
  if (!o->confirmed) o->trial = file;
  ++scan_opens_;
  return true;
}

void HeaderScans::Closed(pid_t opener, const std::string& checkpoint, uint64_t file, Clock::duration held,
                         Clock::time_point now) {
  if (checkpoint.empty() || opener <= 0 || held > kShortOpen) return;
  MutexLock lock(mu_);
  Opener* o = Find(opener);
  if (o == nullptr) {
    if (openers_.size() >= kMaxOpeners) {
      openers_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(opener);
    o = &openers_[opener];
    o->lru = lru_.begin();
  }
  if (o->checkpoint != checkpoint || now - o->short_close > kWindow) {
    o->checkpoint = checkpoint;
    o->opened.clear();
    o->trial.reset();
    o->confirmed = false;
  }
  if (o->trial == file) o->confirmed = true;
  o->short_close = now;
  if (o->opened.size() < kMaxFilesPerOpener) o->opened.insert(file);
}

uint64_t HeaderScans::scan_opens() const {
  MutexLock lock(mu_);
  return scan_opens_;
}

}  // namespace ckptfs
