// A fixed set of worker threads running submitted tasks in FIFO order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ckptfs {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();  // finishes queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::future<void> Submit(std::function<void()> task);
  unsigned size() const { return static_cast<unsigned>(workers_.size()); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// The number of worker threads to use when the user asked for `requested`
// (0 means one per online CPU).
unsigned EffectiveThreads(unsigned requested);

}  // namespace ckptfs
