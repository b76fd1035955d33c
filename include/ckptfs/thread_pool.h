// A fixed set of worker threads running submitted tasks in FIFO order.
#pragma once

#include <deque>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "ckptfs/mutex.h"

namespace ckptfs {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();  // finishes queued tasks, then joins (unless Cancel() ran)
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // After Cancel() a task is dropped: its future reports a broken promise.
  std::future<void> Submit(std::function<void()> task);
  // Drops the tasks not yet started, waits for those running, and joins.
  // For shutdown: queued work (read-ahead) must not run against parts of
  // the daemon that are about to be torn down.
  void Cancel();
  unsigned size() const { return static_cast<unsigned>(workers_.size()); }

 private:
  void Run();

  Mutex mu_;
  CondVar cv_;
  std::deque<std::packaged_task<void()>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// The number of worker threads to use when the user asked for `requested`
// (0 means one per online CPU).
unsigned EffectiveThreads(unsigned requested);

}  // namespace ckptfs
