// sim/api/ipc.cpp: the simulated driver's cuIpcGetMemHandle and opening handles
// in another process.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

namespace {
// The 64 bytes of a simulated IPC handle.
struct IpcPayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t memfd;
  std::int32_t device;
  std::uint64_t arena_offset;
  std::uint64_t size;
  std::uint64_t id;
};
static_assert(sizeof(IpcPayload) <= kIpcHandleSize);
}  // namespace

SIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr pointer) {
  SIM_BEGIN(cuIpcGetMemHandle);
  SIM_CONTEXT();
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  Allocation* allocation = s.find(pointer);
  if (!allocation || allocation->kind != AllocationKind::Device) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload payload{kIpcMagic,
                     static_cast<std::int32_t>(getpid()),
                     s.devices[allocation->device]->memfd,
                     allocation->device,
                     allocation->arena_offset,
                     allocation->size,
                     allocation->id};
  std::memset(handle->reserved, 0, sizeof handle->reserved);
  std::memcpy(handle->reserved, &payload, sizeof payload);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pointer, CUipcMemHandle handle, unsigned flags) {
  SIM_BEGIN(cuIpcOpenMemHandle);
  SIM_CONTEXT();
  if (!pointer || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload payload;
  std::memcpy(&payload, handle.reserved, sizeof payload);
  if (payload.magic != kIpcMagic || !device_at(s, payload.device)) return CUDA_ERROR_INVALID_VALUE;
  if (payload.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // own handles cannot be opened
  if (payload.device != context->device->ordinal && !s.peer_access)
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  for (auto& [base, allocation] : s.allocations) {
    if (allocation.kind == AllocationKind::IpcMapping && allocation.exporter_pid == payload.pid &&
        allocation.id == payload.id) {
      ++allocation.ipc_opens;
      *pointer = base;
      return CUDA_SUCCESS;
    }
  }
  const std::string path = "/proc/" + std::to_string(payload.pid) + "/fd/" + std::to_string(payload.memfd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporting process is gone
  Allocation* opened =
      map_exported_memory(s, context, fd, payload.arena_offset, payload.size, payload.device, payload.id, payload.pid);
  close(fd);
  if (!opened) return CUDA_ERROR_MAP_FAILED;
  opened->ipc_opens = 1;
  *pointer = opened->base;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr pointer) {
  SIM_BEGIN(cuIpcCloseMemHandle);
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || it->second.kind != AllocationKind::IpcMapping || it->second.pool_import)
    return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.ipc_opens == 0) release_allocation(s, it);
  return CUDA_SUCCESS;
}
