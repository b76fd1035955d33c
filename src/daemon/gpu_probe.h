// The GPU tier's device, from the mount option gpu=INDEX|auto|sim: chosen
// before mounting (so that a bad gpu= stops the start with its cause), and
// opened after daemonizing (a process that has touched CUDA cannot use it
// after fork).
#pragma once

#include <cstdint>
#include <memory>

#include "ckptfs/device_memory.h"
#include "ckptfs/mount_options.h"
#include "ckptfs/status.h"

namespace ckptfs::daemon {

// The CUDA device to use, or -1 for none (no gpu=, gpu=sim, or gpu=auto
// without a usable device, which is logged). Fails for gpu=INDEX when there
// is no such device.
Result<int> ChooseCudaDevice(const MountOptions& o);

struct GpuTier {
  std::unique_ptr<DeviceMemory> device;  // null: no GPU tier
  uint64_t bytes = 0;
  bool cuda = false;  // a real CUDA device: host chunks are registered for DMA
};

// Opens the device chosen before mounting (`cuda_device`, or the simulated
// one for gpu=sim). A device that cannot be opened disables the tier, with
// a log line; the daemon goes on.
GpuTier OpenGpuTier(const MountOptions& o, int cuda_device);

}  // namespace ckptfs::daemon
