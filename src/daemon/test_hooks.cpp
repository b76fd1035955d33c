#include "test_hooks.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ckptfs::daemon {

std::chrono::milliseconds EntryReplyDelayForTest() {
  const char* ms = std::getenv("CKPTFS_TEST_ENTRY_REPLY_DELAY_MS");
  if (ms == nullptr) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::clamp(std::atol(ms), 0L, 10000L));
}

bool ReserveAtOnceForTest() {
  const char* v = std::getenv("CKPTFS_TEST_RESERVE_AT_ONCE");
  return v != nullptr && std::string(v) == "1";
}

std::function<void()> HoldPublishHook(const std::atomic<bool>* stop) {
  const char* dir = std::getenv("CKPTFS_TEST_HOLD_PUBLISH");
  if (dir == nullptr || *dir == '\0') return nullptr;
  return [hold = std::string(dir) + "/hold", held = std::string(dir) + "/held", stop] {
    if (::access(hold.c_str(), F_OK) != 0) return;
    if (std::FILE* f = std::fopen(held.c_str(), "w")) std::fclose(f);
    for (int i = 0; i < 6000 && !stop->load() && ::access(hold.c_str(), F_OK) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::remove(held.c_str());
  };
}

std::function<void(const std::string&)> PauseBeforeHashHook(const std::atomic<bool>* stop) {
  const char* spec = std::getenv("CKPTFS_TEST_PAUSE_BEFORE_HASH");
  if (spec == nullptr || std::strchr(spec, ':') == nullptr) return nullptr;
  const std::string s(spec);
  const std::string name = s.substr(0, s.find(':')), dir = s.substr(s.find(':') + 1);
  return [name, dir, stop](const std::string& path) {
    if (path.substr(path.rfind('/') + 1) != name) return;
    std::FILE* f = std::fopen((dir + "/paused").c_str(), "w");
    if (f != nullptr) std::fclose(f);
    const std::string resume = dir + "/resume";
    for (int i = 0; i < 6000 && !stop->load() && ::access(resume.c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // A resume that says "once" lets this file through only: the next file
    // of that name pauses again, so a test can hold the indexer twice.
    char word[5] = {};
    if (std::FILE* r = std::fopen(resume.c_str(), "r")) {
      const size_t n = std::fread(word, 1, 4, r);
      std::fclose(r);
      if (n == 4 && std::strcmp(word, "once") == 0) {
        std::remove((dir + "/paused").c_str());
        std::remove(resume.c_str());
      }
    }
  };
}

}  // namespace ckptfs::daemon
