#include "ckptfs/device_memory.h"

#include <map>

#ifdef CKPTFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "ckptfs/build_info.h"
#include "ckptfs/mutex.h"

namespace ckptfs {

namespace {

class SimulatedDevice final : public DeviceMemory {
 public:
  std::string Describe() const override { return "simulated device"; }
  Status RegisterHost(const void* host, size_t n) override {
    MutexLock lock(mu_);
    if (!registered_.emplace(host, n).second) return Status::Error("host memory already registered");
    return Status::Ok();
  }
  void UnregisterHost(const void* host) override {
    MutexLock lock(mu_);
    registered_.erase(host);
  }

 private:
  Mutex mu_;
  std::map<const void*, size_t> registered_ GUARDED_BY(mu_);
};

#ifdef CKPTFS_HAVE_CUDA
class CudaDevice final : public DeviceMemory {
 public:
  CudaDevice(int index, std::string name, bool read_only_registration)
      : index_(index), name_(std::move(name)), read_only_registration_(read_only_registration) {}
  std::string Describe() const override { return "CUDA device " + std::to_string(index_) + " (" + name_ + ")"; }
  // A sealed copy is mapped read-only, which cudaHostRegister accepts only
  // with cudaHostRegisterReadOnly (devices that report support for it).
  Status RegisterHost(const void* host, size_t n) override {
    if (!read_only_registration_) {
      return Status::Error(Describe() + " cannot register read-only host memory (cudaHostRegisterReadOnly)");
    }
    cudaSetDevice(index_);
    cudaError_t e = cudaHostRegister(const_cast<void*>(host), n, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (e == cudaSuccess) return Status::Ok();
    cudaGetLastError();
    return Status::Error(std::string("cudaHostRegister: ") + cudaGetErrorString(e));
  }
  void UnregisterHost(const void* host) override {
    cudaSetDevice(index_);
    if (cudaHostUnregister(const_cast<void*>(host)) != cudaSuccess) cudaGetLastError();
  }

 private:
  int index_;
  std::string name_;
  bool read_only_registration_;
};
#endif

}  // namespace

std::unique_ptr<DeviceMemory> MakeSimulatedDevice() { return std::make_unique<SimulatedDevice>(); }

Result<std::unique_ptr<DeviceMemory>> MakeCudaDevice(int index) {
#ifdef CKPTFS_HAVE_CUDA
  const int count = CudaDeviceCount();
  if (count == 0) return Status::Error("no CUDA device is usable (no driver or no device)");
  if (index < 0 || index >= count) {
    return Status::Error("CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(count) +
                         " usable)");
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();
    return Status::Error("cannot query CUDA device " + std::to_string(index));
  }
  int read_only = 0;
  if (cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, index) != cudaSuccess) {
    cudaGetLastError();
    read_only = 0;
  }
  return std::unique_ptr<DeviceMemory>(new CudaDevice(index, prop.name, read_only != 0));
#else
  (void)index;
  return Status::Error("this ckptfs was built without CUDA");
#endif
}

}  // namespace ckptfs
