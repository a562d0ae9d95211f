// cuemm/adaptors/manager_adaptor.hpp: wrapping one memory manager in another.
//
// An adaptor is itself a memory manager: it forwards every member to the
// manager it wraps (its upstream) and lets an AllocationObserver watch, or
// refuse, each allocation and release. Adaptors compose:
//
//   auto pool = std::make_unique<cuemm::PoolMemoryManager>(context);
//   auto limited = std::make_unique<cuemm::LimitingAdaptor>(context, std::move(pool), 1ull << 30);
//   auto logged = std::make_unique<cuemm::LoggingAdaptor>(context, std::move(limited), "alloc.csv");
//
// or, for every context, CUEMM_ADAPTORS=limit,log (see adaptors/compose.hpp).
// Over a manager with stream-ordered calls (StreamOrderedAllocator: the pool,
// the async manager), an adaptor's allocate(size, stream) and deallocate()
// are observed as memalloc is (Note [Stream-ordered blocks of an adaptor]).
// The pointers an adaptor returns have the upstream's kind and addresses; the
// upstream pointer is released when the adaptor's is. (Over a manager that can
// allocate without a pointer object, a RawDeviceAllocator such as the pool,
// device memory gets the adaptor's pointer alone.) Releases of memory that
// a reset() already gave back are not reported, nor releases after the adaptor
// is gone (its observer is then kept until exit, as pointers may still reach it,
// and may see an event that was under way as the adaptor went).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cuemm/error.hpp"
#include "cuemm/memory/memory_manager.hpp"
#include "cuemm/memory/raw_device_allocator.hpp"
#include "cuemm/memory/stream_ordered_allocator.hpp"

namespace cuemm {

// One allocation or release, as observers see it. Times are seconds since
// cuemm was loaded; they and the call site are filled in only for
// observers that want them (AllocationObserver::wants_times_and_call_sites).
struct AllocationRecord {
  MemoryKind kind;
  std::uintptr_t address;
  std::size_t size;
  double start;
  double end;
  std::string call_site;  // see ScopedCallSite; empty when unknown
  // The stream of a stream-ordered call (StreamOrderedAllocator); empty for
  // the plugin interface's, which have none.
  std::optional<std::uintptr_t> stream;
  // A release's: what the observer's releasing() left for its released().
  std::uint64_t ticket = 0;
};

// Names the code that is allocating, for the log and the leak report (the
// Numba bridge sets the Python caller's file and line). Per thread; nests.
class ScopedCallSite {
 public:
  explicit ScopedCallSite(std::string site);
  ~ScopedCallSite();
  ScopedCallSite(const ScopedCallSite&) = delete;
  ScopedCallSite& operator=(const ScopedCallSite&) = delete;
  static const std::string& current() noexcept;

 private:
  std::string previous_;
};

namespace detail {
// What an adaptor keeps of an allocation's record until its release, which
// is reported with times and a call site of its own: no std::string (moving
// one twice a pair was a sixth of the statistics adaptor's instructions).
struct ObservedBlock {
  MemoryKind kind;
  std::uintptr_t address;
  std::size_t size;

  // Its record, untimed. Filled field by field, not braced: GCC clears a
  // braced record of 96 bytes whole with `rep stos` before filling it (4 ns,
  // a tenth of the statistics adaptor's pair; docs/pool-measurements.md).
  AllocationRecord record() const {
    AllocationRecord record;
    record.kind = kind;
    record.address = address;
    record.size = size;
    record.start = record.end = 0.0;
    return record;
  }
};
}  // namespace detail

class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  // Before the upstream is asked; throwing refuses the allocation.
  virtual void before_allocation(MemoryKind /*kind*/, std::size_t /*size*/) {}
  // The upstream ran out of memory (its `attempt`th try at this allocation):
  // whether to ask it again. Called outside every lock of the adaptor's; the
  // allocation fails once this says false (or throws).
  virtual bool retry_after_out_of_memory(MemoryKind /*kind*/, const OutOfMemory& /*error*/, int /*attempt*/) {
    return false;
  }
  // The upstream failed after before_allocation() accepted.
  virtual void allocation_failed(MemoryKind /*kind*/, std::size_t /*size*/) noexcept {}
  virtual void allocated(const AllocationRecord& /*record*/) noexcept {}
  // Before the upstream has the block back, for observers that say
  // wants_releasing(): once the upstream has it, another thread may be given
  // the same address, and its allocated() may come before this release's
  // released(). An observer that keys blocks by address, or orders events,
  // acts here (Note [A release seen before the upstream has the block]).
  // released() follows, after the upstream, unless a reset() came between.
  virtual void releasing(AllocationRecord& /*record*/) noexcept {}
  virtual void released(const AllocationRecord& /*record*/) noexcept {}
  // Asked once, as the adaptor is made: whether releasing() is called (a
  // section of the reset gate more for each release, where it is).
  virtual bool wants_releasing() const noexcept { return false; }
  // Everything was given back by a reset; no release of it will be reported.
  virtual void reset() noexcept {}
  // Whether records carry start, end and call_site (asked once, as the
  // adaptor is made, as wants_durations() is). Reading the clock and
  // copying the call site cost more than counting does: observers that only
  // count say false and records then hold zero times and no call site.
  virtual bool wants_times_and_call_sites() const noexcept { return true; }
  // Where it wants them: whether allocations' records carry their end too,
  // and releases' their times and call site (the log's Elapsed and Free rows).
  // An observer that needs only when and where a block was allocated (the
  // tracking adaptor) says false: one clock read a pair rather than four,
  // and that of the coarse clock (the start within a few milliseconds).
  virtual bool wants_durations() const noexcept { return true; }
};

// The most adaptors stacked on one manager (a constructor refuses more).
inline constexpr int kMostStackedAdaptors = 12;

class ManagerAdaptor : public BaseMemoryManager, public StreamOrderedAllocator {
 public:
  ManagerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                 std::shared_ptr<AllocationObserver> observer);
  ~ManagerAdaptor() override;

  std::shared_ptr<MemoryPointer> memalloc(std::size_t size) override;
  std::shared_ptr<MemoryPointer> memhostalloc(std::size_t size, bool mapped, bool portable, bool wc) override;
  std::shared_ptr<MemoryPointer> mempin(std::shared_ptr<const void> owner, void* pointer, std::size_t size,
                                        bool mapped) override;
  std::shared_ptr<MemoryPointer> memallocmanaged(std::size_t size, bool attach_global) override;
  void initialize() override { upstream_->initialize(); }
  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) override;
  MemoryInfo get_memory_info() override { return upstream_->get_memory_info(); }
  // Forgets the observer's counts and resets the upstream, while allocations
  // and frees (the upstream's calls in them included) wait: those under way
  // end first, those that come meanwhile begin after. Refused (StateError)
  // from inside one of them: an out-of-memory handler of an adaptor below.
  void reset() override;
  CleanupGuard defer_cleanup() override { return upstream_->defer_cleanup(); }
  int interface_version() const override { return upstream_->interface_version(); }

  BaseMemoryManager& upstream() const noexcept { return *upstream_; }

  // StreamOrderedAllocator: the upstream's calls, observed. allocate() throws
  // NotSupported where the upstream has none. deallocate() refuses (says so
  // on stderr, frees and reports nothing, counts it in refused_frees()) a
  // pointer that no block from this adaptor's allocate() starts at, freed
  // already or given back by a reset(), and a size other than the block's.
  cuda::CUdeviceptr allocate(std::size_t size, cuda::CUstream stream) final;
  void deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept final;
  bool serves_stream_ordered() const noexcept override { return stream_ordered_upstream_ != nullptr; }
  std::uint64_t refused_frees() const noexcept;

  // For a caller that keeps an object of its own per allocation (the Python
  // bridge): memalloc without the adaptor's own pointer. Over a
  // RawDeviceAllocator (the pool) that is a bare block, no pointer object at
  // all; over other managers, the upstream's pointer. The allocation is
  // observed as usual; the caller must let go of it only through
  // release_unwrapped(), once, while this adaptor exists.
  struct Unwrapped {
    std::shared_ptr<MemoryPointer> memory;  // the upstream's pointer; empty for a bare block
    detail::ObservedBlock block;            // its kind, address and size (a bare block's too)
    std::uint64_t generation = 0;
    RawDeviceAllocator::Releaser releaser{};  // gives a bare block back; its release is null otherwise

    bool held() const noexcept { return memory || releaser.release; }
    std::uintptr_t handle() const noexcept { return memory ? memory->handle() : block.address; }
  };
  Unwrapped memalloc_unwrapped(std::size_t size);
  // Lets go of the allocation and reports the release (once: later calls do nothing).
  void release_unwrapped(Unwrapped& allocation) noexcept;

 protected:
  AllocationObserver& observer() const noexcept;

 private:
  // What the upstream gave (its pointer, or a RawDeviceAllocator's block),
  // observed: asked of the observer first, reported after.
  template <typename Upstream>
  struct Observed {
    Upstream upstream;
    detail::ObservedBlock block;
    std::uint64_t generation;
  };
  // `keep(upstream, block, generation)` runs once the block is made and its
  // record ready, before it is reported; throwing gives the block back.
  template <typename Allocate, typename Keep>
  auto allocate_observed(MemoryKind kind, std::size_t size, Allocate&& allocate, Keep&& keep)
      -> Observed<decltype(allocate())>;
  template <typename Allocate>
  std::shared_ptr<MemoryPointer> observe(MemoryKind kind, std::size_t size, Allocate&& allocate);
  std::shared_ptr<MemoryPointer> observe_raw(std::size_t size);

  struct Shared;  // what the pointers handed out need, as they may outlive the adaptor
  struct StreamOrderedBlocks;  // allocate(size, stream)'s blocks until their deallocate()

  std::unique_ptr<BaseMemoryManager> upstream_;
  RawDeviceAllocator* raw_upstream_ = nullptr;  // the upstream, where it can allocate without a pointer
  StreamOrderedAllocator* stream_ordered_upstream_ = nullptr;  // the upstream, where its stream-ordered calls work
  std::unique_ptr<StreamOrderedBlocks> stream_ordered_blocks_;
  std::shared_ptr<Shared> shared_;  // holds the observer
};

// The first adaptor of type `Adaptor` in the chain starting at `manager`
// (itself included), or null.
template <typename Adaptor>
Adaptor* find_adaptor(BaseMemoryManager& manager) {
  for (BaseMemoryManager* current = &manager; current;) {
    if (auto* found = dynamic_cast<Adaptor*>(current)) return found;
    auto* adaptor = dynamic_cast<ManagerAdaptor*>(current);
    current = adaptor ? &adaptor->upstream() : nullptr;
  }
  return nullptr;
}

// Seconds on the adaptors' clock.
double adaptor_clock() noexcept;

}  // namespace cuemm
