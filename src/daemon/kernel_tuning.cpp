#include "kernel_tuning.h"

#include <fcntl.h>
#include <sys/sysmacros.h>
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
#include "ckptfs/unique_fd.h"

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

namespace {

// A number in a fusectl file, or nullopt.
std::optional<unsigned> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  unsigned value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

// Sets the fusectl file `path` to `want` when it reads lower. Returns
// "path: old -> want" when it did, "" when there was nothing to do.
Result<std::string> RaiseTo(const std::string& path, unsigned want) {
  const std::optional<unsigned> now = ReadNumber(path);
  if (!now) return Status::Error("cannot read " + path);
  if (*now >= want) return std::string();
  const UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  const std::string text = std::to_string(want);
  if (!fd.valid() || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Status::FromErrno("cannot set " + path + " to " + text, errno);
  }
  return path + ": " + std::to_string(*now) + " -> " + text;
}

}  // namespace

Result<std::string> RaiseBackgroundLimit(const std::string& mountpoint, unsigned max_background) {
  const std::optional<MountEntry> mount = MountAt(mountpoint);
  if (!mount) return Status::Error("no mount at " + mountpoint);
  // fusectl names a connection by the kernel's encoding of its device
  // number (major << 20 | minor; FUSE mounts have major 0).
  const std::string connection = std::to_string((major(mount->device) << 20) | minor(mount->device));
  std::string done;
  bool found = false;
  for (const MountEntry& m : ReadMountTable()) {
    if (m.fstype != "fusectl") continue;
    const std::string dir = m.mount_point + "/" + connection;
    if (::access(dir.c_str(), F_OK) != 0) continue;
    found = true;
    for (const auto& [file, want] :
         {std::pair{"/max_background", max_background}, std::pair{"/congestion_threshold", max_background * 3 / 4}}) {
      auto raised = RaiseTo(dir + file, want);
      if (!raised.ok()) return raised.status();
      if (!raised->empty()) done += (done.empty() ? "" : "; ") + *raised;
    }
    break;  // one fusectl is enough: every mount of it shows the same files
  }
  if (!found) return Status::Error("fusectl is not mounted (mount -t fusectl none /sys/fs/fuse/connections)");
  return done;
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
