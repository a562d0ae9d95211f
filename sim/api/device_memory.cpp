// sim/api/device_memory.cpp: the simulated driver's cuMemAlloc, managed memory,
// cuMemFree, address ranges, memory info.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

SIM_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  SIM_BEGIN(cuMemGetInfo);
  SIM_CONTEXT();
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  *total = context->device->capacity;
  *free = context->device->capacity - context->device->used;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* pointer, std::size_t size) {
  SIM_BEGIN(cuMemAlloc);
  SIM_CONTEXT();
  if (!pointer || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  return allocate_device_memory(s, context, size, AllocationKind::Device, 0, pointer);
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* pointer, std::size_t size, unsigned flags) {
  SIM_BEGIN(cuMemAllocManaged);
  SIM_CONTEXT();
  if (!pointer || size == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  return allocate_device_memory(s, context, size, AllocationKind::Managed, flags, pointer);
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer) {
  SIM_BEGIN(cuMemFree);
  // Like the real driver (unified addressing), the pointer names its context:
  // no context needs to be current.
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || (it->second.kind != AllocationKind::Device &&
                                    it->second.kind != AllocationKind::Managed && !it->second.pool_import))
    return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  Context* context = it->second.context;
  // cuMemFree waits for the device, as on a GPU: pending work may still use it.
  synchronize_context(lock, context);
  it = s.allocations.find(pointer);  // the table may have changed while unlocked
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  release_allocation(s, it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size, CUdeviceptr pointer) {
  SIM_BEGIN(cuMemGetAddressRange);
  Allocation* allocation = s.find(pointer);
  if (!allocation) return CUDA_ERROR_NOT_FOUND;
  // A stream-ordered pool's block answers its own start and size, as on the
  // H100 (bench/probes/probe_pool_reserve.cpp, part 6).
  if (base) *base = allocation->base;
  if (size) *size = allocation->size;
  return CUDA_SUCCESS;
}
