#include "cuemm/memory/memory_pointer.hpp"

#include <cstdio>
#include <string>

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/stream.hpp"
#include "util/hex_address.hpp"

namespace cuemm {

const char* to_string(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::Device: return "device";
    case MemoryKind::Mapped: return "mapped";
    case MemoryKind::Pinned: return "pinned";
    case MemoryKind::Managed: return "managed";
  }
  return "unknown";
}

using util::hex_address;

MemoryPointer::MemoryPointer(Context* context, std::uintptr_t pointer, std::size_t size,
                             std::shared_ptr<const void> owner, Finalizer finalizer)
    : MemoryPointer(context, pointer, size, std::move(owner), std::move(finalizer),
                    Details{MemoryKind::Device, 0, 1}) {}

MemoryPointer::~MemoryPointer() { finalize_unshared(); }

void MemoryPointer::finalize_unshared() noexcept {
  // Nothing else refers to this pointer (a racing free() or mark_released()
  // would hold a reference), so a plain read decides: no atomic exchange.
  if (!has_finalizer_ || !alive_.load(std::memory_order_acquire)) return;
  alive_.store(false, std::memory_order_relaxed);
  call_finalizer();
}

bool MemoryPointer::run_finalizer() noexcept {
  if (!has_finalizer_ || !alive_.exchange(false, std::memory_order_acq_rel)) return false;
  call_finalizer();
  return true;
}

void MemoryPointer::call_finalizer() noexcept {
  try {
    // (In a forked child the memory is the parent's, and the manager a copy:
    // nothing to give back. Note [A child forked after the driver was loaded].)
    if (!driver::in_forked_child()) [[likely]]
      finalizer_();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm: releasing %s memory at %s failed: %s\n", to_string(kind_),
                 hex_address(pointer_).c_str(), error.what());
  }
  finalizer_ = nullptr;  // what it holds goes now, not with the pointer
}

void MemoryPointer::throw_not_mapped() const {
  throw StateError("pinned host memory at " + hex_address(host_pointer_) +
                   " is not mapped into the device address space (allocate it with mapped=true)");
}

std::shared_ptr<MemoryPointer> MemoryPointer::owner() {
  return view_base_ ? view_base_ : shared_from_this();
}

OwnedPointer MemoryPointer::own() { return OwnedPointer(shared_from_this()); }

void MemoryPointer::free() {
  if (!has_finalizer_) return;  // a view, or memory this pointer does not own
  // The exchange inside run_finalizer decides, so of racing frees exactly one
  // runs the finalizer and every other one reports dead memory.
  if (!run_finalizer()) throw StateError("Freeing dead memory: " + std::string(to_string(kind_)) + " memory at " +
                                    hex_address(pointer_) + " (" + std::to_string(size_) + " bytes) was already freed");
}

void MemoryPointer::drop_owned_reference() noexcept {
  // The last owned reference of an AutoFreePointer frees it (refct starts at 0).
  if (refct_.fetch_sub(1, std::memory_order_acq_rel) == 1 && has_finalizer_) run_finalizer();
}

std::shared_ptr<MemoryPointer> MemoryPointer::view(std::size_t start, std::optional<std::size_t> stop) {
  const std::size_t end = stop.value_or(size_);
  if (start > end || end > size_) {
    throw InvalidArgument("view [" + std::to_string(start) + ", " + std::to_string(end) +
                          ") is not inside memory of " + std::to_string(size_) + " bytes");
  }
  const std::uintptr_t host = host_pointer_ ? host_pointer_ + start : 0;
  std::shared_ptr<MemoryPointer> view(
      new MemoryPointer(context_, pointer_ + start, end - start, nullptr, nullptr, Details{kind_, host, 1}));
  view->view_base_ = owner();
  return view;
}

void MemoryPointer::check_alive(const char* operation) const {
  if (!is_alive()) {
    throw StateError(std::string(operation) + " of freed " + to_string(kind_) + " memory at " +
                     hex_address(pointer_) + " (" + std::to_string(size_) + " bytes)");
  }
}

void MemoryPointer::memset(unsigned char value, std::optional<std::size_t> count, const Stream* stream) {
  const std::size_t bytes = count.value_or(size_);
  if (bytes > size_) {
    throw InvalidArgument("memset of " + std::to_string(bytes) + " bytes on memory of " + std::to_string(size_) +
                          " bytes");
  }
  if (bytes == 0) return;
  check_alive("memset");
  const cuda::CUdeviceptr address = device_pointer();
  if (context_) {
    ScopedContext scope(*context_);
    if (stream && stream->handle()) {
      CUEMM_CU(cuMemsetD8Async, address, value, bytes, stream->handle());
    } else {
      CUEMM_CU(cuMemsetD8, address, value, bytes);
    }
  } else {
    CUEMM_CU(cuMemsetD8, address, value, bytes);
  }
}

AutoFreePointer::AutoFreePointer(Context* context, std::uintptr_t pointer, std::size_t size,
                                 std::shared_ptr<const void> owner, Finalizer finalizer)
    : AutoFreePointer(context, pointer, size, std::move(owner), std::move(finalizer),
                      Details{MemoryKind::Device, 0, 0}) {}

namespace {
cuda::CUdeviceptr mapped_device_pointer(Context* context, void* host_pointer) {
  cuda::CUdeviceptr device_pointer = 0;
  if (context) {
    ScopedContext scope(*context);
    CUEMM_CU(cuMemHostGetDevicePointer, &device_pointer, host_pointer, 0);
  } else {
    CUEMM_CU(cuMemHostGetDevicePointer, &device_pointer, host_pointer, 0);
  }
  return device_pointer;
}
}  // namespace

MappedMemory::MappedMemory(Context* context, void* host_pointer, std::size_t size,
                           std::shared_ptr<const void> owner, Finalizer finalizer)
    : MappedMemory(context, host_pointer, mapped_device_pointer(context, host_pointer), size, std::move(owner),
                   std::move(finalizer)) {}

MappedMemory::MappedMemory(Context* context, void* host_pointer, cuda::CUdeviceptr device_pointer,
                           std::size_t size, std::shared_ptr<const void> owner, Finalizer finalizer)
    : AutoFreePointer(context, device_pointer, size, std::move(owner), std::move(finalizer),
                      Details{MemoryKind::Mapped, reinterpret_cast<std::uintptr_t>(host_pointer), 0}) {}

PinnedMemory::PinnedMemory(Context* context, void* host_pointer, std::size_t size,
                           std::shared_ptr<const void> owner, Finalizer finalizer)
    : MemoryPointer(context, reinterpret_cast<std::uintptr_t>(host_pointer), size, std::move(owner),
                    std::move(finalizer),
                    Details{MemoryKind::Pinned, reinterpret_cast<std::uintptr_t>(host_pointer), 1}) {}

ManagedMemory::ManagedMemory(Context* context, cuda::CUdeviceptr pointer, std::size_t size,
                             std::shared_ptr<const void> owner, Finalizer finalizer)
    : AutoFreePointer(context, pointer, size, std::move(owner), std::move(finalizer),
                      Details{MemoryKind::Managed, static_cast<std::uintptr_t>(pointer), 0}) {}

OwnedPointer::OwnedPointer(std::shared_ptr<MemoryPointer> memory) : memory_(std::move(memory)) {
  if (memory_) memory_->refct_.fetch_add(1, std::memory_order_relaxed);
}
OwnedPointer::OwnedPointer(const OwnedPointer& other) : OwnedPointer(other.memory_) {}
OwnedPointer::OwnedPointer(OwnedPointer&& other) noexcept : memory_(std::move(other.memory_)) {}
OwnedPointer& OwnedPointer::operator=(OwnedPointer other) noexcept {
  std::swap(memory_, other.memory_);
  return *this;
}
OwnedPointer::~OwnedPointer() {
  if (memory_) memory_->drop_owned_reference();
}

}  // namespace cuemm
