// cuemm/runtime/module.hpp: loaded code and kernel launches.
//
//   cuemm::Module module = context.load_module(ptx_text);
//   cuemm::Function fill = module.function("cuemm_fill_u32");
//   fill.launch({blocks}, {256}, stream, device_pointer, value, count);
//
// Arguments are passed by value in the order of the kernel's parameters;
// their C++ types must have the kernel parameters' sizes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/runtime/detail/context_owned_handle.hpp"
#include "cuemm/runtime/stream.hpp"

namespace cuemm {

class Context;

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

class Function {
 public:
  Function(cuda::CUfunction handle, std::string name) : handle_(handle), name_(std::move(name)) {}
  cuda::CUfunction handle() const noexcept { return handle_; }
  const std::string& name() const noexcept { return name_; }

  template <typename... Args>
  void launch(Dim3 grid, Dim3 block, const Stream& stream, Args... args) const {
    std::array<void*, sizeof...(Args) + 1> params{static_cast<void*>(&args)..., nullptr};
    launch_raw(grid, block, 0, stream, params.data());
  }
  void launch_raw(Dim3 grid, Dim3 block, unsigned shared_bytes, const Stream& stream, void** params) const;

 private:
  cuda::CUfunction handle_;
  std::string name_;
};

class Module {
 public:
  Module(Context* context, cuda::CUmodule handle);

  cuda::CUmodule handle() const noexcept { return static_cast<cuda::CUmodule>(handle_.get()); }
  // CudaError (CUDA_ERROR_NOT_FOUND) naming the kernel when it is not in the module.
  Function function(const std::string& name) const;

 private:
  detail::ContextOwnedHandle handle_;
};

}  // namespace cuemm
