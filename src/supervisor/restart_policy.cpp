#include "ckptfs/restart_policy.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>

namespace ckptfs::supervisor {

RestartPolicy::Decision RestartPolicy::OnDeath(bool was_ready, Duration ran) {
  quick_deaths_ = ran >= limits_.stable_run ? 1 : quick_deaths_ + 1;
  failed_starts_ = was_ready ? 0 : failed_starts_ + 1;
  Decision d;
  if (quick_deaths_ > 1) {
    const int doublings = std::min(quick_deaths_ - 2, 20);
    d.delay = std::min(limits_.max_backoff, limits_.first_backoff * (1 << doublings));
  }
  d.crash_loop = failed_starts_ >= limits_.failed_starts_for_loop;
  return d;
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    std::string s = "killed by signal " + std::to_string(sig);
    if (abbrev != nullptr) s += std::string(" (SIG") + abbrev + ")";
    if (WCOREDUMP(wait_status)) s += ", core dumped";
    return s;
  }
  return "ended with wait status " + std::to_string(wait_status);
}

}  // namespace ckptfs::supervisor
