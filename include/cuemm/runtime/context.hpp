// cuemm/runtime/context.hpp: a device's primary context and its memory manager.
//
// A Context never allocates memory itself: every device, pinned, mapped and
// managed allocation, IPC export and memory query goes through its memory
// manager (see memory/registry.hpp for choosing it). Streams, events and
// modules are the context's own and are released through the context's own
// deferred-deallocation queue, never through the manager.
//
//   cuemm::Context& context = cuemm::current_context();
//   auto memory = context.memalloc(1 << 20);        // from the manager
//   cuemm::Stream stream = context.create_stream();
//   memory->memset(0, std::nullopt, &stream);
//   stream.synchronize();
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/memory/cleanup_guard.hpp"
#include "cuemm/memory/ipc_handle.hpp"
#include "cuemm/memory/memory_manager.hpp"
#include "cuemm/memory/pending_deallocations.hpp"

namespace cuemm {

class Device;
class Stream;
class Event;
class Module;
class CaptureScope;

class Context {
 public:
  Context(Device& device, cuda::CUcontext handle);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device& device() const noexcept { return device_; }
  cuda::CUcontext handle() const noexcept { return handle_; }
  BaseMemoryManager& memory_manager() const noexcept { return *memory_manager_; }

  // Calls the manager's initialize(); safe to call more than once.
  void prepare_for_use();
  // Releases everything this context holds: pending releases of streams,
  // events and modules, and (through reset()) all of the manager's memory.
  // Streams, events and modules made before it stay valid, as in Numba, and
  // are released when they go.
  void reset();
  // For Device::reset(), whose driver reset destroys the context's streams,
  // events and modules: those made before it are then not released again.
  void forget_driver_objects() noexcept { generation_.fetch_add(1); }
  // Incremented by forget_driver_objects(): objects made before it hold stale handles.
  std::uint64_t generation() const noexcept { return generation_.load(); }

  // --- delegated to the memory manager ---
  MemoryInfo get_memory_info();
  std::shared_ptr<MemoryPointer> memalloc(std::size_t size);
  std::shared_ptr<MemoryPointer> memhostalloc(std::size_t size, bool mapped = false, bool portable = false,
                                              bool wc = false);
  // InvalidArgument for a null pointer or zero size; CudaError when mapped
  // memory is asked of a device that cannot map host memory.
  std::shared_ptr<MemoryPointer> mempin(std::shared_ptr<const void> owner, void* pointer, std::size_t size,
                                        bool mapped = false);
  std::shared_ptr<MemoryPointer> memallocmanaged(std::size_t size, bool attach_global = true);
  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory);
  CleanupGuard defer_cleanup();

  // Maps another process's exported allocation (not an allocation: no manager
  // is involved). The mapping is closed when the returned pointer is freed or
  // its last reference goes (IpcHandle::close frees it).
  std::shared_ptr<MemoryPointer> open_ipc_handle(const cuda::CUipcMemHandle& handle, std::size_t size);

  // --- the context's own objects ---
  Stream create_stream(bool non_blocking = false);
  Event create_event(bool timing = true);
  // Loads a PTX text or a cubin image.
  Module load_module(std::string_view image);
  void synchronize();
  PendingDeallocations& deallocations() noexcept { return deallocations_; }

  // Whether a CaptureScope of this context is open: a CUDA graph is being
  // captured, and its managers make no call that would end the capture.
  bool capturing() const noexcept { return captures_.load(std::memory_order_acquire) > 0; }
  // For a manager's raw interface, whose blocks have no MemoryPointer: where
  // the calling thread has an open CaptureScope of this context, makes the
  // block's pointer with `make` and gives it to the scope's GraphMemory;
  // false, with nothing made, where it has none.
  bool keep_for_capture(const std::function<std::shared_ptr<MemoryPointer>()>& make);
  // For a stream-ordered raw interface: its free of the kept block at
  // `address` on `stream`, by a thread with an open scope, which may then
  // give the block to the thread's later requests on that stream
  // (reuse_for_capture), as stream order makes safe. Call before letting go.
  void let_go_for_capture(cuda::CUdeviceptr address, cuda::CUstream stream);
  // A view of `size` bytes of a block that the calling thread let go on
  // `stream` within its innermost open scope's memory (the smallest that
  // holds them, wasting at most half); null where none.
  std::shared_ptr<MemoryPointer> reuse_for_capture(std::size_t size, cuda::CUstream stream);

 private:
  friend class CaptureScope;
  // Gives `block` to the calling thread's innermost open CaptureScope of
  // this context, if it has one; returns it either way.
  std::shared_ptr<MemoryPointer> keep_if_captured(std::shared_ptr<MemoryPointer> block) {
    if (capturing()) [[unlikely]]
      keep_for_capture([&] { return block; });
    return block;
  }
  // A block that such a scope, reusing, holds for a device request of `size`; else null.
  std::shared_ptr<MemoryPointer> reuse_if_captured(std::size_t size);
  // The innermost open scope that the calling thread opened or, with
  // `memberships`, is a member of (`as_member` says which); null where none.
  // (scopes_mutex_ held)
  CaptureScope* innermost_scope_of_this_thread(bool* as_member = nullptr, bool memberships = true);

  Device& device_;
  cuda::CUcontext handle_;
  PendingDeallocations deallocations_;
  std::unique_ptr<BaseMemoryManager> memory_manager_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> captures_{0};  // open CaptureScopes
  std::mutex scopes_mutex_;        // (taken as scopes open and close, and by requests while captures_ > 0)
  std::vector<CaptureScope*> open_scopes_;
  std::vector<std::pair<std::thread::id, std::uint64_t>> scope_members_;  // a member thread, its scope's id
  std::uint64_t next_scope_id_ = 1;
};

// The calling thread's context: the one current in the driver, else device
// 0's primary context, made current and prepared for use.
Context& current_context();

// Makes `context` current on this thread for the scope; no driver push when it
// already is.
// While the context is capturing(), the scope also relaxes the thread's
// capture mode, so that cuemm's own allocations, frees and event queries do
// not end a capture that forbids them to other threads (see CaptureScope).
class ScopedContext {
 public:
  explicit ScopedContext(const Context& context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
  bool relaxed_ = false;
  int previous_capture_mode_ = 0;
};

}  // namespace cuemm
