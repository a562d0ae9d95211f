// cuemm/memory/host_only_memory_manager.hpp: the host side of a memory manager.
//
// For plugins whose library manages device memory only: derive from this and
// implement memalloc, get_memory_info and get_ipc_handle; pinned, mapped and
// managed memory come from here, with Numba's deferred deallocation.
//
// initialize(), reset() and defer_cleanup() are final: a subclass adds its own
// work in on_initialize(), on_reset() and on_defer_cleanup(), which this class
// calls after its own. The seed's rule "a subclass must call the base's
// methods" therefore cannot be broken by forgetting it.
//
// Thread-safe. Under defer_cleanup() host memory released by its pointers
// stays pending (not freed) until the last guard goes; a pinned range
// (mempin) is unpinned at once, as Numba unpins it, so that it can be
// pinned again at any time.
//
// A subclass may call use_pinned_host_pool() in its constructor: pinned and
// mapped host memory and pinned ranges then come from a PinnedHostPool
// (cached, reused once safe) instead of the driver. reset() frees all of it,
// blocks still held included, as Numba's reset frees all host memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cuemm/managers/pinned_host_pool.hpp"
#include "cuemm/memory/memory_manager.hpp"
#include "cuemm/memory/pending_deallocations.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

// Numba's thresholds: flush pending frees beyond this many, or beyond this
// share of device memory (CUEMM_MAX_PENDING_DEALLOCS_COUNT / _RATIO).
struct DeallocationPolicy {
  std::size_t max_pending_count = 10;
  double max_pending_ratio = 0.2;
  static DeallocationPolicy from_environment();
};

class HostOnlyMemoryManager : public BaseMemoryManager {
 public:
  explicit HostOnlyMemoryManager(Context* context,
                                 DeallocationPolicy policy = DeallocationPolicy::from_environment());
  ~HostOnlyMemoryManager() override;

  std::shared_ptr<MemoryPointer> memhostalloc(std::size_t size, bool mapped, bool portable, bool wc) override;
  std::shared_ptr<MemoryPointer> mempin(std::shared_ptr<const void> owner, void* pointer, std::size_t size,
                                        bool mapped) override;
  std::shared_ptr<MemoryPointer> memallocmanaged(std::size_t size, bool attach_global) override;

  void initialize() final;
  void reset() final;
  CleanupGuard defer_cleanup() final;
  int interface_version() const override { return kMemoryManagerInterfaceVersion; }

  // Pending releases of this manager (Numba's `deallocations`).
  PendingDeallocations& deallocations() noexcept { return tracker_->pending; }
  // Allocations made through this manager and not yet released.
  std::size_t live_allocations() const;
  // The pinned host pool, or null when this manager does not use one. Valid
  // while the manager lives: a pool that a reset() replaced, which other
  // threads may still be using, is kept until exit.
  PinnedHostPool* pinned_host_pool();

 protected:
  virtual void on_initialize() {}
  virtual void on_reset() {}
  virtual CleanupGuard on_defer_cleanup() { return {}; }

  void use_pinned_host_pool(PinnedHostPoolOptions options = {});

  // Records a new allocation: `memory` is released through `release`, run
  // with this manager's context current when its finalizer runs (queued on
  // deallocations(), `bytes` counting towards the byte threshold, unless
  // `when` is Release::at_once), or at once by reset(). Returns the finalizer
  // to give the pointer. Call adopt() once the pointer exists.
  enum class Release { deferred, at_once };
  Finalizer track(std::uintptr_t address, std::size_t bytes, std::function<void()> release,
                  Release when = Release::deferred);
  void adopt(std::uintptr_t address, const std::shared_ptr<MemoryPointer>& memory);
  // track(), the pointer that make(finalizer) returns, then adopt(). Where
  // the record or the pointer cannot be made (the host is out of memory),
  // `release` runs at once and the error goes on: the allocation is not
  // leaked. (`release` then runs as it is, with the caller's context
  // current, so it must not need the record.)
  template <typename ReleaseNow, typename Make>
  std::shared_ptr<MemoryPointer> track_new(std::uintptr_t address, std::size_t bytes, ReleaseNow release,
                                           Release when, Make make);

  // Runs `allocate`; on out-of-memory flushes pending releases and retries
  // once (Numba's behaviour).
  template <typename Allocate>
  auto with_flush_and_retry(Allocate&& allocate) -> decltype(allocate());
  // The same; where it still runs out, throws explain()'s OutOfMemory
  // instead, which may say what the manager and the device hold.
  template <typename Allocate, typename Explain>
  auto with_flush_and_retry(Allocate&& allocate, Explain&& explain) -> decltype(allocate());

 private:
  // Shared with the finalizers, so a pointer outliving its manager is safe.
  struct Tracker {
    explicit Tracker(std::size_t max_count) : pending(max_count) {}
    struct Entry {
      std::weak_ptr<MemoryPointer> memory;
      std::function<void()> release;
      std::size_t bytes;
      Release when = Release::deferred;
    };
    BlockingAwareMutex mutex;
    std::unordered_map<std::uintptr_t, Entry> live;  // Invariant: released blocks are never here
    PendingDeallocations pending;
    void finalize(std::uintptr_t address) noexcept;
    // Takes `address` off the record; false where it was not there (released already).
    bool forget(std::uintptr_t address) noexcept;
  };
  // Says on stderr that releasing an allocation whose pointer could not be made failed.
  static void report_failed_release(const std::exception& error) noexcept;

  DeallocationPolicy policy_;
  std::optional<PinnedHostPoolOptions> host_pool_options_;
  BlockingAwareMutex host_pool_mutex_;
  std::shared_ptr<PinnedHostPool> host_pool_;  // made at the first host request (under host_pool_mutex_)
  std::atomic<PinnedHostPool*> current_host_pool_{nullptr};  // host_pool_, read without the lock
  std::shared_ptr<Tracker> tracker_;
  bool capacity_known_ = false;
};

void flush_pending_and_log(PendingDeallocations& pending, const char* why) noexcept;

template <typename ReleaseNow, typename Make>
std::shared_ptr<MemoryPointer> HostOnlyMemoryManager::track_new(std::uintptr_t address, std::size_t bytes,
                                                                ReleaseNow release, Release when, Make make) {
  bool recorded = false;
  try {
    Finalizer finalizer = track(address, bytes, release, when);
    recorded = true;
    std::shared_ptr<MemoryPointer> memory = make(std::move(finalizer));
    adopt(address, memory);
    return memory;
  } catch (...) {
    // (Unless the pointer's finalizer or a reset() from another thread took the record and released it.)
    if (!recorded || tracker_->forget(address)) {
      try {
        release();  // (as it is: wrapping it in a std::function could fail for want of memory too)
      } catch (const std::exception& error) {
        report_failed_release(error);
      }
    }
    throw;
  }
}

}  // namespace cuemm

#include "cuemm/error.hpp"

template <typename Allocate>
auto cuemm::HostOnlyMemoryManager::with_flush_and_retry(Allocate&& allocate) -> decltype(allocate()) {
  try {
    return allocate();
  } catch (const OutOfMemory&) {
    if (deallocations().flush() == 0) throw;
  }
  return allocate();
}

template <typename Allocate, typename Explain>
auto cuemm::HostOnlyMemoryManager::with_flush_and_retry(Allocate&& allocate, Explain&& explain)
    -> decltype(allocate()) {
  try {
    return with_flush_and_retry(allocate);
  } catch (const OutOfMemory&) {
    throw explain();
  }
}
