// The device that pinned host-tier copies are registered with for DMA, from
// the mount option gpu=INDEX|auto|sim: chosen before mounting (so that a bad
// gpu= stops the start with its cause), and opened after daemonizing (a
// process that has touched CUDA cannot use it after fork).
#pragma once

#include <memory>

#include "ckptfs/device_memory.h"
#include "mount_options.h"
#include "ckptfs/status.h"

namespace ckptfs::daemon {

// The CUDA device to use, or -1 for none (no gpu=, gpu=sim, or gpu=auto
// without a usable device, which is logged). Fails for gpu=INDEX when there
// is no such device.
Result<int> ChooseCudaDevice(const MountOptions& o);

// Opens the device chosen before mounting (`cuda_device`, or the simulated
// one for gpu=sim); null without one. A device that cannot be opened is
// logged, and pinned copies are then locked with mlock; the daemon goes on.
std::unique_ptr<DeviceMemory> OpenDevice(const MountOptions& o, int cuda_device);

}  // namespace ckptfs::daemon
