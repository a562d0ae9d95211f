#include "cuemm/managers/reserved_device_bytes.hpp"

#include "cuemm/adaptors/manager_adaptor.hpp"
#include "cuemm/managers/async_memory_manager.hpp"
#include "cuemm/managers/pool_memory_manager.hpp"

namespace cuemm {

std::optional<std::size_t> reserved_device_bytes(BaseMemoryManager& manager) {
  if (auto* pool = find_adaptor<PoolMemoryManager>(manager)) return pool->statistics().reserved_bytes;
  if (auto* async = find_adaptor<AsyncMemoryManager>(manager))
    return static_cast<std::size_t>(async->statistics().reserved_bytes);
  return std::nullopt;
}

}  // namespace cuemm
