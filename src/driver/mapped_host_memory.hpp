// The device address of mapped host memory, for the two places that allocate
// or register it: the pinned host pool and the host-side manager.
#pragma once

#include "cuemm/driver/driver.hpp"

namespace cuemm::driver {

// The device address of mapped host memory that was just allocated or
// registered (in the current context); when the driver cannot give one,
// `undo` gives that memory back before the error is thrown.
template <typename Undo>
cuda::CUdeviceptr mapped_device_pointer(void* host, Undo&& undo) {
  cuda::CUdeviceptr device = 0;
  const cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostGetDevicePointer, &device, host, 0);
  if (result != cuda::CUDA_SUCCESS) {
    undo();
    check(result, "cuMemHostGetDevicePointer");
  }
  return device;
}

}  // namespace cuemm::driver
