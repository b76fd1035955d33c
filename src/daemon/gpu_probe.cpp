#include "gpu_probe.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

// The option as the messages name it: "gpu=0", "gpu=auto".
std::string GpuOption(const MountOptions& o) {
  return "gpu=" + (o.gpu == GpuChoice::kIndex ? std::to_string(o.gpu_index) : std::string(WordOf(kGpuWords, o.gpu)));
}

}  // namespace

Result<int> ChooseCudaDevice(const MountOptions& o) {
  if (o.gpu == GpuChoice::kNone || o.gpu == GpuChoice::kSim) return -1;
  const int devices = ProbeCudaDevices();
  if (o.gpu == GpuChoice::kAuto) {
    if (devices > 0) return 0;
    spdlog::warn("gpu=auto: no usable CUDA device ({}); pinned copies are locked with mlock, not registered for DMA",
                 BuiltWithCuda() ? "no driver or no device" : "built without CUDA");
    return -1;
  }
  if (!BuiltWithCuda()) return Status::Error(GpuOption(o) + ": this ckptfs was built without CUDA");
  if (o.gpu_index >= devices) {
    return Status::Error(GpuOption(o) + ": no such CUDA device (" + std::to_string(devices) +
                         " usable); use gpu=auto to go on without one");
  }
  return o.gpu_index;
}

std::unique_ptr<DeviceMemory> OpenDevice(const MountOptions& o, int cuda_device) {
  std::unique_ptr<DeviceMemory> device;
  if (o.gpu == GpuChoice::kSim) {
    device = MakeSimulatedDevice();
  } else if (cuda_device >= 0) {
    auto d = MakeCudaDevice(cuda_device);
    if (!d.ok()) {
      spdlog::error("{}: {}; pinned copies are locked with mlock, not registered for DMA", GpuOption(o),
                    d.status().message());
      return nullptr;
    }
    device = std::move(*d);
  }
  if (device) spdlog::info("pinned host-tier copies are registered for DMA with {}", device->Describe());
  return device;
}

}  // namespace ckptfs::daemon
