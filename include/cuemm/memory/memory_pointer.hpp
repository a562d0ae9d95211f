// cuemm/memory/memory_pointer.hpp: the pointer classes a memory manager returns.
//
//   MemoryPointer    device memory (from memalloc)
//   AutoFreePointer  memory freed when its last owned reference goes
//   MappedMemory     page-locked host memory mapped into the device address space
//   PinnedMemory     page-locked host memory that is not mapped
//   ManagedMemory    unified (managed) memory
//
// Ownership rules (the seed's): a pointer's finalizer, usually "give this
// block back to the manager", runs exactly once, when the memory is released:
// when the last std::shared_ptr to the pointer goes, or at an explicit free().
// A view keeps its base alive and never frees. own() hands out an
// OwnedPointer; dropping one never frees a MemoryPointer, but dropping the last
// one of an AutoFreePointer does. Freeing memory twice is a StateError.
//
// Pointers must be created with std::make_shared (own() and view() need it):
//
//   auto memory = std::make_shared<cuemm::MemoryPointer>(
//       &context, address, bytes, /*owner=*/nullptr,
//       [pool, address] { pool->release(address); });
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>

#include "cuemm/driver/cuda_api.hpp"

namespace cuemm {

class Context;
class Stream;
class OwnedPointer;

enum class MemoryKind { Device, Mapped, Pinned, Managed };
const char* to_string(MemoryKind kind) noexcept;

// Called once when the memory is released. Must not throw (errors are
// reported on stderr and swallowed, as in any destructor).
using Finalizer = std::function<void()>;

namespace detail {
// A callable, not a Finalizer, that a pointer's constructor makes its
// finalizer in place (see MemoryPointer's).
template <typename Release>
concept InPlaceFinalizer = std::is_class_v<std::remove_cvref_t<Release>> &&
                           !std::is_same_v<std::remove_cvref_t<Release>, Finalizer> &&
                           std::is_invocable_r_v<void, std::remove_cvref_t<Release>&>;
}  // namespace detail

class MemoryPointer : public std::enable_shared_from_this<MemoryPointer> {
 public:
  // context: where the memory lives; pointer: its address; size: bytes;
  // owner: anything that must outlive the memory (say, the host buffer a
  // pinned region belongs to); finalizer: what releases it (none for memory
  // this pointer does not own).
  MemoryPointer(Context* context, std::uintptr_t pointer, std::size_t size,
                std::shared_ptr<const void> owner = nullptr, Finalizer finalizer = nullptr);
  // The same with a callable that becomes the finalizer in place. (Moving a
  // std::function made for the call read back 16 bytes that its construction
  // had just stored as two halves, which the CPU cannot forward: a stall of
  // about a tenth of a pool's memalloc pair, simulated driver.)
  template <detail::InPlaceFinalizer Release>
  MemoryPointer(Context* context, std::uintptr_t pointer, std::size_t size, std::shared_ptr<const void> owner,
                Release&& release)
      : MemoryPointer(context, pointer, size, std::move(owner), std::forward<Release>(release),
                      Details{MemoryKind::Device, 0, 1}) {}
  virtual ~MemoryPointer();
  MemoryPointer(const MemoryPointer&) = delete;
  MemoryPointer& operator=(const MemoryPointer&) = delete;

  Context* context() const noexcept { return context_; }
  // The address, as the manager returned it.
  std::uintptr_t handle() const noexcept { return pointer_; }
  // The address device code uses; for PinnedMemory (not mapped) a StateError.
  // (Inline: a kernel launch asks for it, and the call was 7% of a pool's
  // memalloc pair that asked once.)
  cuda::CUdeviceptr device_pointer() const {
    if (kind_ == MemoryKind::Pinned) [[unlikely]] throw_not_mapped();
    return pointer_;
  }
  // The host address of host memory (mapped, pinned, managed), else 0.
  std::uintptr_t host_pointer() const noexcept { return host_pointer_; }
  std::size_t size() const noexcept { return size_; }
  MemoryKind kind() const noexcept { return kind_; }

  // The pointer that owns the memory: this one, or the base of a view.
  std::shared_ptr<MemoryPointer> owner();
  // Whether this pointer releases memory (has a finalizer): views do not.
  bool owns_memory() const noexcept { return has_finalizer_; }
  // False once the finalizer has run (or the manager released the memory);
  // for a view, once its base's has.
  bool is_alive() const noexcept {
    return view_base_ ? view_base_->is_alive() : alive_.load(std::memory_order_acquire);
  }
  // StateError naming `operation` ("memset", "copy to the device") and this
  // memory once it is dead: its bytes may be another block's by then.
  void check_alive(const char* operation) const;

  // A reference that counts towards refct (see the header comment).
  OwnedPointer own();
  int refct() const noexcept { return refct_.load(); }

  // Runs the finalizer now. StateError if it already ran ("freeing dead memory").
  void free();

  // Bytes [start, stop) of this memory, keeping the base alive; stop defaults
  // to the end. InvalidArgument when the range is not inside the memory.
  std::shared_ptr<MemoryPointer> view(std::size_t start, std::optional<std::size_t> stop = {});

  // Sets `count` bytes (default: all) to `value`, on `stream` if given.
  void memset(unsigned char value, std::optional<std::size_t> count = {}, const Stream* stream = nullptr);

  // For managers: the memory was released by other means (a reset); the
  // finalizer will not run and the pointer reads as dead.
  void mark_released() noexcept { alive_.store(false, std::memory_order_release); }

 protected:
  struct Details {
    MemoryKind kind;
    std::uintptr_t host_pointer;
    int initial_refct;
  };
  // `finalizer`: a Finalizer, or a callable that becomes it in place.
  template <typename Release>
  MemoryPointer(Context* context, std::uintptr_t pointer, std::size_t size, std::shared_ptr<const void>&& owner,
                Release&& finalizer, Details details)
      : context_(context),
        pointer_(pointer),
        size_(size),
        owner_(std::move(owner)),
        finalizer_(std::forward<Release>(finalizer)),
        has_finalizer_(static_cast<bool>(finalizer_)),
        kind_(details.kind),
        host_pointer_(details.host_pointer),
        alive_(true),
        refct_(details.initial_refct) {}
  // Runs the finalizer if it has not run, for a destructor (no other
  // reference exists then). A subclass whose finalizer uses the subclass's
  // members calls it from its own destructor, while they still exist.
  void finalize_unshared() noexcept;

 private:
  friend class OwnedPointer;
  [[noreturn]] void throw_not_mapped() const;
  bool run_finalizer() noexcept;  // true when this call ran it
  void call_finalizer() noexcept;
  void drop_owned_reference() noexcept;

  Context* context_;
  std::uintptr_t pointer_;
  std::size_t size_;
  std::shared_ptr<const void> owner_;         // kept alive for our lifetime
  std::shared_ptr<MemoryPointer> view_base_;  // set for views
  Finalizer finalizer_;
  bool has_finalizer_;
  MemoryKind kind_;
  std::uintptr_t host_pointer_;
  std::atomic<bool> alive_;
  std::atomic<int> refct_;
};

class AutoFreePointer : public MemoryPointer {
 public:
  AutoFreePointer(Context* context, std::uintptr_t pointer, std::size_t size,
                  std::shared_ptr<const void> owner = nullptr, Finalizer finalizer = nullptr);

 protected:
  // `finalizer` as MemoryPointer's.
  template <typename Release>
  AutoFreePointer(Context* context, std::uintptr_t pointer, std::size_t size, std::shared_ptr<const void>&& owner,
                  Release&& finalizer, Details details)
      : MemoryPointer(context, pointer, size, std::move(owner), std::forward<Release>(finalizer),
                      Details{details.kind, details.host_pointer, 0}) {}
};

class MappedMemory : public AutoFreePointer {
 public:
  // `host_pointer` is page-locked and mapped; its device address is asked of
  // the driver, as it may differ from the host address without UVA.
  MappedMemory(Context* context, void* host_pointer, std::size_t size,
               std::shared_ptr<const void> owner = nullptr, Finalizer finalizer = nullptr);
  // When the device address is already known.
  MappedMemory(Context* context, void* host_pointer, cuda::CUdeviceptr device_pointer, std::size_t size,
               std::shared_ptr<const void> owner, Finalizer finalizer);
  // The same with a callable made the finalizer in place (MemoryPointer's).
  template <detail::InPlaceFinalizer Release>
  MappedMemory(Context* context, void* host_pointer, cuda::CUdeviceptr device_pointer, std::size_t size,
               std::shared_ptr<const void> owner, Release&& release)
      : AutoFreePointer(context, device_pointer, size, std::move(owner), std::forward<Release>(release),
                        Details{MemoryKind::Mapped, reinterpret_cast<std::uintptr_t>(host_pointer), 0}) {}
};

class PinnedMemory : public MemoryPointer {
 public:
  PinnedMemory(Context* context, void* host_pointer, std::size_t size,
               std::shared_ptr<const void> owner = nullptr, Finalizer finalizer = nullptr);
  // The same with a callable made the finalizer in place (MemoryPointer's).
  template <detail::InPlaceFinalizer Release>
  PinnedMemory(Context* context, void* host_pointer, std::size_t size, std::shared_ptr<const void> owner,
               Release&& release)
      : MemoryPointer(context, reinterpret_cast<std::uintptr_t>(host_pointer), size, std::move(owner),
                      std::forward<Release>(release),
                      Details{MemoryKind::Pinned, reinterpret_cast<std::uintptr_t>(host_pointer), 1}) {}
};

class ManagedMemory : public AutoFreePointer {
 public:
  ManagedMemory(Context* context, cuda::CUdeviceptr pointer, std::size_t size,
                std::shared_ptr<const void> owner = nullptr, Finalizer finalizer = nullptr);
};

// A counted reference from MemoryPointer::own(). Copyable; each copy counts.
class OwnedPointer {
 public:
  OwnedPointer() = default;
  explicit OwnedPointer(std::shared_ptr<MemoryPointer> memory);
  OwnedPointer(const OwnedPointer& other);
  OwnedPointer(OwnedPointer&& other) noexcept;
  OwnedPointer& operator=(OwnedPointer other) noexcept;
  ~OwnedPointer();

  MemoryPointer* get() const noexcept { return memory_.get(); }
  MemoryPointer* operator->() const noexcept { return memory_.get(); }
  MemoryPointer& operator*() const noexcept { return *memory_; }
  explicit operator bool() const noexcept { return memory_ != nullptr; }
  const std::shared_ptr<MemoryPointer>& memory() const noexcept { return memory_; }

 private:
  std::shared_ptr<MemoryPointer> memory_;
};

}  // namespace cuemm
