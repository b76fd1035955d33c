#include "ckptfs/build_info.h"

#ifdef CKPTFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ckptfs {

bool BuiltWithCuda() {
#ifdef CKPTFS_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#ifdef CKPTFS_HAVE_CUDA
  int n = 0;
  // Without a driver or a device this fails; that simply means no device.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

// CMake -DCKPTFS_VERSION_SUFFIX=... marks a build (a packager's revision;
// the restart tests' second binary).
#ifndef CKPTFS_VERSION_SUFFIX
#define CKPTFS_VERSION_SUFFIX ""
#endif

std::string BuildDescription() {
  std::string s = "ckptfs " CKPTFS_VERSION CKPTFS_VERSION_SUFFIX;
#ifdef CKPTFS_HAVE_CUDA
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  s += " (CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10) + "; " +
       std::to_string(CudaDeviceCount()) + " device(s) usable)";
#else
  s += " (built without CUDA)";
#endif
  return s;
}

}  // namespace ckptfs
