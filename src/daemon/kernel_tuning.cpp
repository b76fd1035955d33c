#include "kernel_tuning.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "ckptfs/mount_table.h"
#include "ckptfs/sealed_copy.h"

namespace ckptfs::daemon {

std::string MountDevice(const std::string& mountpoint) {
  auto mount = MountAt(mountpoint);
  return mount ? mount->device_text : "";
}

std::optional<dev_t> MountDeviceNumber(const std::string& mountpoint) {
  auto mount = MountAt(mountpoint);
  if (!mount) return std::nullopt;
  return mount->device;
}

void SetBdiReadahead(const std::string& mountpoint, uint64_t bytes, const std::atomic<bool>& stop) {
  const std::string devno = MountDevice(mountpoint);
  if (devno.empty()) return;
  const std::string path = "/sys/class/bdi/" + devno + "/read_ahead_kb";
  const std::string want = std::to_string(bytes / 1024);
  for (int attempt = 0; attempt < 50 && !stop.load(); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    {
      std::ofstream out(path);
      out << want;
      out.flush();
      if (!out) {
        spdlog::warn("cannot set {} to {} KiB: {}; the kernel's default read-ahead stays", path, want,
                     std::strerror(errno));
        return;
      }
    }
    std::ifstream in(path);
    std::string got;
    in >> got;
    if (got == want) {
      spdlog::debug("read-ahead of {} set to {} KiB", mountpoint, want);
      return;
    }
  }
  if (!stop.load()) spdlog::warn("read-ahead of {} did not stay at {} KiB", mountpoint, want);
}


Result<std::string> AskForShmemHugePages(const std::string& thp_dir) {
  // A memfd lives on the kernel's internal shmem mount, whose policy is the
  // global shmem_enabled; the per-size files govern anonymous shared memory
  // only, so they would not reach the host tier.
  const std::string path = thp_dir + "/shmem_enabled";
  const std::string setting = SealedCopy::ReadHugePageSetting(path);
  // Huge pages allowed already, forbidden on purpose (deny, or an
  // administrator's advise/always), or no such file: nothing to do.
  if (setting != "never") return std::string();
  int err = 0;
  if (const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC); fd < 0) {
    err = errno;
  } else {
    if (::write(fd, "advise", 6) != 6) err = errno;
    ::close(fd);
  }
  if (SealedCopy::ReadHugePageSetting(path) != "advise") {
    const std::string why = err != 0 ? std::strerror(err) : "the kernel kept its value";
    return Status::Error("the host tier's copies use 4 KiB pages (" + path + " is never) and it could not be set to advise: " +
                         why + "; loads from the host tier will be slower (-o shmem_huge=keep silences this)");
  }
  return "set " + path +
         " from never (the kernel's default) to advise, so the host tier's copies get 2 MiB pages; only mappings "
         "that ask for them (MADV_HUGEPAGE) are affected (-o shmem_huge=keep leaves the setting alone)";
}

void LowerOomScore() {
  constexpr int kOomScoreAdj = -500;
  FILE* f = std::fopen("/proc/self/oom_score_adj", "w");
  const bool ok = f != nullptr && std::fprintf(f, "%d", kOomScoreAdj) > 0 && std::fflush(f) == 0;
  const int err = errno;
  if (f != nullptr) std::fclose(f);
  if (!ok) {
    spdlog::info("cannot lower oom_score_adj to {}: {} (it needs CAP_SYS_RESOURCE)", kOomScoreAdj, std::strerror(err));
  }
}

}  // namespace ckptfs::daemon
