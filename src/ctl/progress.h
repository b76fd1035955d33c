// A progress bar on standard error for long work: bytes done of total, rate
// and ETA, redrawn a few times a second. It draws only when standard error is
// a terminal and the work has lasted long enough to be worth watching, so
// logs and pipes never get control characters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "ckptfs/mutex.h"

namespace ckptfs {

// "1.50 GiB"
std::string FormatBytes(uint64_t bytes);

// One line of the bar, without control characters, for `width` columns:
//   "hashing  1.50 GiB / 4.00 GiB [#######.........]  37%  1.20 GiB/s  ETA 0:02"
std::string FormatProgressLine(const std::string& label, uint64_t done, uint64_t total, double elapsed_s,
                               int width);

class ProgressBar {
 public:
  // Draws only if `enabled` (normally: isatty(STDERR_FILENO)).
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar();  // erases the bar
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void SetTotal(uint64_t total) { total_ = total; }
  void Add(uint64_t bytes) { done_ += bytes; }

 private:
  void Run();
  void Draw() REQUIRES(mu_);

  std::string label_;
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> total_{0};
  std::chrono::steady_clock::time_point start_;
  bool enabled_;
  Mutex mu_;
  CondVar cv_;
  bool drawn_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckptfs
