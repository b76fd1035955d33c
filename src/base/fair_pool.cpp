#include "ckptfs/fair_pool.h"

#include <algorithm>

#include "ckptfs/mutex.h"

namespace ckptfs {

FairPool::FairPool(unsigned threads, unsigned per_uid)
    : per_uid_(std::max(1u, per_uid)), pool_(std::max(1u, threads)) {}

void FairPool::Submit(uid_t uid, std::function<void()> task) {
  {
    MutexLock lock(mu_);
    Share& share = shares_[uid];
    if (share.running >= per_uid_) {
      share.waiting.push_back(std::move(task));
      return;
    }
    ++share.running;
  }
  Start(uid, std::move(task));
}

void FairPool::Cancel() {
  {
    MutexLock lock(mu_);
    for (auto& [uid, share] : shares_) share.waiting.clear();
  }
  // A task that ends now finds no waiting one to start; and after this,
  // the pool drops whatever it is given.
  pool_.Cancel();
}

void FairPool::Start(uid_t uid, std::function<void()> task) {
  pool_.Submit([this, uid, task = std::move(task)] {
    // The uid's place is given back however the task ends: a task that
    // threw must not leave the uid's share full for ever.
    struct Release {
      FairPool* pool;
      uid_t uid;
      ~Release() { pool->Finished(uid); }
    } release{this, uid};
    task();
  });
}

void FairPool::Finished(uid_t uid) {
  std::function<void()> next;
  {
    MutexLock lock(mu_);
    auto it = shares_.find(uid);
    if (it == shares_.end()) return;
    Share& share = it->second;
    if (share.waiting.empty()) {
      if (--share.running == 0) shares_.erase(it);
      return;
    }
    next = std::move(share.waiting.front());
    share.waiting.pop_front();
  }
  // The share's running count stays: `next` takes the place just freed.
  Start(uid, std::move(next));
}

}  // namespace ckptfs
