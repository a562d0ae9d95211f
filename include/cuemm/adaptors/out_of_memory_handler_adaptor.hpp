// cuemm/adaptors/out_of_memory_handler_adaptor.hpp: free memory elsewhere
// when the manager runs out, and try again.
//
// Another library's cache (PyTorch's, CuPy's), a program's own caches or
// garbage not yet collected may hold the memory an allocation needs. On
// OutOfMemory from the manager it wraps (the device's, a limit's, pinned host
// memory's), this adaptor calls the handler, which may let go of such memory,
// and asks again while the handler returns true:
//
//   auto handled = std::make_unique<cuemm::OutOfMemoryHandlerAdaptor>(
//       context, std::move(pool), [&](const cuemm::OutOfMemory& error, int attempt) {
//         return attempt == 1 && my_cache.drop_all() > 0;
//       });
//
// The handler runs on the allocating thread, outside every lock of cuemm's
// (other threads allocate meanwhile), though inside the allocation of any
// adaptor stacked above this one: it must not reset() those. An allocation that runs out inside the
// handler, on the same thread, fails without calling it again. A handler that
// throws fails the allocation with its exception; one that asks for more than
// kMostRetriesAfterOutOfMemory retries fails it with OutOfMemory.
#pragma once

#include <functional>

#include "cuemm/adaptors/manager_adaptor.hpp"
#include "cuemm/error.hpp"

namespace cuemm {

// `attempt`: 1 after the first failure, 2 after the retry it asked for, ...
using OutOfMemoryHandler = std::function<bool(const OutOfMemory& error, int attempt)>;

// The most retries a handler gets for one allocation: where it asks for more,
// the allocation fails with OutOfMemory saying so, rather than looping forever
// on memory that does not come back (a handler that always returns true).
inline constexpr int kMostRetriesAfterOutOfMemory = 100;

// Where a handler asked to retry after its `attempt`: throws that OutOfMemory
// once the retries are spent. (The Python bridge's handler too.)
void throw_if_no_retry_is_left(const OutOfMemory& error, int attempt);

class OutOfMemoryHandlerAdaptor : public ManagerAdaptor {
 public:
  OutOfMemoryHandlerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                            OutOfMemoryHandler handler);
};

}  // namespace cuemm
