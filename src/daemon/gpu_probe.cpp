#include "gpu_probe.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

#include "cache_sizing.h"
#include "ckptfs/build_info.h"

namespace ckptfs::daemon {

namespace {

// How many CUDA devices are usable, asked in a child process: a process that
// has touched CUDA cannot use it after fork, and the daemon forks to
// daemonize after this check.
int ProbeCudaDevices() {
  if (!BuiltWithCuda()) return 0;
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(CudaDeviceCount(), 100));
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

}  // namespace

Result<int> ChooseCudaDevice(const MountOptions& o) {
  if (o.gpu.empty() || o.gpu == "sim") return -1;
  const int devices = ProbeCudaDevices();
  if (o.gpu == "auto") {
    if (devices > 0) return 0;
    spdlog::warn("gpu=auto: no usable CUDA device ({}); going on without a GPU tier",
                 BuiltWithCuda() ? "no driver or no device" : "built without CUDA");
    return -1;
  }
  const int idx = std::atoi(o.gpu.c_str());
  if (!BuiltWithCuda()) return Status::Error("gpu=" + o.gpu + ": this ckptfs was built without CUDA");
  if (idx >= devices) {
    return Status::Error("gpu=" + o.gpu + ": no such CUDA device (" + std::to_string(devices) +
                         " usable); use gpu=auto to go on without one");
  }
  return idx;
}

GpuTier OpenGpuTier(const MountOptions& o, int cuda_device) {
  GpuTier tier;
  if (o.gpu == "sim") {
    tier.device = MakeSimulatedDevice(o.gpu_cache_size ? o.gpu_cache_size : 1ull << 30);
  } else if (cuda_device >= 0) {
    if (auto d = MakeCudaDevice(cuda_device); d.ok()) {
      tier.device = std::move(*d);
      tier.cuda = true;
    } else {
      spdlog::error("GPU tier disabled: {}", d.status().message());
    }
  }
  if (tier.device) {
    tier.bytes = GpuCacheBytes(o, *tier.device);
    spdlog::info("GPU tier: {} bytes on {}", tier.bytes, tier.device->Describe());
  }
  return tier;
}

}  // namespace ckptfs::daemon
