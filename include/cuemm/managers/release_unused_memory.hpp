// cuemm/managers/release_unused_memory.hpp: give cached memory back to the
// driver, whatever the manager and the adaptors around it.
//
// Pools keep freed memory for reuse; another library in the same process
// (PyTorch, CuPy, a second context) cannot have it until they let go. This is
// the one call that makes every bundled manager let go, as
// torch.cuda.empty_cache() and CuPy's free_all_blocks() do for theirs:
//   - the pool: its thread caches are emptied, blocks whose GPU work has
//     completed are reclaimed (waiting for the rest), and every entirely free
//     segment goes back (PoolMemoryManager::trim());
//   - the async manager: its driver pool is trimmed to what is in use, once
//     the frees queued on the legacy stream have run (AsyncMemoryManager::trim());
//   - the pinned host pool of either: its cached blocks and registrations;
//   - Numba's deferred frees (the default manager's, and host memory's under
//     any manager derived from HostOnlyMemoryManager) run now.
//
//   const cuemm::ReleasedMemory released = cuemm::release_unused_memory(context.memory_manager());
//   // released.device_bytes went back to the driver; cuMemAlloc elsewhere may now have them.
//
// Blocks still held are untouched. Under defer_cleanup() nothing is released
// (the guard's promise), and a manager this does not know (an external
// plugin) releases nothing: both report zeros.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuemm {

class BaseMemoryManager;

struct ReleasedMemory {
  std::uint64_t device_bytes = 0;       // cached device memory given back to the driver
  std::uint64_t pinned_host_bytes = 0;  // cached pinned host blocks and registrations freed
  std::size_t deferred_frees = 0;       // Numba-style deferred frees that ran now
  std::uint64_t deferred_bytes = 0;     // what they held, as the byte threshold counts it
};

// Thread-safe: other threads may allocate and free meanwhile.
ReleasedMemory release_unused_memory(BaseMemoryManager& manager);

}  // namespace cuemm
