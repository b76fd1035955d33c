// RestartPolicy: when the supervisor starts the serving daemon again after
// it died, and when a run of deaths is a crash loop.
//
// The first death after a stable run restarts at once: requests wait in the
// kernel meanwhile and are served (or resent) by the successor. Deaths in
// quick succession back off exponentially, 100 ms doubling to a ceiling, so
// a daemon that cannot start does not spin. Three starts in a row that
// never became ready are a crash loop: the supervisor then answers requests
// with EIO while it waits, so that readers fail instead of hanging forever.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace ckptfs::supervisor {

class RestartPolicy {
 public:
  using Duration = std::chrono::steady_clock::duration;

  struct Limits {
    std::chrono::milliseconds first_backoff{100};
    std::chrono::milliseconds max_backoff{10'000};
    Duration stable_run = std::chrono::seconds(30);  // a run this long forgives earlier deaths
    int failed_starts_for_loop = 3;
  };

  struct Decision {
    std::chrono::milliseconds delay{0};
    bool crash_loop = false;
  };

  RestartPolicy() = default;
  explicit RestartPolicy(Limits limits) : limits_(limits) {}

  // A daemon died after running `ran`; `was_ready`: it had reported ready.
  Decision OnDeath(bool was_ready, Duration ran);
  // A daemon reported ready: the loop, if any, is over.
  void OnReady() { failed_starts_ = 0; }

 private:
  Limits limits_;
  int quick_deaths_ = 0;   // in a row, each within stable_run of its start
  int failed_starts_ = 0;  // in a row, before ready
};

// "exited with status 3", "killed by signal 9 (SIGKILL)", from waitpid.
std::string DescribeExit(int wait_status);

}  // namespace ckptfs::supervisor
