// DeviceMemory: the device (gpu=) that pinned host-tier copies are
// registered with for DMA, behind an interface so that the registration
// logic is the same with a CUDA device and with a simulated one (used by
// tests and on machines without a GPU). ckptfs keeps nothing in device
// memory: engines copy weights to the device themselves, and a copy from
// registered pages is a DMA (see README, "The host tier is the GPU-facing
// cache").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ckptfs/status.h"

namespace ckptfs {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual std::string Describe() const = 0;
  // Page-locks `n` bytes of host memory at `host` (a read-only mapping) and
  // makes them ready for this device's DMA: cudaHostRegister, read-only and
  // portable where the device supports it. Fails with the cause when the
  // device or the system refuses; the caller then falls back to mlock.
  virtual Status RegisterHost(const void* host, size_t n) = 0;
  // Undoes a successful RegisterHost of `host`.
  virtual void UnregisterHost(const void* host) = 0;
};

// A device that is not there: RegisterHost only records the range (a
// registration it already holds is refused, as CUDA refuses one).
std::unique_ptr<DeviceMemory> MakeSimulatedDevice();

// CUDA device `index`; fails when CUDA was not built in or no such device
// is usable.
Result<std::unique_ptr<DeviceMemory>> MakeCudaDevice(int index);

}  // namespace ckptfs
