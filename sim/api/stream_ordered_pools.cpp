// sim/api/stream_ordered_pools.cpp: the simulated driver's memory pools,
// cuMemAllocFromPoolAsync/cuMemFreeAsync, pools shared between processes.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

namespace {
constexpr std::uint64_t kReserveStep = 32u << 20;  // the H100's pool reserves and trims in these

MemoryPool* find_pool(State& s, CUmemoryPool handle) {
  auto it = s.pools.find(reinterpret_cast<MemoryPool*>(handle));
  return it == s.pools.end() || it->second->destroyed ? nullptr : it->second.get();
}

// Reserves what a block of `rounded` bytes needs beyond the pool's kept
// bytes: a step of 32 MiB, or pages where the device has no room for a step,
// the memory other pools keep taken back where needed.
bool reserve_for(State& s, MemoryPool& pool, std::uint64_t rounded) {
  const std::uint64_t kept = pool.reserved - pool.used;
  if (kept >= rounded) return true;
  Device& device = *s.devices[pool.device];
  std::uint64_t growth = cuemm::util::round_up(rounded - kept, kReserveStep);
  if (device.capacity - device.used < growth) growth = cuemm::util::round_up(rounded - kept, kDevicePage);
  if (!make_room(s, device, growth, &pool)) return false;
  device.used += growth;
  pool.reserved += growth;
  pool.reserved_high = std::max(pool.reserved_high, pool.reserved);
  return true;
}

CUresult allocate_from_pool(State& s, Context* context, MemoryPool& pool, std::size_t size, CUdeviceptr* pointer) {
  const std::size_t rounded = cuemm::util::round_up(size, kDeviceAlignment);
  if (rounded < size || !reserve_for(s, pool, rounded)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (const CUresult result = place_device_memory(s, context, size, rounded, AllocationKind::Device, 0, pointer)) return result;
  s.allocations.at(*pointer).pool = &pool;
  pool.used += rounded;
  pool.used_high = std::max(pool.used_high, pool.used);
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* out, const CUmemPoolProps* properties) {
  SIM_BEGIN(cuMemPoolCreate);
  if (!out || !properties || properties->alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      properties->location.type != CU_MEM_LOCATION_TYPE_DEVICE || (properties->handle_types & ~0x1))
    return CUDA_ERROR_INVALID_VALUE;
  const Device* device = device_at(s, properties->location.id);
  if (!device) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute_value(*device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) return CUDA_ERROR_NOT_SUPPORTED;
  auto pool = std::make_unique<MemoryPool>();
  pool->device = properties->location.id;
  pool->handle_types = properties->handle_types;
  *out = reinterpret_cast<CUmemoryPool>(pool.get());
  s.pools.emplace(pool.get(), std::move(pool));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool handle) {
  SIM_BEGIN(cuMemPoolDestroy);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  pool->destroyed = true;  // as on a GPU: outstanding blocks stay valid until freed
  trim_pool(s, *pool, 0);
  forget_pool_if_done(s, pool);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool handle, int attribute, void* value) {
  SIM_BEGIN(cuMemPoolSetAttribute);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool || !value) return CUDA_ERROR_INVALID_VALUE;
  auto& number = *static_cast<std::uint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = number; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (number != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->used_high = pool->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (number != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->reserved_high = pool->reserved;
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool handle, int attribute, void* value) {
  SIM_BEGIN(cuMemPoolGetAttribute);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool || !value) return CUDA_ERROR_INVALID_VALUE;
  auto& number = *static_cast<std::uint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: number = pool->release_threshold; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: number = pool->reserved; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: number = pool->used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: number = pool->reserved_high; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: number = pool->used_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool handle, const CUmemAccessDesc* descriptors, std::size_t count) {
  SIM_BEGIN(cuMemPoolSetAccess);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool || !descriptors || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descriptors[i].location.id;
    if (descriptors[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !device_at(s, device))
      return CUDA_ERROR_INVALID_DEVICE;
    if (device == pool->device && descriptors[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;  // the pool's own device keeps its access
    if (device != pool->device && !s.peer_access) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descriptors[i].location.id;
    if (device == pool->device) continue;
    if (descriptors[i].flags == 0)
      pool->peers_granted.erase(device);
    else
      pool->peers_granted.insert(device);
  }
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool handle, std::size_t keep) {
  SIM_BEGIN(cuMemPoolTrimTo);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  // In steps: the H100 kept 128 MiB of 1 GiB for 100 MiB asked, 320 for 300.
  if (keep < pool->reserved) trim_pool(s, *pool, cuemm::util::round_up(keep, kReserveStep));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* pointer, std::size_t size, CUmemoryPool handle,
                                            CUstream stream_handle) {
  SIM_BEGIN(cuMemAllocFromPoolAsync);
  SIM_CONTEXT();
  MemoryPool* pool = find_pool(s, handle);
  if (!pointer || size == 0 || !pool) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, stream_handle);
  if (const CUresult refused = refuse_on_a_capturing_stream(s, stream)) return refused;
  if (pool->device != context->device->ordinal) return CUDA_ERROR_INVALID_DEVICE;
  if (pool->imported_fd >= 0) return CUDA_ERROR_INVALID_VALUE;  // imported pools hand out nothing
  // Allocated at once: at least as ordered as the stream asks. A real pool
  // reuses what streams freed earlier, in stream order; here that memory
  // comes back when the queued frees have run, so wait for them.
  // (Other threads may take what the wait gave back: try a few times.)
  CUresult result = allocate_from_pool(s, context, *pool, size, pointer);
  for (int attempt = 0; attempt < 16 && result == CUDA_ERROR_OUT_OF_MEMORY; ++attempt) {
    synchronize_context(lock, context);
    pool = find_pool(s, handle);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;  // destroyed meanwhile
    result = allocate_from_pool(s, context, *pool, size, pointer);
  }
  return result;
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream_handle) {
  SIM_BEGIN(cuMemFreeAsync);
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || it->second.kind != AllocationKind::Device) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, stream_handle);
  if (const CUresult refused = refuse_on_a_capturing_stream(s, stream)) return refused;
  // On an idle stream the block goes back at once, as a real pool hands it
  // to the stream's next allocation: deferred, a replay without GPU work saw
  // every block freed since the worker last ran as still in use (28 times
  // the live bytes on a training log).
  // (A pool's block leaves its bytes to the pool: release_allocation.)
  if (would_run_at_once(stream)) {
    release_allocation(s, it);
    return CUDA_SUCCESS;
  }
  // Otherwise once the stream's earlier work is done.
  submit(stream, [pointer] {
    State& state_now = state();
    std::lock_guard freeing(state_now.mutex);
    auto found = state_now.allocations.find(pointer);
    if (found == state_now.allocations.end()) return;
    release_allocation(state_now, found);
  });
  return CUDA_SUCCESS;
}

// --- Stream-ordered pools shared between processes ----------------------------------
// The shareable handle is a descriptor of the exporting process's device
// memory (its memfd); a block's export data says where in it the block lies.

namespace {
constexpr std::uint32_t kPoolExportMagic = 0x58504d50;  // "PMPX"
struct PoolExportPayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t arena_offset;
  std::uint64_t size;
  std::uint64_t id;
};
static_assert(sizeof(PoolExportPayload) <= sizeof(CUmemPoolPtrExportData));
}  // namespace

SIM_EXPORT CUresult cuMemPoolExportToShareableHandle(void* handle, CUmemoryPool handle_of_pool, int type,
                                                     unsigned long long flags) {
  SIM_BEGIN(cuMemPoolExportToShareableHandle);
  MemoryPool* pool = find_pool(s, handle_of_pool);
  if (!handle || !pool || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(pool->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || pool->imported_fd >= 0)
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(s.devices[pool->device]->memfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(handle) = fd;
  pool->exported = true;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool* out, void* handle, int type,
                                                       unsigned long long flags) {
  SIM_BEGIN(cuMemPoolImportFromShareableHandle);
  SIM_CONTEXT();
  if (!out || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(static_cast<int>(reinterpret_cast<std::intptr_t>(handle)), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  auto pool = std::make_unique<MemoryPool>();
  pool->device = context->device->ordinal;
  pool->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  pool->imported_fd = fd;
  *out = reinterpret_cast<CUmemoryPool>(pool.get());
  s.pools.emplace(pool.get(), std::move(pool));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData* data, CUdeviceptr pointer) {
  SIM_BEGIN(cuMemPoolExportPointer);
  auto it = s.allocations.find(pointer);  // a block's start, as the driver wants
  // (The H100's driver exports no block of a pool before the pool itself.)
  if (!data || it == s.allocations.end() || !it->second.pool || !it->second.pool->exported)
    return CUDA_ERROR_INVALID_VALUE;
  const Allocation& allocation = it->second;
  const PoolExportPayload payload{kPoolExportMagic, static_cast<std::int32_t>(getpid()), allocation.device,
                                  allocation.arena_offset, allocation.size, allocation.id};
  std::memset(data->reserved, 0, sizeof data->reserved);
  std::memcpy(data->reserved, &payload, sizeof payload);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr* pointer, CUmemoryPool handle_of_pool,
                                           CUmemPoolPtrExportData* data) {
  SIM_BEGIN(cuMemPoolImportPointer);
  SIM_CONTEXT();
  MemoryPool* pool = find_pool(s, handle_of_pool);
  if (!pointer || !data || !pool || pool->imported_fd < 0) return CUDA_ERROR_INVALID_VALUE;
  PoolExportPayload payload;
  std::memcpy(&payload, data->reserved, sizeof payload);
  if (payload.magic != kPoolExportMagic) return CUDA_ERROR_INVALID_VALUE;
  if (payload.pid == getpid()) return CUDA_ERROR_INVALID_VALUE;  // a pool is imported by other processes
  Allocation* imported = map_exported_memory(s, context, pool->imported_fd, payload.arena_offset, payload.size,
                                             context->device->ordinal, payload.id, payload.pid);
  if (!imported) return CUDA_ERROR_INVALID_VALUE;
  imported->pool_import = true;
  *pointer = imported->base;
  return CUDA_SUCCESS;
}
