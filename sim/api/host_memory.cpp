// sim/api/host_memory.cpp: the simulated driver's page-locked host memory:
// allocated, registered, pointer attributes.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

namespace {
CUresult host_alloc(Fn entry, void** pointer, std::size_t size, unsigned flags) {
  SIM_BEGIN_AS(entry);
  SIM_CONTEXT();
  if (!pointer || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0) {  // (the H100's driver: success and a null pointer, which cuMemFreeHost takes)
    *pointer = nullptr;
    return CUDA_SUCCESS;
  }
  const std::size_t length = cuemm::util::round_up(size, page_size());
  void* memory = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation allocation;
  allocation.base = reinterpret_cast<std::uintptr_t>(memory);
  allocation.size = size;
  allocation.kind = AllocationKind::PinnedHost;
  allocation.context = context;
  allocation.device = context->device->ordinal;
  allocation.flags = flags;
  allocation.mapping_size = length;
  s.allocations.emplace(allocation.base, allocation);
  *pointer = memory;
  return CUDA_SUCCESS;
}

// Whether [base, base + size) lies in the process's mappings, readable, and
// writable unless `read_only` (CU_MEMHOSTREGISTER_READ_ONLY). The H100's
// driver refuses the others with CUDA_ERROR_INVALID_VALUE
// (bench/probes/probe_host_register.cpp): past a mapping's end, across an
// unmapped hole, read-only or inaccessible pages.
bool registrable(std::uintptr_t base, std::size_t size, bool read_only) {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return true;  // (nothing to check against)
  std::uintptr_t covered = base;  // everything below it is checked
  const std::uintptr_t end = base + size;
  char line[512];
  while (covered < end && std::fgets(line, sizeof line, maps)) {
    unsigned long start = 0, stop = 0;
    char permissions[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &start, &stop, permissions) != 3) continue;
    if (stop <= covered) continue;
    if (start > covered) break;  // a hole (the lines are in address order)
    if (permissions[0] != 'r' || (!read_only && permissions[1] != 'w')) break;
    covered = stop;
  }
  std::fclose(maps);
  return covered >= end;
}
}  // namespace

SIM_EXPORT CUresult cuMemHostAlloc(void** pointer, std::size_t size, unsigned flags) {
  return host_alloc(Fn::cuMemHostAlloc, pointer, size, flags);
}
SIM_EXPORT CUresult cuMemAllocHost_v2(void** pointer, std::size_t size) {
  return host_alloc(Fn::cuMemAllocHost, pointer, size, 0);
}

SIM_EXPORT CUresult cuMemFreeHost(void* pointer) {
  SIM_BEGIN(cuMemFreeHost);
  if (!pointer) return CUDA_SUCCESS;
  auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == s.allocations.end() || it->second.kind != AllocationKind::PinnedHost)
    return CUDA_ERROR_INVALID_VALUE;
  // It waits for the device, as cuMemFree does (measured on the H100: 50 ms
  // behind a 50 ms kernel on any stream; bench/probes/probe_free_stall.cpp).
  synchronize_context(lock, it->second.context);
  it = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));  // (unlocked meanwhile)
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  release_allocation(s, it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostRegister_v2(void* pointer, std::size_t size, unsigned flags) {
  SIM_BEGIN(cuMemHostRegister);
  SIM_CONTEXT();
  if (!pointer || size == 0 || (flags & ~0xFu)) return CUDA_ERROR_INVALID_VALUE;
  const auto base = reinterpret_cast<std::uintptr_t>(pointer);
  const bool read_only = flags & CU_MEMHOSTREGISTER_READ_ONLY;
  if (size > UINTPTR_MAX - base || !registrable(base, size, read_only)) return CUDA_ERROR_INVALID_VALUE;
  // Overlap with anything already page-locked: check both neighbours.
  auto next = s.allocations.lower_bound(base);
  if (next != s.allocations.end() && next->first < base + size)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (s.find(base)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Allocation allocation;
  allocation.base = base;
  allocation.size = size;
  allocation.kind = AllocationKind::RegisteredHost;
  allocation.context = context;
  allocation.device = context->device->ordinal;
  allocation.flags = flags;
  s.allocations.emplace(base, allocation);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostUnregister(void* pointer) {
  SIM_BEGIN(cuMemHostUnregister);
  auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == s.allocations.end() || it->second.kind != AllocationKind::RegisteredHost)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  release_allocation(s, it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* device_pointer, void* host_pointer,
                                                 unsigned flags) {
  SIM_BEGIN(cuMemHostGetDevicePointer);
  if (!device_pointer || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Allocation* allocation = s.find(reinterpret_cast<std::uintptr_t>(host_pointer));
  // With unified addressing every cuMemHostAlloc block is mapped; registered
  // memory only when registered with DEVICEMAP.
  const bool mapped = allocation && (allocation->kind == AllocationKind::PinnedHost ||
                                     (allocation->kind == AllocationKind::RegisteredHost &&
                                      (allocation->flags & CU_MEMHOSTREGISTER_DEVICEMAP)));
  if (!mapped) return CUDA_ERROR_INVALID_VALUE;
  *device_pointer = reinterpret_cast<CUdeviceptr>(host_pointer);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostGetFlags(unsigned* flags, void* pointer) {
  SIM_BEGIN(cuMemHostGetFlags);
  Allocation* allocation = s.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (!flags || !allocation || allocation->kind != AllocationKind::PinnedHost)
    return CUDA_ERROR_INVALID_VALUE;
  *flags = allocation->flags;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr pointer) {
  SIM_BEGIN(cuPointerGetAttribute);
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  Allocation* allocation = s.find(pointer);
  if (!allocation) return CUDA_ERROR_INVALID_VALUE;
  const bool host = allocation->kind == AllocationKind::PinnedHost ||
                    allocation->kind == AllocationKind::RegisteredHost;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(allocation->context);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<CUdeviceptr*>(data) = pointer;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = allocation->kind == AllocationKind::Managed ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = allocation->device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = allocation->base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(data) = allocation->size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
