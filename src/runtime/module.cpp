#include "cuemm/runtime/module.hpp"

#include <utility>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"

namespace cuemm {

Module::Module(Context* context, cuda::CUmodule handle)
    : handle_(context, handle, [](void* module) { CUEMM_CU(cuModuleUnload, static_cast<cuda::CUmodule>(module)); }) {}

Function Module::function(const std::string& name) const {
  ScopedContext scope(*handle_.context());
  cuda::CUfunction function = nullptr;
  const cuda::CUresult result = CUEMM_CU_RESULT(cuModuleGetFunction, &function, handle(), name.c_str());
  if (result != cuda::CUDA_SUCCESS) throw CudaError(result, "cuModuleGetFunction", "kernel '" + name + "'");
  return Function(function, name);
}

void Function::launch_raw(Dim3 grid, Dim3 block, unsigned shared_bytes, const Stream& stream, void** params) const {
  const cuda::CUresult result = CUEMM_CU_RESULT(cuLaunchKernel, handle_, grid.x, grid.y, grid.z, block.x, block.y,
                                                block.z, shared_bytes, stream.handle(), params, nullptr);
  if (result != cuda::CUDA_SUCCESS) throw CudaError(result, "cuLaunchKernel", "kernel '" + name_ + "'");
}

}  // namespace cuemm
