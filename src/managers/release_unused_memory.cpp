#include "cuemm/managers/release_unused_memory.hpp"

#include "cuemm/adaptors/manager_adaptor.hpp"
#include "cuemm/managers/async_memory_manager.hpp"
#include "cuemm/managers/pool_memory_manager.hpp"

namespace cuemm {

ReleasedMemory release_unused_memory(BaseMemoryManager& manager) {
  ReleasedMemory released;
  auto* host_only = find_adaptor<HostOnlyMemoryManager>(manager);
  if (!host_only) return released;
  PendingDeallocations& pending = host_only->deallocations();
  if (pending.is_deferred()) return released;  // a defer_cleanup() guard lives
  // The deferred frees first: what they return to a pool is then free for the
  // pool to release too.
  const std::size_t pending_bytes = pending.pending_bytes();
  released.deferred_frees = pending.flush();
  if (released.deferred_frees > 0) {
    const std::size_t left = pending.pending_bytes();  // (others may have queued meanwhile)
    released.deferred_bytes = pending_bytes > left ? pending_bytes - left : 0;
  }
  if (auto* pool = dynamic_cast<PoolMemoryManager*>(host_only)) released.device_bytes = pool->trim();
  if (auto* async = dynamic_cast<AsyncMemoryManager*>(host_only)) released.device_bytes = async->trim();
  if (PinnedHostPool* host_pool = host_only->pinned_host_pool()) released.pinned_host_bytes = host_pool->trim();
  return released;
}

}  // namespace cuemm
