// cuemm/error.hpp: the exceptions cuemm throws.
//
//   Error                      base of everything below
//   ├── InvalidArgument        bad input: a size, pointer, device or version
//   ├── StateError             a call that the object's state forbids (freeing
//   │                          dead memory, opening an IPC handle twice, ...)
//   ├── PluginError            a memory-manager plugin cannot be used
//   └── CudaError              a driver call failed: code, its name, the call
//       └── OutOfMemory        the driver, a pool or a limit ran out of memory
//
// Messages name the offending value, e.g.
//   [CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "cuemm/driver/cuda_api.hpp"

namespace cuemm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class StateError : public Error {
 public:
  using Error::Error;
};

class PluginError : public Error {
 public:
  using Error::Error;
};

// The operation is valid but this manager cannot do it (the message says which can).
class NotSupported : public Error {
 public:
  using Error::Error;
};

class CudaError : public Error {
 public:
  CudaError(cuda::CUresult code, std::string call, const std::string& detail = {});
  cuda::CUresult code() const noexcept { return code_; }
  const std::string& call() const noexcept { return call_; }
  // "CUDA_ERROR_OUT_OF_MEMORY", or "CUDA_ERROR_<number>" for codes the driver cannot name.
  const std::string& code_name() const noexcept { return code_name_; }

 protected:
  // For subclasses that compose their own message.
  CudaError(cuda::CUresult code, std::string call, std::string code_name, const std::string& message);

 private:
  cuda::CUresult code_;
  std::string call_;
  std::string code_name_;
};

class OutOfMemory : public CudaError {
 public:
  // `call` is what ran out ("cuMemAlloc", "PoolMemoryManager::memalloc");
  // `requested` the bytes asked for; `detail` says why (a limit, a pool size).
  OutOfMemory(std::string call, std::size_t requested, const std::string& detail = {});
  std::size_t requested() const noexcept { return requested_; }

 private:
  std::size_t requested_;
};

// The name the driver gives a CUresult, or "CUDA_ERROR_<number>".
std::string error_name(cuda::CUresult code);

// "1.50 GiB (1610612736 bytes)": how sizes appear in messages.
std::string describe_bytes(std::size_t bytes);

}  // namespace cuemm
