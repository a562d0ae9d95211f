#include "cuemm/runtime/detail/context_owned_handle.hpp"

#include <cstdio>
#include <new>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"

namespace cuemm::detail {

ContextOwnedHandle::ContextOwnedHandle(Context* context, void* handle, Destroy destroy) noexcept
    : context_(context), handle_(handle), destroy_(destroy), generation_(context ? context->generation() : 0) {}

ContextOwnedHandle& ContextOwnedHandle::operator=(ContextOwnedHandle&& other) noexcept {
  if (this != &other) {
    release();
    context_ = other.context_;
    handle_ = std::exchange(other.handle_, nullptr);
    destroy_ = std::exchange(other.destroy_, nullptr);
    generation_ = other.generation_;
  }
  return *this;
}

bool ContextOwnedHandle::stale() const noexcept { return context_ && context_->generation() != generation_; }

void ContextOwnedHandle::release() noexcept {
  void* handle = std::exchange(handle_, nullptr);
  const Destroy destroy = std::exchange(destroy_, nullptr);
  if (!handle || !destroy || !context_ || stale()) return;
  Context* context = context_;
  try {
    context->deallocations().add([context, handle, destroy] {
      ScopedContext scope(*context);
      destroy(handle);
    });
  } catch (const std::bad_alloc&) {
    // No memory to queue it: destroyed now, once the context's queued work
    // (which may still use it) has finished, rather than left with the driver.
    try {
      ScopedContext scope(*context);
      CUEMM_CU_RESULT(cuCtxSynchronize);
      destroy(handle);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm: destroying a stream, event or module failed: %s\n", error.what());
    }
  }
}

}  // namespace cuemm::detail
