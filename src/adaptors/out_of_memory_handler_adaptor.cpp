#include "cuemm/adaptors/out_of_memory_handler_adaptor.hpp"

#include <string>
#include <utility>

namespace cuemm {
namespace {

// Whether this thread is inside a handler already (see the header).
thread_local bool handling_out_of_memory = false;

class CallsHandler final : public AllocationObserver {
 public:
  explicit CallsHandler(OutOfMemoryHandler handler) : handler_(std::move(handler)) {}

  bool retry_after_out_of_memory(MemoryKind, const OutOfMemory& error, int attempt) override {
    if (handling_out_of_memory || !handler_) return false;
    handling_out_of_memory = true;
    struct Done {
      ~Done() { handling_out_of_memory = false; }
    } done;
    if (!handler_(error, attempt)) return false;
    throw_if_no_retry_is_left(error, attempt);
    return true;
  }
  // Counts nothing: no clock, no call site.
  bool wants_times_and_call_sites() const noexcept override { return false; }

 private:
  OutOfMemoryHandler handler_;
};

}  // namespace

void throw_if_no_retry_is_left(const OutOfMemory& error, int attempt) {
  if (attempt <= kMostRetriesAfterOutOfMemory) return;
  throw OutOfMemory(error.call(), error.requested(),
                    "the out-of-memory handler still asked to try again after " +
                        std::to_string(kMostRetriesAfterOutOfMemory) +
                        " retries, the most cuemm makes; the last failure: " + error.what());
}

OutOfMemoryHandlerAdaptor::OutOfMemoryHandlerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                                     OutOfMemoryHandler handler)
    : ManagerAdaptor(context, std::move(upstream), std::make_shared<CallsHandler>(std::move(handler))) {}

}  // namespace cuemm
