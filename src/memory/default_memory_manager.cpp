#include "cuemm/memory/default_memory_manager.hpp"

#include <algorithm>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "util/hex_address.hpp"

namespace cuemm {

std::shared_ptr<MemoryPointer> DefaultMemoryManager::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  Context& ctx = context();
  ScopedContext scope(ctx);
  const cuda::CUdeviceptr pointer = with_flush_and_retry(
      [&] {
        cuda::CUdeviceptr allocated = 0;
        CUEMM_CU_ALLOC(size, cuMemAlloc, &allocated, size);
        return allocated;
      },
      [&] { return OutOfMemory("cuMemAlloc", size, describe_device_memory(ctx)); });
  return track_new(pointer, size, [pointer] { CUEMM_CU(cuMemFree, pointer); }, Release::deferred,
                   [&](Finalizer finalizer) {
                     return std::make_shared<MemoryPointer>(&ctx, pointer, size, nullptr, std::move(finalizer));
                   });
}

IpcHandle DefaultMemoryManager::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  return export_device_memory(context(), memory);
}

MemoryInfo DefaultMemoryManager::get_memory_info() { return driver_memory_info(context()); }

MemoryInfo driver_memory_info(Context& context) {
  ScopedContext scope(context);
  MemoryInfo info;
  CUEMM_CU(cuMemGetInfo, &info.free, &info.total);
  return info;
}

std::string describe_device_memory(Context& context) noexcept {
  try {
    const MemoryInfo device = driver_memory_info(context);
    return "the device has " + describe_bytes(device.free) + " free of " + describe_bytes(device.total);
  } catch (...) {
    return {};
  }
}

MemoryInfo within_cap(MemoryInfo info, std::size_t cap, std::size_t left) {
  info.total = std::min(info.total, cap);
  info.free = std::min({info.free, left, info.total});
  return info;
}

void require_device_memory_to_export(const std::shared_ptr<MemoryPointer>& memory) {
  if (!memory) throw InvalidArgument("get_ipc_handle: the memory pointer is null");
  if (memory->kind() != MemoryKind::Device)
    throw InvalidArgument(std::string("get_ipc_handle: only device memory can be exported (got ") +
                          to_string(memory->kind()) + " memory)");
  // (Its bytes may be another block's by now: another process would read those.)
  if (!memory->is_alive())
    throw StateError("get_ipc_handle: the device memory at " + util::hex_address(memory->device_pointer()) + " (" +
                     std::to_string(memory->size()) + " bytes) was already freed");
}

cuda::CUdeviceptr allocation_base_to_export(Context& context, const std::shared_ptr<MemoryPointer>& memory) {
  require_device_memory_to_export(memory);
  ScopedContext scope(context);
  cuda::CUdeviceptr base = 0;
  std::size_t extent = 0;
  const cuda::CUresult found = CUEMM_CU_RESULT(cuMemGetAddressRange, &base, &extent, memory->device_pointer());
  if (found != cuda::CUDA_SUCCESS) {
    throw CudaError(found, "cuMemGetAddressRange",
                    "get_ipc_handle: " + util::hex_address(memory->device_pointer()) +
                        " is not device memory of this context");
  }
  return base;
}

IpcHandle export_device_memory(Context& context, const std::shared_ptr<MemoryPointer>& memory) {
  const cuda::CUdeviceptr base = allocation_base_to_export(context, memory);
  ScopedContext scope(context);
  cuda::CUipcMemHandle handle{};
  CUEMM_CU(cuIpcGetMemHandle, &handle, base);
  return IpcHandle(memory, handle, memory->size(), context.device().identity(),
                   static_cast<std::size_t>(memory->device_pointer() - base));
}

}  // namespace cuemm
