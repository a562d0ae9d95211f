// cuemm/driver/cuda_api.hpp
//
// The part of the CUDA driver API that cuemm uses, declared by us so that
// building cuemm needs no CUDA toolkit. Types are ABI-identical to cuda.h;
// they live in cuemm::cuda so that including cuda.h as well causes no clash.
//
// CUEMM_DRIVER_FUNCTIONS is the single list of entry points: the loader
// resolves each one from libcuda (or the simulated driver) by the exported
// symbol names given, first match wins, and the simulated driver exports the
// same names. Numbers (enums, flags) are the driver's, taken from its docs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuemm::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUmemoryPool = struct CUmemPoolHandle_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

inline constexpr std::size_t kIpcHandleSize = 64;
struct CUipcMemHandle {
  char reserved[kIpcHandleSize];
};
struct CUuuid {
  char bytes[16];
};
using CUstreamCallback = void (*)(CUstream, CUresult, void*);

// Stream-ordered memory pools (CUDA 11.2+).
struct CUmemLocation {
  int type;  // CU_MEM_LOCATION_TYPE_*
  int id;
};
// Virtual memory management (CUDA 10.2+): reserve addresses, map physical memory into them.
using CUmemGenericAllocationHandle = unsigned long long;
struct CUmemAllocationProp {
  int type;                    // CU_MEM_ALLOCATION_TYPE_*
  int requested_handle_types;  // CU_MEM_HANDLE_TYPE_*
  CUmemLocation location;
  void* win32_handle_metadata;
  unsigned char compression_type;
  unsigned char gpu_direct_rdma_capable;
  unsigned short usage;
  unsigned char reserved[4];
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CU_MEM_ACCESS_FLAGS_PROT_*
};
inline constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;
struct CUmemPoolProps {
  int alloc_type;    // CU_MEM_ALLOCATION_TYPE_*
  int handle_types;  // CU_MEM_HANDLE_TYPE_* bits the pool's memory may be exported as
  CUmemLocation location;
  void* win32_security_attributes;
  std::size_t max_size;  // 0: the system's default
  unsigned short usage;
  unsigned char reserved[54];
};
static_assert(sizeof(CUmemPoolProps) == 88);
// What cuMemPoolExportPointer writes: names one block of an exported pool (not a handle: plain bytes).
struct CUmemPoolPtrExportData {
  unsigned char reserved[64];
};
static_assert(sizeof(CUmemAllocationProp) == 32 && sizeof(CUmemAccessDesc) == 12);
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;
inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
inline constexpr int CU_MEM_HANDLE_TYPE_NONE = 0x0;
inline constexpr int CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;
// CUmemPool_attribute values (their value type is std::uint64_t).
inline constexpr int CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4;
inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5;
inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8;

// CUresult values cuemm and the simulated driver use.
enum : CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_MAP_FAILED = 205,
  CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_FILE_NOT_FOUND = 301,
  CUDA_ERROR_OPERATING_SYSTEM = 304,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
  CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
  CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
  CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
  CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
  CUDA_ERROR_CAPTURED_EVENT = 907,
  CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
  CUDA_ERROR_UNKNOWN = 999,
};

// CUdevice_attribute values.
enum DeviceAttribute : int {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
  CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
  CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
  CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
  CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
  CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
  CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
  CU_DEVICE_ATTRIBUTE_MAX = 160,  // one past the largest value the simulated driver answers
};

// CUpointer_attribute values.
enum PointerAttribute : int {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
  CU_POINTER_ATTRIBUTE_MAPPED = 13,
};

// CUmemorytype values.
enum MemoryType : unsigned {
  CU_MEMORYTYPE_HOST = 1,
  CU_MEMORYTYPE_DEVICE = 2,
  CU_MEMORYTYPE_UNIFIED = 4,
};

// Flags.
inline constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x01;
inline constexpr unsigned CU_MEMHOSTALLOC_DEVICEMAP = 0x02;
inline constexpr unsigned CU_MEMHOSTALLOC_WRITECOMBINED = 0x04;
inline constexpr unsigned CU_MEMHOSTREGISTER_PORTABLE = 0x01;
inline constexpr unsigned CU_MEMHOSTREGISTER_DEVICEMAP = 0x02;
inline constexpr unsigned CU_MEMHOSTREGISTER_READ_ONLY = 0x08;
inline constexpr unsigned CU_MEM_ATTACH_GLOBAL = 0x1;
inline constexpr unsigned CU_MEM_ATTACH_HOST = 0x2;
inline constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1;
inline constexpr unsigned CU_STREAM_DEFAULT = 0x0;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
// CUstreamCaptureMode: what a capture forbids other calls (the driver's docs).
inline constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
inline constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
inline constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;
// CUstreamCaptureStatus (cuStreamIsCapturing).
inline constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
inline constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
inline constexpr int CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
inline constexpr unsigned CU_EVENT_DEFAULT = 0x0;
inline constexpr unsigned CU_EVENT_BLOCKING_SYNC = 0x1;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
inline const CUstream CU_STREAM_LEGACY = reinterpret_cast<CUstream>(0x1);
inline const CUstream CU_STREAM_PER_THREAD = reinterpret_cast<CUstream>(0x2);

// The handles that name a default stream: the legacy one (0 or
// CU_STREAM_LEGACY) or the calling thread's per-thread stream.
inline bool is_default_stream(CUstream stream) noexcept {
  return stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

}  // namespace cuemm::cuda

// X(name, "symbol|fallback symbol", (parameters))
// The name is how cuemm calls it; the symbols are what libcuda exports.
#define CUEMM_DRIVER_FUNCTIONS(X)                                                                   \
  X(cuInit, "cuInit", (unsigned flags))                                                            \
  X(cuDriverGetVersion, "cuDriverGetVersion", (int* version))                                      \
  X(cuGetErrorName, "cuGetErrorName", (CUresult error, const char** name))                         \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int* count))                                            \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice * device, int ordinal))                                  \
  X(cuDeviceGetName, "cuDeviceGetName", (char* name, int length, CUdevice device))                 \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", (int* value, int attribute, CUdevice device))    \
  X(cuDeviceGetUuid, "cuDeviceGetUuid_v2|cuDeviceGetUuid", (CUuuid * uuid, CUdevice device))       \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", (std::size_t * bytes, CUdevice device))               \
  X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", (int* can, CUdevice device, CUdevice peer))    \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * context, CUdevice device))  \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice device))                  \
  X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2", (CUdevice device))                      \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", (CUcontext * context))                                     \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext context))                                       \
  X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", (CUcontext context))                                  \
  X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", (CUcontext * context))                                  \
  X(cuCtxGetDevice, "cuCtxGetDevice", (CUdevice * device))                                         \
  X(cuCtxSynchronize, "cuCtxSynchronize", ())                                                      \
  X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", (CUcontext peer, unsigned flags))              \
  X(cuMemGetInfo, "cuMemGetInfo_v2", (std::size_t * free, std::size_t * total))                    \
  X(cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr * pointer, std::size_t bytes))                       \
  X(cuMemFree, "cuMemFree_v2", (CUdeviceptr pointer))                                              \
  X(cuMemAllocManaged, "cuMemAllocManaged", (CUdeviceptr * pointer, std::size_t bytes, unsigned flags)) \
  X(cuMemGetAddressRange, "cuMemGetAddressRange_v2",                                               \
    (CUdeviceptr * base, std::size_t * size, CUdeviceptr pointer))                                 \
  X(cuMemHostAlloc, "cuMemHostAlloc", (void** pointer, std::size_t bytes, unsigned flags))         \
  X(cuMemFreeHost, "cuMemFreeHost", (void* pointer))                                               \
  X(cuMemHostRegister, "cuMemHostRegister_v2", (void* pointer, std::size_t bytes, unsigned flags)) \
  X(cuMemHostUnregister, "cuMemHostUnregister", (void* pointer))                                   \
  X(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2",                                     \
    (CUdeviceptr * device_pointer, void* host_pointer, unsigned flags))                            \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr dst, const void* src, std::size_t bytes))        \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", (void* dst, CUdeviceptr src, std::size_t bytes))              \
  X(cuMemcpyDtoD, "cuMemcpyDtoD_v2", (CUdeviceptr dst, CUdeviceptr src, std::size_t bytes))        \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                                     \
    (CUdeviceptr dst, const void* src, std::size_t bytes, CUstream stream))                        \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                                                     \
    (void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream))                              \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                                                     \
    (CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream))                        \
  X(cuMemsetD8, "cuMemsetD8_v2", (CUdeviceptr dst, unsigned char value, std::size_t count))        \
  X(cuMemsetD8Async, "cuMemsetD8Async",                                                            \
    (CUdeviceptr dst, unsigned char value, std::size_t count, CUstream stream))                    \
  X(cuMemsetD32, "cuMemsetD32_v2", (CUdeviceptr dst, unsigned value, std::size_t count))           \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", (void* data, int attribute, CUdeviceptr pointer)) \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", (CUipcMemHandle * handle, CUdeviceptr pointer))        \
  X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2",                                                   \
    (CUdeviceptr * pointer, CUipcMemHandle handle, unsigned flags))                                \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", (CUdeviceptr pointer))                             \
  X(cuStreamCreate, "cuStreamCreate", (CUstream * stream, unsigned flags))                         \
  X(cuStreamDestroy, "cuStreamDestroy_v2", (CUstream stream))                                      \
  X(cuStreamSynchronize, "cuStreamSynchronize", (CUstream stream))                                 \
  X(cuStreamQuery, "cuStreamQuery", (CUstream stream))                                             \
  X(cuStreamGetCtx, "cuStreamGetCtx", (CUstream stream, CUcontext * context))                      \
  X(cuStreamGetId, "cuStreamGetId", (CUstream stream, unsigned long long* id))                     \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream stream, CUevent event, unsigned flags))      \
  X(cuStreamAddCallback, "cuStreamAddCallback",                                                    \
    (CUstream stream, CUstreamCallback callback, void* user_data, unsigned flags))                 \
  X(cuEventCreate, "cuEventCreate", (CUevent * event, unsigned flags))                             \
  X(cuEventDestroy, "cuEventDestroy_v2", (CUevent event))                                          \
  X(cuEventRecord, "cuEventRecord", (CUevent event, CUstream stream))                              \
  X(cuEventQuery, "cuEventQuery", (CUevent event))                                                 \
  X(cuEventSynchronize, "cuEventSynchronize", (CUevent event))                                     \
  X(cuCtxRecordEvent, "cuCtxRecordEvent", (CUcontext context, CUevent event))                      \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", (int* mode))           \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", (CUstream stream, int mode))                  \
  X(cuStreamEndCapture, "cuStreamEndCapture", (CUstream stream, CUgraph* graph))                   \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", (CUstream stream, int* status))                    \
  X(cuGraphInstantiate, "cuGraphInstantiateWithFlags",                                             \
    (CUgraphExec * exec, CUgraph graph, unsigned long long flags))                                 \
  X(cuGraphLaunch, "cuGraphLaunch", (CUgraphExec exec, CUstream stream))                           \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", (CUgraphExec exec))                                  \
  X(cuGraphDestroy, "cuGraphDestroy", (CUgraph graph))                                             \
  X(cuEventElapsedTime, "cuEventElapsedTime_v2|cuEventElapsedTime",                                \
    (float* milliseconds, CUevent start, CUevent end))                                             \
  X(cuModuleLoadDataEx, "cuModuleLoadDataEx",                                                      \
    (CUmodule * module, const void* image, unsigned num_options, int* options, void** values))     \
  X(cuModuleUnload, "cuModuleUnload", (CUmodule module))                                           \
  X(cuModuleGetFunction, "cuModuleGetFunction", (CUfunction * function, CUmodule module, const char* name)) \
  X(cuMemAddressReserve, "cuMemAddressReserve",                                                   \
    (CUdeviceptr * pointer, std::size_t bytes, std::size_t alignment, CUdeviceptr hint, unsigned long long flags)) \
  X(cuMemAddressFree, "cuMemAddressFree", (CUdeviceptr pointer, std::size_t bytes))                \
  X(cuMemCreate, "cuMemCreate",                                                                   \
    (CUmemGenericAllocationHandle * handle, std::size_t bytes, const CUmemAllocationProp* properties, \
     unsigned long long flags))                                                                    \
  X(cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle handle))                           \
  X(cuMemMap, "cuMemMap",                                                                         \
    (CUdeviceptr pointer, std::size_t bytes, std::size_t offset, CUmemGenericAllocationHandle handle, \
     unsigned long long flags))                                                                    \
  X(cuMemUnmap, "cuMemUnmap", (CUdeviceptr pointer, std::size_t bytes))                            \
  X(cuMemSetAccess, "cuMemSetAccess",                                                             \
    (CUdeviceptr pointer, std::size_t bytes, const CUmemAccessDesc* descriptors, std::size_t count)) \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",                               \
    (std::size_t * granularity, const CUmemAllocationProp* properties, int option))               \
  X(cuMemPoolCreate, "cuMemPoolCreate", (CUmemoryPool * pool, const CUmemPoolProps* properties))   \
  X(cuMemPoolDestroy, "cuMemPoolDestroy", (CUmemoryPool pool))                                     \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", (CUmemoryPool pool, int attribute, void* value)) \
  X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", (CUmemoryPool pool, int attribute, void* value)) \
  X(cuMemPoolTrimTo, "cuMemPoolTrimTo", (CUmemoryPool pool, std::size_t keep_bytes))               \
  X(cuMemPoolSetAccess, "cuMemPoolSetAccess",                                                     \
    (CUmemoryPool pool, const CUmemAccessDesc* descriptors, std::size_t count))                    \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync",                                            \
    (CUdeviceptr * pointer, std::size_t bytes, CUmemoryPool pool, CUstream stream))                \
  X(cuMemFreeAsync, "cuMemFreeAsync", (CUdeviceptr pointer, CUstream stream))                      \
  X(cuMemPoolExportToShareableHandle, "cuMemPoolExportToShareableHandle",                          \
    (void* handle, CUmemoryPool pool, int handle_type, unsigned long long flags))                  \
  X(cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle",                      \
    (CUmemoryPool * pool, void* handle, int handle_type, unsigned long long flags))                \
  X(cuMemPoolExportPointer, "cuMemPoolExportPointer", (CUmemPoolPtrExportData * data, CUdeviceptr pointer)) \
  X(cuMemPoolImportPointer, "cuMemPoolImportPointer",                                              \
    (CUdeviceptr * pointer, CUmemoryPool pool, CUmemPoolPtrExportData * data))                     \
  X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle",                                  \
    (void* shareable, CUmemGenericAllocationHandle handle, int handle_type, unsigned long long flags)) \
  X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle",                              \
    (CUmemGenericAllocationHandle * handle, void* shareable, int handle_type))                     \
  X(cuLaunchKernel, "cuLaunchKernel",                                                              \
    (CUfunction function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,     \
     unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void** params,    \
     void** extra))
