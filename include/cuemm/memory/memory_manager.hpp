// cuemm/memory/memory_manager.hpp: the External Memory Management plugin interface.
//
// Every context owns one memory manager and never allocates memory itself:
// device, pinned, mapped and managed memory all come from these members. A
// plugin derives from BaseMemoryManager (or from HostOnlyMemoryManager, which
// supplies the host side) and is registered with set_memory_manager() or
// selected with CUEMM_MEMORY_MANAGER (see registry.hpp).
//
// Rules for implementers, as in NBEP 7:
// - The constructor receives the context and must not call the driver; it is
//   also called once with a null context, to read interface_version().
// - initialize() is called before the first allocation and may be called
//   again later without losing state. reset() may be called before it.
// - Allocations are made in the context the manager belongs to; the returned
//   pointer's finalizer gives the memory back.
// - defer_cleanup() returns a guard; each manager documents what it defers.
#pragma once

#include <cstddef>
#include <memory>

#include "cuemm/memory/cleanup_guard.hpp"
#include "cuemm/memory/ipc_handle.hpp"
#include "cuemm/memory/memory_pointer.hpp"

namespace cuemm {

// The plugin interface version this build implements.
inline constexpr int kMemoryManagerInterfaceVersion = 1;

struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

// InvalidArgument "<call>: size must be at least 1 byte (got 0)" for a zero
// size: the driver refuses empty allocations, and so does every manager.
[[noreturn]] void throw_zero_allocation_size(const char* call);
inline void require_allocation_size(std::size_t size, const char* call) {
  if (size == 0) [[unlikely]] throw_zero_allocation_size(call);
}

class BaseMemoryManager {
 public:
  explicit BaseMemoryManager(Context* context) : context_(context) {}
  virtual ~BaseMemoryManager() = default;
  BaseMemoryManager(const BaseMemoryManager&) = delete;
  BaseMemoryManager& operator=(const BaseMemoryManager&) = delete;

  // Device memory in this manager's context: a MemoryPointer of `size` bytes.
  virtual std::shared_ptr<MemoryPointer> memalloc(std::size_t size) = 0;
  // Page-locked host memory: MappedMemory when `mapped`, else PinnedMemory.
  virtual std::shared_ptr<MemoryPointer> memhostalloc(std::size_t size, bool mapped, bool portable,
                                                      bool wc) = 0;
  // Page-locks existing host memory [pointer, pointer + size); `owner` is kept
  // alive as long as the returned pointer.
  virtual std::shared_ptr<MemoryPointer> mempin(std::shared_ptr<const void> owner, void* pointer,
                                                std::size_t size, bool mapped) = 0;
  virtual void initialize() = 0;
  virtual IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) = 0;
  virtual MemoryInfo get_memory_info() = 0;
  virtual void reset() = 0;
  virtual CleanupGuard defer_cleanup() = 0;
  virtual int interface_version() const = 0;

  // Managed (unified) memory, as numba-cuda has it. The default refuses with
  // a clear error; HostOnlyMemoryManager implements it.
  virtual std::shared_ptr<MemoryPointer> memallocmanaged(std::size_t size, bool attach_global);

  // The context this manager serves; StateError on the version-probe instance.
  Context& context() const;
  bool has_context() const noexcept { return context_ != nullptr; }

 private:
  Context* context_;
};

}  // namespace cuemm
