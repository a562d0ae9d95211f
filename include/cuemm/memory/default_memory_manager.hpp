// cuemm/memory/default_memory_manager.hpp: Numba's own memory management.
//
// Device memory straight from cuMemAlloc; frees deferred and flushed in
// batches (see HostOnlyMemoryManager's DeallocationPolicy); an out-of-memory
// error flushes the pending frees and retries once. This is the manager a
// context gets when no other is chosen (CUEMM_MEMORY_MANAGER=default).
//
// defer_cleanup(): while a guard lives, no pending free of any kind runs, not
// even on out-of-memory (as in Numba).
#pragma once

#include <string>

#include "cuemm/memory/host_only_memory_manager.hpp"

namespace cuemm {

class DefaultMemoryManager : public HostOnlyMemoryManager {
 public:
  using HostOnlyMemoryManager::HostOnlyMemoryManager;

  std::shared_ptr<MemoryPointer> memalloc(std::size_t size) override;
  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) override;
  MemoryInfo get_memory_info() override;
};

// The IPC handle of device memory from any manager: the driver handle of the
// allocation that contains it, with the memory's offset inside it.
IpcHandle export_device_memory(Context& context, const std::shared_ptr<MemoryPointer>& memory);
// For get_ipc_handle: InvalidArgument for a null or non-device pointer.
void require_device_memory_to_export(const std::shared_ptr<MemoryPointer>& memory);
// The start of the driver allocation that holds `memory` (checked as above),
// CudaError naming the address when the driver does not know it. Makes
// `context` current. (Not for stream-ordered pool memory, which the driver
// answers with 0.)
cuda::CUdeviceptr allocation_base_to_export(Context& context, const std::shared_ptr<MemoryPointer>& memory);

// The driver's free and total device memory, as seen from `context`.
MemoryInfo driver_memory_info(Context& context);
// "the device has 1.00 GiB (...) free of 80.00 GiB (...)", for out-of-memory
// errors: whether others hold the memory. Empty where the query fails, which
// must not replace the error it would explain.
std::string describe_device_memory(Context& context) noexcept;
// `info` as a manager held to `cap` bytes reports it, `left` of them still to
// be had (programs size their work by it): total at most the cap, free at
// most what is left.
MemoryInfo within_cap(MemoryInfo info, std::size_t cap, std::size_t left);

}  // namespace cuemm
