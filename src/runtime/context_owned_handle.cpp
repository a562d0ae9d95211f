#include "cuemm/runtime/detail/context_owned_handle.hpp"

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
  context->deallocations().add([context, handle, destroy] {
    ScopedContext scope(*context);
    destroy(handle);
  });
}

}  // namespace cuemm::detail
