#include "ckptfs/thread_pool.h"

namespace ckptfs {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = 1;
  workers_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::Cancel() {
  std::deque<std::packaged_task<void()>> dropped;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cancelled_ = true;
    dropped.swap(queue_);
  }
  cv_.NotifyAll();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

std::future<void> ThreadPool::Submit(std::function<void()> task) {
  std::packaged_task<void()> pt(std::move(task));
  auto fut = pt.get_future();
  {
    MutexLock lock(mu_);
    if (cancelled_) return fut;  // `pt` dies here: the future reports a broken promise
    queue_.push_back(std::move(pt));
  }
  cv_.NotifyOne();
  return fut;
}

void ThreadPool::Run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(mu_);
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

unsigned EffectiveThreads(unsigned requested) {
  if (requested != 0) return requested;
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

}  // namespace ckptfs
