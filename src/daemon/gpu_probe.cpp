#include "gpu_probe.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

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
    spdlog::warn("gpu=auto: no usable CUDA device ({}); pinned copies are locked with mlock, not registered for DMA",
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

std::unique_ptr<DeviceMemory> OpenDevice(const MountOptions& o, int cuda_device) {
  std::unique_ptr<DeviceMemory> device;
  if (o.gpu == "sim") {
    device = MakeSimulatedDevice();
  } else if (cuda_device >= 0) {
    auto d = MakeCudaDevice(cuda_device);
    if (!d.ok()) {
      spdlog::error("gpu={}: {}; pinned copies are locked with mlock, not registered for DMA", o.gpu,
                    d.status().message());
      return nullptr;
    }
    device = std::move(*d);
  }
  if (device) spdlog::info("pinned host-tier copies are registered for DMA with {}", device->Describe());
  return device;
}

}  // namespace ckptfs::daemon
