// cuemm/managers/async_memory_manager.hpp: the driver's stream-ordered pool
// (CUEMM_MEMORY_MANAGER=async).
//
// Device memory from cuMemAllocFromPoolAsync on a pool of this manager's own
// (not the device's default pool, so other libraries' settings do not leak
// in), freed with cuMemFreeAsync. The EMM interface has no stream, so both run
// on the legacy default stream: a block freed while blocking-stream work still
// uses it is reused only after that work. C++ callers that have a stream use
// allocate(size, stream) and deallocate(pointer, size, stream), as they would
// cudaMallocAsync. The pool keeps freed memory up to
// the release threshold (CUEMM_ASYNC_RELEASE_THRESHOLD, default: all of it).
// Host memory comes from a PinnedHostPool.
//
// IPC: the driver cannot export stream-ordered memory with cuIpcGetMemHandle.
// A pool created exportable (CUEMM_ASYNC_EXPORTABLE=1) exports its blocks
// with cuMemPoolExportPointer, and offers its descriptor to other processes
// of the same user (IpcHandle::open takes it); otherwise get_ipc_handle()
// says how to get one (NotSupported).
//
// reset() releases every block, held or not (their pointers read as dead and
// their finalizers do nothing after), waits for the device and destroys the
// pool, whose memory goes back to the driver; the next allocation makes a new
// pool. So a device's reset (Device::reset()) leaves no stale handle behind.
// Requests on other threads meanwhile wait for it, then use the new pool.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "cuemm/memory/host_only_memory_manager.hpp"
#include "cuemm/memory/stream_ordered_allocator.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

struct AsyncOptions {
  // Freed bytes the pool may keep at a synchronisation point; the rest goes back to the driver.
  std::uint64_t release_threshold = UINT64_MAX;
  // Created shareable through a POSIX file descriptor, so that get_ipc_handle()
  // works (CUEMM_ASYNC_EXPORTABLE=1).
  bool exportable = false;
  // As PoolOptions' (CUEMM_PINNED_HOST_POOL, CUEMM_PINNED_MAXIMUM_CACHED).
  bool pinned_host_pool = true;
  std::size_t pinned_maximum_cached = PinnedHostPoolOptions{}.maximum_cached_bytes;
  static AsyncOptions from_environment();
};

struct AsyncStatistics {
  std::uint64_t reserved_bytes = 0;  // held by the driver's pool
  std::uint64_t used_bytes = 0;      // in blocks not yet freed
  std::uint64_t rejected_frees = 0;  // deallocate() calls that no live block matched (nothing was freed)
};

class AsyncMemoryManager : public HostOnlyMemoryManager, public StreamOrderedAllocator {
 public:
  explicit AsyncMemoryManager(Context* context, AsyncOptions options = AsyncOptions::from_environment());
  ~AsyncMemoryManager() override;

  std::shared_ptr<MemoryPointer> memalloc(std::size_t size) override;

  // Stream-ordered, without a MemoryPointer (as cudaMallocAsync and
  // cudaFreeAsync, or RMM's cuda_async_memory_resource): `size` bytes, ready
  // for work on `stream` at once, and for other streams once they wait for
  // it. deallocate() queues the free on `stream`: the driver's pool gives the
  // block to later work on that stream, and to other streams once the free
  // has run. `size` must be the size allocate() was asked with. A free that
  // no live block of allocate()'s matches (freed already, never handed out,
  // memalloc's, or out before a reset(), which gives these blocks back too)
  // frees nothing: it is reported on stderr and counted
  // (AsyncStatistics::rejected_frees).
  cuda::CUdeviceptr allocate(std::size_t size, cuda::CUstream stream) final;
  void deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept final;

  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) override;
  // Driver free memory plus the pool's reserved but unused bytes; the device total.
  MemoryInfo get_memory_info() override;
  AsyncStatistics statistics() const;
  const AsyncOptions& options() const noexcept { return options_; }
  // Gives the memory the pool keeps back to the driver, once the frees queued
  // on the legacy stream have run (the driver's pool keeps it up to the
  // release threshold, though an allocation elsewhere that would run out
  // takes it back); returns the bytes given back. Blocks that deallocate()
  // freed on other streams come back once their streams reach the frees.
  std::uint64_t trim();

 protected:
  void on_initialize() override;
  void on_reset() override;

 private:
  cuda::CUmemoryPool pool();
  // A block of the driver's pool on `stream`, after a flush and a retry where
  // the first try runs out; the caller holds Blocks::pool_use and records it.
  cuda::CUdeviceptr allocate_from_pool(std::size_t size, cuda::CUstream stream);
  AsyncOptions options_;
  BlockingAwareMutex mutex_;
  std::atomic<cuda::CUmemoryPool> pool_{nullptr};
  // Names the pool's descriptor to other processes once exported (under mutex_; 0: not yet).
  std::uint64_t pool_token_ = 0;
  // The blocks not yet released, by start (reset() and get_ipc_handle() need
  // them), and the lock of the pool's users (Note [The pool's users]).
  struct Blocks;
  std::shared_ptr<Blocks> blocks_;
};

}  // namespace cuemm
