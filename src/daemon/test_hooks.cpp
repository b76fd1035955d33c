#include "test_hooks.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ckptfs::daemon {

std::function<void(const std::string&)> PauseBeforeHashHook(const std::atomic<bool>* stop) {
  const char* spec = std::getenv("CKPTFS_TEST_PAUSE_BEFORE_HASH");
  if (spec == nullptr || std::strchr(spec, ':') == nullptr) return nullptr;
  const std::string s(spec);
  const std::string name = s.substr(0, s.find(':')), dir = s.substr(s.find(':') + 1);
  return [name, dir, stop](const std::string& path) {
    if (path.substr(path.rfind('/') + 1) != name) return;
    std::FILE* f = std::fopen((dir + "/paused").c_str(), "w");
    if (f != nullptr) std::fclose(f);
    for (int i = 0; i < 6000 && !stop->load() && ::access((dir + "/resume").c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
}

}  // namespace ckptfs::daemon
