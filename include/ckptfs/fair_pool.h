// FairPool: a ThreadPool shared by several users (the clients of the
// control socket; the FUSE reads that wait for a proof), in which no one
// uid may hold more than `per_uid` of the threads at once. What a uid
// submits beyond that waits in its own queue, in order, and is handed to
// the pool as one of its tasks finishes; so one uid with many slow
// requests delays its own, never everybody's (issue 21 item 3).
#pragma once

#include <sys/types.h>

#include <deque>
#include <functional>
#include <map>

#include "ckptfs/mutex.h"
#include "ckptfs/thread_pool.h"

namespace ckptfs {

class FairPool {
 public:
  FairPool(unsigned threads, unsigned per_uid);
  // Runs every task submitted, its waiting ones included, then joins
  // (pool_'s destructor, while the shares are still there).
  ~FairPool() = default;
  FairPool(const FairPool&) = delete;
  FairPool& operator=(const FairPool&) = delete;

  void Submit(uid_t uid, std::function<void()> task);
  // Drops every task not yet started, waiting or queued, waits for those
  // running, and joins (ThreadPool::Cancel): for a shutdown.
  void Cancel();
  unsigned size() const { return pool_.size(); }

 private:
  struct Share {
    unsigned running = 0;
    std::deque<std::function<void()>> waiting;
  };
  // Runs `task` on a pool thread, then the uid's next waiting task if any.
  void Start(uid_t uid, std::function<void()> task);
  void Finished(uid_t uid);

  const unsigned per_uid_;
  Mutex mu_;
  // A uid with nothing running or waiting has no entry.
  std::map<uid_t, Share> shares_ GUARDED_BY(mu_);
  // Declared last, so destroyed first: its workers drain, and submit the
  // waiting tasks to it, while the shares still live.
  ThreadPool pool_;
};

}  // namespace ckptfs
