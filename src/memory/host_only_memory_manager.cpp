#include "cuemm/memory/host_only_memory_manager.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "driver/mapped_host_memory.hpp"
#include "util/environment.hpp"
#include "util/keep_until_exit.hpp"

namespace cuemm {

DeallocationPolicy DeallocationPolicy::from_environment() {
  DeallocationPolicy policy;
  policy.max_pending_count =
      util::count_from_environment("CUEMM_MAX_PENDING_DEALLOCS_COUNT").value_or(policy.max_pending_count);
  policy.max_pending_ratio =
      util::fraction_from_environment("CUEMM_MAX_PENDING_DEALLOCS_RATIO", 1.0).value_or(policy.max_pending_ratio);
  return policy;
}

HostOnlyMemoryManager::HostOnlyMemoryManager(Context* context, DeallocationPolicy policy)
    : BaseMemoryManager(context), policy_(policy), tracker_(std::make_shared<Tracker>(policy.max_pending_count)) {}

HostOnlyMemoryManager::~HostOnlyMemoryManager() { tracker_->pending.flush_all(); }

void HostOnlyMemoryManager::Tracker::finalize(std::uintptr_t address) noexcept {
  Entry entry;
  {
    std::lock_guard lock(mutex);
    auto it = live.find(address);
    if (it == live.end()) return;  // already released by reset()
    entry = std::move(it->second);
    live.erase(it);
  }
  try {
    if (entry.when == Release::at_once)
      entry.release();
    else
      pending.add(std::move(entry.release), entry.bytes);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm: %s a release failed: %s\n", entry.when == Release::at_once ? "running" : "queueing",
                 error.what());
  }
}

bool HostOnlyMemoryManager::Tracker::forget(std::uintptr_t address) noexcept {
  std::lock_guard lock(mutex);
  return live.erase(address) == 1;
}

void HostOnlyMemoryManager::report_failed_release(const std::exception& error) noexcept {
  std::fprintf(stderr, "cuemm: releasing an allocation whose pointer could not be made failed: %s\n", error.what());
}

Finalizer HostOnlyMemoryManager::track(std::uintptr_t address, std::size_t bytes, std::function<void()> release,
                                       Release when) {
  // Releases run later, from whichever thread flushes: in our context.
  Tracker::Entry entry{{}, [&context = context(), release = std::move(release)] {
                          ScopedContext scope(context);
                          release();
                        },
                        bytes, when};
  // (Made before the record: if it throws, nothing is recorded that nothing would release.)
  Finalizer finalizer = [tracker = std::weak_ptr<Tracker>(tracker_), address] {
    if (auto owner = tracker.lock()) owner->finalize(address);
  };
  {
    std::lock_guard lock(tracker_->mutex);
    tracker_->live.insert_or_assign(address, std::move(entry));
  }
  return finalizer;
}

void HostOnlyMemoryManager::adopt(std::uintptr_t address, const std::shared_ptr<MemoryPointer>& memory) {
  std::lock_guard lock(tracker_->mutex);
  if (auto it = tracker_->live.find(address); it != tracker_->live.end()) it->second.memory = memory;
}

void HostOnlyMemoryManager::use_pinned_host_pool(PinnedHostPoolOptions options) { host_pool_options_ = options; }

PinnedHostPool* HostOnlyMemoryManager::pinned_host_pool() {
  if (PinnedHostPool* pool = current_host_pool_.load(std::memory_order_acquire)) [[likely]]
    return pool;
  if (!host_pool_options_ || !has_context()) return nullptr;
  std::lock_guard lock(host_pool_mutex_);
  if (!host_pool_) {
    host_pool_ = std::make_shared<PinnedHostPool>(context(), *host_pool_options_);
    current_host_pool_.store(host_pool_.get(), std::memory_order_release);
  }
  return host_pool_.get();
}

std::size_t HostOnlyMemoryManager::live_allocations() const {
  std::lock_guard lock(tracker_->mutex);
  return tracker_->live.size();
}

void HostOnlyMemoryManager::initialize() {
  // The byte threshold is a share of the device's memory, known once the
  // context exists (Numba reads it here too).
  if (!capacity_known_ && has_context()) {
    try {
      const MemoryInfo info = get_memory_info();
      deallocations().set_max_bytes(static_cast<std::size_t>(static_cast<double>(info.total) *
                                                             policy_.max_pending_ratio));
      capacity_known_ = true;
    } catch (const Error&) {
      // A manager that cannot report memory keeps only the count threshold.
    }
  }
  on_initialize();
}

void HostOnlyMemoryManager::reset() {
  std::unordered_map<std::uintptr_t, Tracker::Entry> live;
  {
    std::lock_guard lock(tracker_->mutex);
    live.swap(tracker_->live);
  }
  for (auto& [address, entry] : live) {
    if (auto memory = entry.memory.lock()) memory->mark_released();
    try {
      entry.release();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm: releasing memory during reset failed: %s\n", error.what());
    }
  }
  deallocations().flush_all();
  std::shared_ptr<PinnedHostPool> host_pool;
  {
    std::lock_guard lock(host_pool_mutex_);
    host_pool = std::move(host_pool_);  // the next host allocation makes a fresh pool
    current_host_pool_.store(nullptr, std::memory_order_release);
  }
  std::exception_ptr failed;  // (the subclass's reset runs all the same; then this is thrown)
  if (host_pool) {
    try {
      host_pool->release_everything();
    } catch (...) {
      failed = std::current_exception();
    }
    util::keep_until_exit(std::move(host_pool));  // other threads' requests may still be under way in it
  }
  on_reset();
  if (failed) std::rethrow_exception(failed);
}

CleanupGuard HostOnlyMemoryManager::defer_cleanup() {
  CleanupGuard host_side = deallocations().defer();
  CleanupGuard guard = on_defer_cleanup();
  guard.attach(std::move(host_side));  // the subclass's deferral ends first
  return guard;
}

std::shared_ptr<MemoryPointer> HostOnlyMemoryManager::memhostalloc(std::size_t size, bool mapped, bool portable,
                                                                   bool wc) {
  require_allocation_size(size, "memhostalloc");
  if (PinnedHostPool* pool = pinned_host_pool())
    return with_flush_and_retry([&] { return pool->allocate(size, mapped, portable, wc); });
  Context& ctx = context();
  const unsigned flags = (mapped ? cuda::CU_MEMHOSTALLOC_DEVICEMAP : 0u) |
                         (portable ? cuda::CU_MEMHOSTALLOC_PORTABLE : 0u) |
                         (wc ? cuda::CU_MEMHOSTALLOC_WRITECOMBINED : 0u);
  ScopedContext scope(ctx);
  void* pointer = with_flush_and_retry([&] {
    void* allocated = nullptr;
    CUEMM_CU_ALLOC(size, cuMemHostAlloc, &allocated, size, flags);
    return allocated;
  });
  // The device address before the record: a reset() from another thread
  // releases what is recorded, and the driver then knows no such address.
  const cuda::CUdeviceptr device =
      mapped ? driver::mapped_device_pointer(pointer, [&] { CUEMM_CU_RESULT(cuMemFreeHost, pointer); }) : 0;
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  // Only mapped memory counts towards the pending bytes, as in Numba's
  // _hostalloc_finalizer: the byte threshold is a share of the device's memory.
  return track_new(address, mapped ? size : 0, [pointer] { CUEMM_CU(cuMemFreeHost, pointer); }, Release::deferred,
                   [&](Finalizer finalizer) -> std::shared_ptr<MemoryPointer> {
                     if (mapped)
                       return std::make_shared<MappedMemory>(&ctx, pointer, device, size, nullptr,
                                                             std::move(finalizer));
                     return std::make_shared<PinnedMemory>(&ctx, pointer, size, nullptr, std::move(finalizer));
                   });
}

std::shared_ptr<MemoryPointer> HostOnlyMemoryManager::mempin(std::shared_ptr<const void> owner, void* pointer,
                                                             std::size_t size, bool mapped) {
  if (!pointer) throw InvalidArgument("mempin: the pointer is null");
  require_allocation_size(size, "mempin");
  if (PinnedHostPool* pool = pinned_host_pool())
    return with_flush_and_retry([&] { return pool->pin(owner, pointer, size, mapped); });
  Context& ctx = context();
  const unsigned flags = mapped ? cuda::CU_MEMHOSTREGISTER_DEVICEMAP : 0u;
  ScopedContext scope(ctx);
  with_flush_and_retry([&] {
    CUEMM_CU_ALLOC(size, cuMemHostRegister, pointer, size, flags);
    return 0;
  });
  const cuda::CUdeviceptr device =
      mapped ? driver::mapped_device_pointer(pointer, [&] { CUEMM_CU_RESULT(cuMemHostUnregister, pointer); }) : 0;
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  // Unpinned as soon as released, not queued, as Numba's _pin_finalizer does
  // and the proposal describes: a range may be pinned again at once, under
  // defer_cleanup() too. The owner is kept until then, so its memory cannot
  // go to another buffer while pinned.
  return track_new(address, size, [pointer, owner] { CUEMM_CU(cuMemHostUnregister, pointer); }, Release::at_once,
                   [&](Finalizer finalizer) -> std::shared_ptr<MemoryPointer> {
                     if (mapped)
                       return std::make_shared<MappedMemory>(&ctx, pointer, device, size, owner,
                                                             std::move(finalizer));
                     return std::make_shared<PinnedMemory>(&ctx, pointer, size, owner, std::move(finalizer));
                   });
}

std::shared_ptr<MemoryPointer> HostOnlyMemoryManager::memallocmanaged(std::size_t size, bool attach_global) {
  require_allocation_size(size, "memallocmanaged");
  Context& ctx = context();
  const unsigned flags = attach_global ? cuda::CU_MEM_ATTACH_GLOBAL : cuda::CU_MEM_ATTACH_HOST;
  ScopedContext scope(ctx);
  const cuda::CUdeviceptr pointer = with_flush_and_retry([&] {
    cuda::CUdeviceptr allocated = 0;
    CUEMM_CU_ALLOC(size, cuMemAllocManaged, &allocated, size, flags);
    return allocated;
  });
  return track_new(pointer, size, [pointer] { CUEMM_CU(cuMemFree, pointer); }, Release::deferred,
                   [&](Finalizer finalizer) -> std::shared_ptr<MemoryPointer> {
                     return std::make_shared<ManagedMemory>(&ctx, pointer, size, nullptr, std::move(finalizer));
                   });
}

}  // namespace cuemm
