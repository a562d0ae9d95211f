// cuemm/runtime/detail/context_owned_handle.hpp: the one rule by which
// streams, events and modules give their driver handle back.
//
// A handle that a context owns is released through the context's queue of
// deferred releases (never its memory manager), so that an object can be
// dropped while work using it still runs; and not at all when the context
// was reset since the handle was made, as the reset destroyed it already.
// Move-only. Without a `destroy` call the handle is borrowed (the default
// streams) and never released.
#pragma once

#include <cstdint>
#include <utility>

namespace cuemm {
class Context;
}

namespace cuemm::detail {

class ContextOwnedHandle {
 public:
  // The driver call that destroys a handle; runs with its context current.
  using Destroy = void (*)(void* handle);

  ContextOwnedHandle() = default;
  ContextOwnedHandle(Context* context, void* handle, Destroy destroy) noexcept;
  ContextOwnedHandle(ContextOwnedHandle&& other) noexcept
      : context_(other.context_),
        handle_(std::exchange(other.handle_, nullptr)),
        destroy_(std::exchange(other.destroy_, nullptr)),
        generation_(other.generation_) {}
  ContextOwnedHandle& operator=(ContextOwnedHandle&& other) noexcept;
  ContextOwnedHandle(const ContextOwnedHandle&) = delete;
  ContextOwnedHandle& operator=(const ContextOwnedHandle&) = delete;
  ~ContextOwnedHandle() { release(); }

  Context* context() const noexcept { return context_; }
  void* get() const noexcept { return handle_; }
  // Whether the context was reset since the handle was made (the reset destroyed it).
  bool stale() const noexcept;

 private:
  void release() noexcept;

  Context* context_ = nullptr;
  void* handle_ = nullptr;
  Destroy destroy_ = nullptr;  // null: borrowed
  std::uint64_t generation_ = 0;
};

}  // namespace cuemm::detail
