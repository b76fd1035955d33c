#include "ckptfs/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#ifdef CKPTFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "ckptfs/build_info.h"

namespace ckptfs {

namespace {

class SimulatedDevice final : public DeviceMemory {
 public:
  SimulatedDevice(uint64_t capacity, uint64_t fail_after) : capacity_(capacity), fail_after_(fail_after) {}
  std::string Describe() const override { return "simulated device (" + std::to_string(capacity_) + " bytes)"; }
  void* Allocate(size_t bytes) override {
    std::lock_guard lock(mu_);
    ++allocations_;
    if (fail_after_ != 0 && allocations_ == fail_after_) return nullptr;
    if (used_ + bytes > capacity_) return nullptr;
    void* p = std::malloc(bytes + sizeof(size_t));
    if (p == nullptr) return nullptr;
    *static_cast<size_t*>(p) = bytes;
    used_ += bytes;
    return static_cast<char*>(p) + sizeof(size_t);
  }
  void Free(void* device_ptr) override {
    if (device_ptr == nullptr) return;
    void* p = static_cast<char*>(device_ptr) - sizeof(size_t);
    std::lock_guard lock(mu_);
    used_ -= *static_cast<size_t*>(p);
    std::free(p);
  }
  Status CopyToDevice(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return Status::Ok();
  }
  uint64_t TotalBytes() const override { return capacity_; }
  Status RegisterHost(const void* host, size_t n) override {
    std::lock_guard lock(mu_);
    if (!registered_.emplace(host, n).second) return Status::Error("host memory already registered");
    return Status::Ok();
  }
  void UnregisterHost(const void* host) override {
    std::lock_guard lock(mu_);
    registered_.erase(host);
  }

 private:
  std::mutex mu_;
  std::map<const void*, size_t> registered_;
  const uint64_t capacity_;
  const uint64_t fail_after_;
  uint64_t used_ = 0;
  uint64_t allocations_ = 0;
};

#ifdef CKPTFS_HAVE_CUDA
class CudaDevice final : public DeviceMemory {
 public:
  CudaDevice(int index, uint64_t total, std::string name, bool read_only_registration)
      : index_(index), total_(total), name_(std::move(name)), read_only_registration_(read_only_registration) {}
  std::string Describe() const override { return "CUDA device " + std::to_string(index_) + " (" + name_ + ")"; }
  void* Allocate(size_t bytes) override {
    cudaSetDevice(index_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void Free(void* p) override {
    cudaSetDevice(index_);
    cudaFree(p);
  }
  Status CopyToDevice(void* dst, const void* src, size_t n) override {
    cudaSetDevice(index_);
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? Status::Ok() : Status::Error(std::string("cudaMemcpy to device: ") + cudaGetErrorString(e));
  }
  Status CopyToHost(void* dst, const void* src, size_t n) override {
    cudaSetDevice(index_);
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? Status::Ok() : Status::Error(std::string("cudaMemcpy to host: ") + cudaGetErrorString(e));
  }
  uint64_t TotalBytes() const override { return total_; }
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
  uint64_t total_;
  std::string name_;
  bool read_only_registration_;
};
#endif

}  // namespace

std::unique_ptr<DeviceMemory> MakeSimulatedDevice(uint64_t capacity, uint64_t fail_allocation) {
  return std::make_unique<SimulatedDevice>(capacity, fail_allocation);
}

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
  return std::unique_ptr<DeviceMemory>(new CudaDevice(index, prop.totalGlobalMem, prop.name, read_only != 0));
#else
  (void)index;
  return Status::Error("this ckptfs was built without CUDA");
#endif
}

}  // namespace ckptfs
