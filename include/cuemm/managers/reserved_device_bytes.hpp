// cuemm/managers/reserved_device_bytes.hpp: what the pooling manager in a
// chain of adaptors holds from the driver, for reports of reserved against
// live bytes (StatisticsAdaptor, `cuemm replay`).
//
// The pool counts its segments; the async manager asks its driver pool
// (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), which keeps freed blocks until
// trimmed. Other managers (default, an external plugin) pool nothing of
// their own, or nothing cuemm can see: for them this says so, and each
// caller falls back on what it can count itself.
#pragma once

#include <cstddef>
#include <optional>

namespace cuemm {

class BaseMemoryManager;

// The device bytes the first PoolMemoryManager or AsyncMemoryManager under
// `manager` (itself included) holds from the driver; empty where there is
// neither. Thread-safe.
std::optional<std::size_t> reserved_device_bytes(BaseMemoryManager& manager);

}  // namespace cuemm
