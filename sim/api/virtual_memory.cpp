// sim/api/virtual_memory.cpp: the simulated driver's reserved addresses and
// physical handles (cuMemCreate, cuMemMap, ...).
#include "../driver_internals.hpp"

using namespace cuemm::sim;

// Reserved addresses are PROT_NONE host mappings; cuMemCreate takes a range of
// the device's arena; cuMemMap maps that range of the arena's memfd over the
// reserved addresses, so mapped memory is device memory like any other.

namespace {
constexpr std::size_t kVirtualGranularity = kDevicePage;

bool supports_virtual_memory(const Device& device) {
  return attribute_value(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
}

bool is_device_property(State& s, const CUmemAllocationProp* properties) {
  return properties && properties->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         properties->location.type == CU_MEM_LOCATION_TYPE_DEVICE && device_at(s, properties->location.id);
}

// Whether [pointer, pointer + bytes) lies inside one reservation.
bool is_reserved(State& s, std::uintptr_t pointer, std::size_t bytes) {
  auto it = s.reservations.upper_bound(pointer);
  if (it == s.reservations.begin()) return false;
  --it;
  return pointer >= it->first && pointer + bytes <= it->first + it->second;
}
}  // namespace

SIM_EXPORT CUresult cuMemGetAllocationGranularity(std::size_t* granularity, const CUmemAllocationProp* properties,
                                                   int option) {
  SIM_BEGIN(cuMemGetAllocationGranularity);
  (void)option;
  if (!granularity || !is_device_property(s, properties)) return CUDA_ERROR_INVALID_VALUE;
  if (!supports_virtual_memory(*s.devices[properties->location.id])) return CUDA_ERROR_NOT_SUPPORTED;
  *granularity = kVirtualGranularity;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* pointer, std::size_t bytes, std::size_t alignment,
                                        CUdeviceptr hint, unsigned long long flags) {
  SIM_BEGIN(cuMemAddressReserve);
  (void)hint;
  if (!pointer || bytes == 0 || bytes % kVirtualGranularity || flags != 0 ||
      (alignment && (alignment & (alignment - 1))))
    return CUDA_ERROR_INVALID_VALUE;
  alignment = std::max(alignment, kVirtualGranularity);
  const std::size_t span = bytes + alignment;
  void* mapping = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto start = reinterpret_cast<std::uintptr_t>(mapping);
  const std::uintptr_t base = cuemm::util::round_up(start, alignment);
  if (base > start) munmap(mapping, base - start);
  if (start + span > base + bytes) munmap(reinterpret_cast<void*>(base + bytes), start + span - base - bytes);
  s.reservations.emplace(base, bytes);
  *pointer = base;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr pointer, std::size_t bytes) {
  SIM_BEGIN(cuMemAddressFree);
  auto it = s.reservations.find(pointer);
  if (it == s.reservations.end() || it->second != bytes) return CUDA_ERROR_INVALID_VALUE;
  auto mapped = s.allocations.lower_bound(pointer);
  if (mapped != s.allocations.end() && mapped->first < pointer + bytes) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  munmap(reinterpret_cast<void*>(pointer), bytes);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t bytes,
                                const CUmemAllocationProp* properties, unsigned long long flags) {
  SIM_BEGIN(cuMemCreate);
  if (!handle || bytes == 0 || bytes % kVirtualGranularity || flags != 0 || !is_device_property(s, properties) ||
      (properties->requested_handle_types & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;  // (Linux has no other handle type)
  Device& device = *s.devices[properties->location.id];
  if (!supports_virtual_memory(device)) return CUDA_ERROR_NOT_SUPPORTED;
  if (!ensure_arena(device) || !make_room(s, device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto offset = device.ranges->allocate_aligned(bytes, kVirtualGranularity);  // mmap wants page offsets
  if (!offset) return CUDA_ERROR_OUT_OF_MEMORY;
  PhysicalMemory physical{device.ordinal, *offset, bytes};
  if (properties->requested_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    physical.fd = memfd_create("cuemm-sim-shareable", MFD_CLOEXEC);
    if (physical.fd < 0 || ftruncate(physical.fd, static_cast<off_t>(bytes)) != 0) {
      if (physical.fd >= 0) close(physical.fd);
      device.ranges->release(*offset, bytes);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  device.used += bytes;
  const std::uint64_t id = s.next_physical_handle++;
  s.physical.emplace(id, physical);
  *handle = id;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle, int type,
                                                 unsigned long long flags) {
  SIM_BEGIN(cuMemExportToShareableHandle);
  auto physical = s.physical.find(handle);
  if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || physical == s.physical.end() ||
      physical->second.released)
    return CUDA_ERROR_INVALID_VALUE;
  if (physical->second.fd < 0 || physical->second.imported) return CUDA_ERROR_INVALID_VALUE;  // not created shareable
  const int fd = fcntl(physical->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* shareable, int type) {
  SIM_BEGIN(cuMemImportFromShareableHandle);
  SIM_CONTEXT();  // (the simulated descriptor does not say its device: the importer's is taken)
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(static_cast<int>(reinterpret_cast<std::intptr_t>(shareable)), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  struct stat status {};
  if (fstat(fd, &status) != 0 || status.st_size <= 0 || status.st_size % kVirtualGranularity) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  PhysicalMemory physical{context->device->ordinal, 0, static_cast<std::size_t>(status.st_size)};
  physical.fd = fd;
  physical.imported = true;
  const std::uint64_t id = s.next_physical_handle++;
  s.physical.emplace(id, physical);
  *handle = id;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIM_BEGIN(cuMemRelease);
  auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  if (it->second.mappings == 0) release_physical(s, it);
  return CUDA_SUCCESS;
}

// Maps the whole of a handle's memory (offset 0): all cuemm asks for.
SIM_EXPORT CUresult cuMemMap(CUdeviceptr pointer, std::size_t bytes, std::size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  SIM_BEGIN(cuMemMap);
  auto physical = s.physical.find(handle);
  if (physical == s.physical.end() || physical->second.released || offset != 0 || flags != 0 ||
      bytes != physical->second.size || pointer % kVirtualGranularity || !is_reserved(s, pointer, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  auto next = s.allocations.lower_bound(pointer);
  if ((next != s.allocations.end() && next->first < pointer + bytes) || s.find(pointer))
    return CUDA_ERROR_INVALID_VALUE;  // already mapped
  Device& device = *s.devices[physical->second.device];
  const bool own_memory = physical->second.fd >= 0;
  void* mapped = mmap(reinterpret_cast<void*>(pointer), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED,
                      own_memory ? physical->second.fd : device.memfd,
                      own_memory ? 0 : static_cast<off_t>(physical->second.arena_offset));
  if (mapped == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation allocation;
  allocation.base = pointer;
  allocation.size = bytes;
  allocation.kind = AllocationKind::VirtualMapping;
  allocation.context = current_context(s) ? current_context(s) : device.primary;
  allocation.device = device.ordinal;
  allocation.arena_offset = physical->second.arena_offset;
  allocation.arena_size = bytes;
  allocation.id = s.next_allocation_id++;
  allocation.physical = handle;
  ++physical->second.mappings;
  s.allocations.emplace(pointer, allocation);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr pointer, std::size_t bytes, const CUmemAccessDesc* descriptors,
                                   std::size_t count) {
  SIM_BEGIN(cuMemSetAccess);
  const Allocation* mapped = s.find(pointer, bytes);
  if (!descriptors || count == 0 || !mapped || mapped->kind != AllocationKind::VirtualMapping)
    return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descriptors[i].location.id;
    if (descriptors[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !device_at(s, device))
      return CUDA_ERROR_INVALID_DEVICE;
    if (device != mapped->device && !s.peer_access) return CUDA_ERROR_INVALID_DEVICE;  // no peer-to-peer path
  }
  // The devices whose kernels may use each mapping in the range (checked at launch).
  for (auto it = s.allocations.find(mapped->base); it != s.allocations.end() && it->first < pointer + bytes; ++it) {
    for (std::size_t i = 0; i < count; ++i) {
      if (descriptors[i].flags == 0)
        it->second.granted.erase(descriptors[i].location.id);
      else
        it->second.granted.insert(descriptors[i].location.id);
    }
  }
  const int protection = descriptors[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                         : descriptors[0].flags == 0x1                               ? PROT_READ
                                                                                     : PROT_NONE;
  mprotect(reinterpret_cast<void*>(pointer), bytes, protection);
  return CUDA_SUCCESS;
}

// Unmaps whole mappings only, one or several side by side.
SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr pointer, std::size_t bytes) {
  SIM_BEGIN(cuMemUnmap);
  std::uintptr_t end = pointer;
  for (auto it = s.allocations.find(pointer); end < pointer + bytes; it = s.allocations.find(end)) {
    if (it == s.allocations.end() || it->second.kind != AllocationKind::VirtualMapping) return CUDA_ERROR_INVALID_VALUE;
    end += it->second.size;
  }
  if (end != pointer + bytes) return CUDA_ERROR_INVALID_VALUE;
  for (auto it = s.allocations.find(pointer); it != s.allocations.end() && it->first < end;) {
    auto next = std::next(it);
    release_allocation(s, it);
    it = next;
  }
  return CUDA_SUCCESS;
}
