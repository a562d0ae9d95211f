#include "cuemm/adaptors/out_of_memory_handler_adaptor.hpp"

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
    return handler_(error, attempt);
  }
  // Counts nothing: no clock, no call site.
  bool wants_times_and_call_sites() const noexcept override { return false; }

 private:
  OutOfMemoryHandler handler_;
};

}  // namespace

OutOfMemoryHandlerAdaptor::OutOfMemoryHandlerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                                     OutOfMemoryHandler handler)
    : ManagerAdaptor(context, std::move(upstream), std::make_shared<CallsHandler>(std::move(handler))) {}

}  // namespace cuemm
