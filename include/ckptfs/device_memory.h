// DeviceMemory: the GPU tier's memory, behind an interface so the tier logic
// is the same whether the bytes live in a CUDA device or in a simulated
// device in host memory (used by tests and on machines without a GPU).
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
  // Device bytes; null when the device refuses (out of memory).
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* device_ptr) = 0;
  virtual Status CopyToDevice(void* device_dst, const void* host_src, size_t n) = 0;
  virtual Status CopyToHost(void* host_dst, const void* device_src, size_t n) = 0;
  // Total bytes of device memory (for a default tier size).
  virtual uint64_t TotalBytes() const = 0;
  // Page-locks `n` bytes of host memory at `host` (a read-only mapping) and
  // makes them ready for this device's DMA: cudaHostRegister, read-only and
  // portable where the device supports it. Fails with the cause when the
  // device or the system refuses; the caller then falls back to mlock.
  virtual Status RegisterHost(const void* host, size_t n) = 0;
  // Undoes a successful RegisterHost of `host`.
  virtual void UnregisterHost(const void* host) = 0;
};

// Host memory pretending to be a device of `capacity` bytes. RegisterHost
// only records the range (a registration it already holds is refused, as
// CUDA refuses one). Allocations past
// the capacity fail, as cudaMalloc does when the device is full;
// `fail_allocation` (if non-zero) makes the Nth allocation fail, as when
// another process has just taken the device's memory, to test that the tier
// shrinks and the daemon goes on.
std::unique_ptr<DeviceMemory> MakeSimulatedDevice(uint64_t capacity, uint64_t fail_allocation = 0);

// CUDA device `index`; fails when CUDA was not built in or no such device
// is usable.
Result<std::unique_ptr<DeviceMemory>> MakeCudaDevice(int index);

}  // namespace ckptfs
