// What this build of ckptfs contains, and what the machine offers it at run
// time (the CUDA runtime is optional at build time and at run time).
#pragma once

#include <string>

namespace ckptfs {

// True when the GPU code was compiled in (a CUDA toolkit was found).
bool BuiltWithCuda();

// CUDA devices usable now; 0 without the GPU code, a driver or a device.
int CudaDeviceCount();

// "ckptfs 0.1.0 (CUDA runtime 13.0; 0 devices)" for --version.
std::string BuildDescription();

}  // namespace ckptfs
