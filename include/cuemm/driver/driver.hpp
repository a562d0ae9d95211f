// cuemm/driver/driver.hpp: the one way cuemm calls the CUDA driver.
//
// The driver library is loaded at run time, on first use, never at static
// initialisation: loading cuemm, registering a memory manager and building
// objects make no driver call, so import order cannot matter.
//
//   CUEMM_DRIVER=auto  (default) libcuda.so.1 when it initialises and sees a
//                      GPU; otherwise the simulated driver, said once on stderr
//   CUEMM_DRIVER=cuda  libcuda.so.1 or an error saying why not
//   CUEMM_DRIVER=sim   the simulated driver (CUEMM_SIM_DRIVER=path overrides
//                      where it is found; default: beside libcuemm)
//
// Usage:
//   cuda::CUdeviceptr pointer;
//   CUEMM_CU(cuMemAlloc, &pointer, bytes);   // throws CudaError on failure
//
// Contract of every entry: it returns a CUresult, CUDA_SUCCESS (0) on success.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/error.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm::driver {

using namespace cuemm::cuda;

// Function pointers resolved from the loaded library; an entry the library
// lacks stays null and a call through CUEMM_CU reports it by name.
struct Functions {
#define CUEMM_DRIVER_POINTER(name, symbols, params) CUresult(*name) params = nullptr;
  CUEMM_DRIVER_FUNCTIONS(CUEMM_DRIVER_POINTER)
#undef CUEMM_DRIVER_POINTER
};

enum class Kind { Cuda, Simulated };

class Driver {
 public:
  // Loads and initialises the driver on first call (thread-safe); throws
  // CudaError or Error when no usable driver can be loaded.
  static const Driver& get();
  // Whether get() has loaded a driver yet: makes no driver call itself.
  static bool is_loaded() noexcept;

  const Functions& api() const noexcept { return functions_; }
  Kind kind() const noexcept { return kind_; }
  bool is_simulated() const noexcept { return kind_ == Kind::Simulated; }
  const std::string& library_path() const noexcept { return path_; }
  int version() const noexcept { return version_; }
  // A symbol of the loaded library that is not part of Functions, or nullptr.
  void* symbol(const char* name) const noexcept;

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

 private:
  Driver() = default;
  static Driver* load();

  void* library_ = nullptr;
  Functions functions_;
  Kind kind_ = Kind::Cuda;
  std::string path_;
  int version_ = 0;
};

// Note [A child forked after the driver was loaded]: such a child cannot use
// CUDA (the driver refuses every call there with CUDA_ERROR_NOT_INITIALIZED),
// yet it holds a copy of the parent's managers: their caches would hand it
// the parent's blocks, and their locks may be held by parent threads that the
// child does not have. The EMM interface (Context, the Python bridge) refuses
// there at once, before any cache or lock, with an error that names the fork;
// every driver error there names it too; and frees do nothing, the memory
// being the parent's.
namespace detail {
extern std::atomic<bool> forked_after_load;  // set in the child by a pthread_atfork handler
}
inline bool in_forked_child() noexcept { return detail::forked_after_load.load(std::memory_order_relaxed); }
[[noreturn]] void throw_in_forked_child(const char* call);
inline void refuse_in_forked_child(const char* call) {
  if (in_forked_child()) [[unlikely]]
    throw_in_forked_child(call);
}

[[noreturn]] void throw_cuda_error(CUresult code, const char* call);
// As throw_cuda_error, but an out-of-memory error names the bytes requested.
[[noreturn]] void throw_allocation_error(CUresult code, const char* call, std::size_t bytes);
[[noreturn]] void throw_missing_function(const char* call);

inline void check(CUresult code, const char* call) {
  if (code != CUDA_SUCCESS) [[unlikely]]
    throw_cuda_error(code, call);
}

// CUEMM_CU_RESULT's call.
template <typename Function, typename... Arguments>
inline CUresult call_or_not_supported(Function* function, Arguments&&... arguments) {
  if (!function) [[unlikely]]
    return CUDA_ERROR_NOT_SUPPORTED;
  return function(std::forward<Arguments>(arguments)...);
}

}  // namespace cuemm::driver

// Calls a driver function through the loaded driver; throws on failure.
// Every call may wait, so each first runs the thread's BlockingHook.
#define CUEMM_CU(function, ...)                                                              \
  do {                                                                                       \
    ::cuemm::before_blocking();                                                              \
    const auto& cuemm_api_ = ::cuemm::driver::Driver::get().api();                           \
    if (!cuemm_api_.function) ::cuemm::driver::throw_missing_function(#function);            \
    ::cuemm::driver::check(cuemm_api_.function(__VA_ARGS__), #function);                     \
  } while (0)

// For allocations: an out-of-memory error names the bytes requested.
#define CUEMM_CU_ALLOC(bytes, function, ...)                                                 \
  do {                                                                                       \
    ::cuemm::before_blocking();                                                              \
    const auto& cuemm_api_ = ::cuemm::driver::Driver::get().api();                           \
    if (!cuemm_api_.function) ::cuemm::driver::throw_missing_function(#function);            \
    if (const auto cuemm_result_ = cuemm_api_.function(__VA_ARGS__))                         \
      ::cuemm::driver::throw_allocation_error(cuemm_result_, #function, bytes);              \
  } while (0)

// Same, but returns the CUresult instead of throwing (for destructors and
// code that handles particular results itself); CUDA_ERROR_NOT_SUPPORTED
// where the loaded driver lacks the function. A call, not a lambda, so that
// any argument works (clang before 16 captures no structured binding); pass
// nullptr, not 0, for a null pointer.
#define CUEMM_CU_RESULT(function, ...) \
  (::cuemm::before_blocking(),         \
   ::cuemm::driver::call_or_not_supported(::cuemm::driver::Driver::get().api().function __VA_OPT__(, ) __VA_ARGS__))
