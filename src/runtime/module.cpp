#include "cuemm/runtime/module.hpp"

#include <utility>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"

namespace cuemm {

Module::Module(Context* context, cuda::CUmodule handle)
    : context_(context), handle_(handle), generation_(context->generation()) {}

Module::Module(Module&& other) noexcept
    : context_(other.context_), handle_(std::exchange(other.handle_, nullptr)), generation_(other.generation_) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    release();
    context_ = other.context_;
    handle_ = std::exchange(other.handle_, nullptr);
    generation_ = other.generation_;
  }
  return *this;
}

Module::~Module() { release(); }

void Module::release() noexcept {
  if (!handle_ || context_->generation() != generation_) return;
  Context* context = context_;
  cuda::CUmodule handle = std::exchange(handle_, nullptr);
  context->deallocations().add([context, handle] {
    ScopedContext scope(*context);
    CUEMM_CU(cuModuleUnload, handle);
  });
}

Function Module::function(const std::string& name) const {
  ScopedContext scope(*context_);
  cuda::CUfunction function = nullptr;
  const cuda::CUresult result = CUEMM_CU_RESULT(cuModuleGetFunction, &function, handle_, name.c_str());
  if (result != cuda::CUDA_SUCCESS) throw CudaError(result, "cuModuleGetFunction", "kernel '" + name + "'");
  return Function(function, name);
}

void Function::launch_raw(Dim3 grid, Dim3 block, unsigned shared_bytes, const Stream& stream, void** params) const {
  const cuda::CUresult result = CUEMM_CU_RESULT(cuLaunchKernel, handle_, grid.x, grid.y, grid.z, block.x, block.y,
                                                block.z, shared_bytes, stream.handle(), params, nullptr);
  if (result != cuda::CUDA_SUCCESS) throw CudaError(result, "cuLaunchKernel", "kernel '" + name_ + "'");
}

}  // namespace cuemm
