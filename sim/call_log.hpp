// call_log.hpp: per-function call counters and fault injection.
//
// Every exported entry point starts with SIM_ENTER(name): it counts the call
// and, if a fault is armed for that call, returns the fault's CUresult before
// the function does anything. Counting lets tests prove claims such as "the
// runtime never called cuMemAlloc"; faults let them drive every error path.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

#include "cuemm/driver/cuda_api.hpp"

// Every driver function the simulation exports, by its API name.
#define CUEMM_SIM_FUNCTIONS(X)                                                                    \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount)       \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceComputeCapability)          \
  X(cuDeviceGetUuid) X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxGetState)           \
  X(cuDevicePrimaryCtxSetFlags) X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxGetCurrent)                 \
  X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) \
  X(cuCtxEnablePeerAccess) X(cuMemGetInfo) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocManaged)        \
  X(cuMemGetAddressRange) X(cuMemHostAlloc) X(cuMemAllocHost) X(cuMemFreeHost)                    \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemHostGetDevicePointer) X(cuMemHostGetFlags)   \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)       \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemsetD32) X(cuMemsetD32Async)        \
  X(cuPointerGetAttribute) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)      \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)                    \
  X(cuStreamWaitEvent) X(cuStreamAddCallback) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) \
  X(cuEventQuery) X(cuEventSynchronize) X(cuCtxRecordEvent) X(cuThreadExchangeStreamCaptureMode)  \
  X(cuEventElapsedTime) X(cuStreamGetCtx) X(cuStreamGetId)                                                          \
  X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal)             \
  X(cuLaunchKernel) X(cuFuncGetAttribute) X(cuFuncSetCacheConfig) X(cuLinkCreate)                 \
  X(cuProfilerStart) X(cuProfilerStop) X(cuMemPoolCreate) X(cuMemPoolDestroy)                    \
  X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) X(cuMemPoolSetAccess) X(cuMemPoolTrimTo) X(cuMemAllocFromPoolAsync)   \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) \
  X(cuMemSetAccess) X(cuMemGetAllocationGranularity)   \
  X(cuMemFreeAsync)                                                            \
  X(cuMemPoolExportToShareableHandle)                                          \
  X(cuMemPoolImportFromShareableHandle)                                        \
  X(cuMemPoolExportPointer)                                                    \
  X(cuMemPoolImportPointer)                                                     \
  X(cuMemExportToShareableHandle)                                              \
  X(cuMemImportFromShareableHandle)                                            \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)         \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)

namespace cuemm::sim {

enum class Fn : int {
#define CUEMM_SIM_ENUM(name) name,
  CUEMM_SIM_FUNCTIONS(CUEMM_SIM_ENUM)
#undef CUEMM_SIM_ENUM
      kCount
};
inline constexpr int kFunctionCount = static_cast<int>(Fn::kCount);

// The calling thread's driver calls under way. A test that makes the
// library's host allocations fail spares the driver's own (the real driver
// lets no C++ exception out): sim_control.h, cuemmSimDriverCallsUnderWay.
inline thread_local int driver_calls_under_way = 0;
struct DriverCall {
  DriverCall() noexcept { ++driver_calls_under_way; }
  ~DriverCall() { --driver_calls_under_way; }
  DriverCall(const DriverCall&) = delete;
  DriverCall& operator=(const DriverCall&) = delete;
};

class CallLog {
 public:
  static CallLog& instance();

  // Counts the call; returns the injected CUresult, or CUDA_SUCCESS.
  cuda::CUresult enter(Fn function) {
    const auto index = static_cast<int>(function);
    const auto call = counts_[index].fetch_add(1, std::memory_order_relaxed) + 1;
    if (!armed_.load(std::memory_order_acquire)) return cuda::CUDA_SUCCESS;
    return check_faults(index, call);
  }

  unsigned long long count(int index) const { return counts_[index].load(); }
  void reset_counts() {
    for (auto& count : counts_) count.store(0);
  }
  // `nth` counts from the current call count of the function.
  void inject(int index, unsigned long long nth, cuda::CUresult result, unsigned long long times);
  // Ends the injected faults; CUEMM_SIM_FAULTS's stay, as the process's
  // setting (a test that clears its own must not end a run's, such as CI's
  // run of the pools' tests with every cuCtxRecordEvent refused).
  void clear();

  static int index_of(std::string_view name);

 private:
  CallLog();
  cuda::CUresult check_faults(int index, unsigned long long call);

  struct Fault {
    int function;
    unsigned long long first_call;
    cuda::CUresult result;
    unsigned long long remaining;
  };
  std::atomic<unsigned long long> counts_[kFunctionCount] = {};
  std::atomic<bool> armed_{false};
  std::mutex mutex_;
  std::vector<Fault> faults_;          // inject()'s
  std::vector<Fault> process_faults_;  // CUEMM_SIM_FAULTS's
};

}  // namespace cuemm::sim

#define SIM_ENTER(name)                                                                       \
  const ::cuemm::sim::DriverCall sim_driver_call;                                             \
  do {                                                                                        \
    if (const ::cuemm::cuda::CUresult injected =                                              \
            ::cuemm::sim::CallLog::instance().enter(::cuemm::sim::Fn::name))                  \
      return injected;                                                                        \
  } while (0)
