// pool/core.hpp: PoolMemoryManager::Core, the pool's state and its paths,
// which the pointers' finalizers reach. Its fast paths (a block from the
// thread's cache, a free into it) are defined here, inline; the rest lives
// beside it, one file a part:
//
//   quarantine.cpp       freed blocks waiting for the GPU, and their way back
//   segments.cpp         growth and release: shared, small and expandable segments
//   shared_requests.cpp  requests under the pool's lock: the index, segments of their own
//   thread_caches.cpp    the caches' slow paths: misses, spills, a thread's end
//   held_blocks.cpp      large blocks in the thread caches
//   stream_ordered.cpp   allocate(size, stream) and deallocate(..., stream)
//
// pool_memory_manager.cpp is the manager itself, the notes in
// cuemm/managers/pool_memory_manager.hpp say why blocks come and go,
// thread_cache.hpp is one thread's bookkeeping, and foreign_frees.hpp the
// queue of large frees from threads that did not take the blocks.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cuemm/managers/pool_memory_manager.hpp"
#include "cuemm/driver/driver.hpp"
#include "cuemm/managers/detail/dedicated_segments.hpp"
#include "cuemm/managers/detail/expandable_arena.hpp"
#include "cuemm/managers/detail/rent_or_buy.hpp"
#include "cuemm/managers/detail/replay_clock.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"
#include "cuemm/managers/detail/size_classes.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "foreign_frees.hpp"
#include "raw_free_checker.hpp"
#include "thread_cache.hpp"
#include "threading/owner_biased_lock.hpp"
#include "util/environment.hpp"
#include "util/hex_address.hpp"
#include "util/keep_until_exit.hpp"
#include "util/owned_counter.hpp"
#include "util/round_up.hpp"
#include "util/thread_slots.hpp"

namespace cuemm {

// Everything the pointers' finalizers reach. A finalizer holds a raw pointer
// to its Core (so it fits std::function's inline storage: no allocation), and
// Cores are never deleted: reset and destruction retire them, and a retired
// Core ignores late finalizers.
struct PoolMemoryManager::Core : std::enable_shared_from_this<PoolMemoryManager::Core> {
  using Freed = detail::Freed;
  using ThreadCache = detail::ThreadCache;
  static constexpr auto kHeldCapacity = detail::kHeldCapacity;
  static constexpr auto kMaximumBinCapacity = detail::kMaximumBinCapacity;
  static constexpr auto kMinimumBinCapacity = detail::kMinimumBinCapacity;
  static constexpr auto kOrderedLargeCapacity = detail::kOrderedLargeCapacity;

  static constexpr std::size_t kMinimumGrowth = std::size_t{8} << 20;
  // No device holds more; growth for larger requests fails at once, before
  // rounding them to pages would wrap past 2^64.
  static constexpr std::size_t kLargestGrowth = std::size_t{1} << 62;
  // Note [Small blocks apart]: a small segment that a loop's seals bought
  // holds 4 of the request or as many as the loop's ring, in whole pages, up
  // to a quarter of the default thread cache budget (a ring of 1 MiB blocks
  // seals 128 at a time: it reaches that batch from 64).
  static constexpr std::size_t kLargestBoughtSmallSegment = std::size_t{64} << 20;
  // Free blocks of the initial segment's that a new small segment looks at
  // (a bound, so that it stays O(1)).
  static constexpr int kCarveLooks = 8;
  // Free blocks that a request in the expandable arena looks at for one whose
  // pages are mapped (a bound, so that allocation stays O(1)).
  static constexpr int kMappedLooks = 32;
  // A thread's ring with this many blocks of a class may be sealed for its own
  // next request when the index is empty; a seal costs one stream query. (64
  // before the cache budget went to 256 MiB: 1 MiB loops then sealed every 64
  // pairs, now every 128.)
  static constexpr std::uint32_t kRingBatchWorthSealing = 128;
  // Or this fraction of its capacity: a loop's ring settles at the batch it
  // seals, and half paid the fewest stream queries without the threads' rings
  // taking much of the pool (docs/pool-measurements.md).
  static constexpr std::uint32_t kRingFractionWorthSealing = 2;
  // Segments of their own that rotate to save stream queries (see allocate_dedicated()):
  // idle bytes, idle count, and the stream queries that buy one more.
  static constexpr std::size_t kRotationBudget = std::size_t{32} << 20;
  static constexpr std::size_t kMaximumRotation = 8;
  static constexpr std::size_t kMinimumRotation = 4;  // whatever their size
  // Beyond its cache budget a thread may rotate through up to 32 large blocks,
  // within 2 GiB and a 16th of the device's memory (Core::held_rotation_budget).
  // With 16 threads of 64 MiB pairs on the H100 a freed block became safe about
  // 3.2 us after its free, however long the rotation, so a rotation must last
  // that long: 8 blocks within 512 MiB 19.2 ns a pair in aggregate, 16 within
  // 1 GiB 12.0, 24 within 1.5 GiB 8.7, 32 within 2 GiB 6.3 (16 over one
  // thread's 6.8x, 9.0x, 11.3x; docs/pool-measurements.md).
  static constexpr std::size_t kMaximumHeldRotationBeyondBudget = 32;
  static constexpr std::size_t kLargestHeldRotationBudget = std::size_t{2} << 30;
  static constexpr std::size_t kDeviceFractionOfHeldRotationBudget = 16;  // at most a 16th of the device
  // A thread's rotation of blocks it holds pays a stream query per rotation:
  // within its cache budget it may hold eight times as many (4 MiB pairs at 16
  // threads: 8 blocks 20-26 ns a pair, 32 blocks 7.0-8.8, 64 blocks 3.9
  // against 32's 5.4, from one thread 45 against 62: docs/pool-measurements.md).
  static constexpr std::size_t kMaximumHeldRotation = 8 * kMaximumRotation;
  // A thread holds up to two rotations: loops that alternate between two large sizes keep both.
  static_assert(kHeldCapacity == 2 * kMaximumHeldRotation, "a thread cache holds two rotations");
  // Requests in a row whose block was found behind held blocks of other sizes,
  // after which those go back to the pool: a thread that moved on to another
  // size left them idle, and every request scanned past them (H100, 4 MiB
  // pairs after the pool had served 64 MiB ones: 66 -> 117 ns a pair). Loops
  // that take turns, each for fewer requests, keep both rotations.
  static constexpr std::uint32_t kSkipsBeforeGivingBack = 4096;
  // Seals that cost about what a segment's cuMemAlloc does (RentOrBuy): 256
  // of 0.5-0.6 us each (an event recorded for the context and queried,
  // H100) against 0.1-0.2 ms.
  static constexpr std::size_t kSealsWorthASegment = 256;
  // Requests in a row of one kind (a size from the index, a segment of its
  // own) from which a thread counts as a loop over them.
  static constexpr std::uint32_t kHitsOfALoop = 4;
  // Note [Rings set aside]: a window of ring misses, the frees into the
  // rings per miss below which they are set aside, and for how many misses.
  static constexpr std::uint32_t kRingMissWindow = 128;
  static constexpr std::uint32_t kRingFreesPerMiss = 2;
  static constexpr std::uint32_t kRingsAsideFor = 16384;
  static bool set_rings_aside_if_missed(ThreadCache& cache, int size_class) noexcept {
    std::lock_guard cache_lock(cache.lock.owner());
    return cache.count_ring_miss(size_class, kRingMissWindow, kRingFreesPerMiss, kRingsAsideFor);
  }
  // Requests that found a held block since the last that found none, below
  // which a thread is not looping over its held sizes (see allocate_large()).
  // Random sizes find held blocks four times in a row often enough that a
  // thread so counted kept 170 MiB held while it grew the pool past its
  // peak (RMM's workload up to 64 MiB with 256 MiB live, simulated, seeds
  // 1-16: 1.091, worst seed 1.188, at 4; at 8 or 16, 1.077, worst 1.094).
  static constexpr std::uint32_t kHeldHitsOfALoop = 8;
  // Threads' seals closer than this share one (a seal's stream query costs
  // 0.2-0.4 us on the H100 machine, and queries from many threads queue). Short
  // enough that a fast loop's half ring (256 pairs of 256 B, about 5 us there
  // at 20 ns a pair) does not miss its seal: with 5 us it did, as pairs got faster.
  static constexpr std::chrono::microseconds kSealInterval{2};
  // Note [A quarantine kept small]: a freed block waiting in the quarantine
  // for its seal cannot merge with its free neighbours, so a request meanwhile
  // splits another hole. Once the quarantine holds more than this share of
  // what the pool reserves, a free into it seals (at most one seal every
  // kSealInterval, so a pair costs at most a stream query per interval, and
  // a Python caller a hand-over of the GIL) and returns its safe part to the
  // index. That is the frees of blocks beyond the size classes that no
  // thread holds, every free without thread caches, and a thread's frees
  // while its rings are set aside (Note [Rings set aside]); not the halves
  // of full rings. An eighth let a queue freed oldest first keep about 30 of
  // its blocks apart. Simulated driver, seeds 1-8, peak reserved over live,
  // an eighth -> a 64th: the pool, RMM's workload up to 4 MiB with 128 MiB
  // live 1.350 -> 1.315; without thread caches 1.336 -> 1.305, a queue up to
  // 1 MiB 1.182 -> 1.155, up to 256 KiB with 64 MiB 1.146 -> 1.129; the
  // expandable pool up to 1 MiB with 512 MiB live 1.134 -> 1.111, per-layer
  // training 1.108 -> 1.075 (its queue 1.041 -> 1.055); the rest within
  // 0.015 either way (docs/pool-measurements.md).
  static constexpr std::size_t kQuarantineShareOfReserved = 64;
  bool quarantine_holds_much() const noexcept {
    return quarantined_bytes > reserved_bytes() / kQuarantineShareOfReserved;
  }

  Context* context;
  PoolOptions options;
  // The pool's lock. Whoever takes it or gives it up takes in the large
  // blocks that other threads queued (Note [Large frees from another
  // thread]), so that every path under it finds them in the quarantine.
  class PoolMutex {
   public:
    explicit PoolMutex(Core& core) noexcept : core_(core) {}
    void lock() {
      mutex_.lock();
      taken();
    }
    bool try_lock() {
      if (!mutex_.try_lock()) return false;
      taken();
      return true;
    }
    void unlock() {
      core_.take_in_foreign_frees();  // (queued while it held the lock)
      mutex_.unlock();
    }
    // Whether another thread took the lock last (and so is at work in the pool).
    bool taken_last_by_another_thread() const noexcept {
      return last_holder_.load(std::memory_order_relaxed) != this_thread_token();
    }

   private:
    void taken() noexcept {
      // (Stored only where it changes, on a line of its own: a freeing
      // thread reads it at each large free, as its holder locks again.)
      if (last_holder_.load(std::memory_order_relaxed) != this_thread_token())
        last_holder_.store(this_thread_token(), std::memory_order_relaxed);
      core_.take_in_foreign_frees();
    }
    static const void* this_thread_token() noexcept {
      static thread_local const char token = 0;
      return &token;
    }
    Core& core_;
    BlockingAwareMutex mutex_;
    alignas(64) std::atomic<const void*> last_holder_{nullptr};
  };
  mutable PoolMutex mutex{*this};
  detail::TlsfBlockAllocator blocks{kBlockGranularity};
  // With options.small_blocks_apart, the blocks up to kLargestCachedSize, in
  // small segments (Note [Small blocks apart]); some carved from the
  // initial segment, which is a region of `blocks`.
  detail::TlsfBlockAllocator small_blocks{kBlockGranularity};
  std::unordered_set<std::uintptr_t> carved_small_segments;
  std::size_t carved_small_bytes = 0;
  std::optional<detail::TlsfBlockAllocator::Region> initial_segment;
  detail::DedicatedSegments dedicated;  // Note [Dedicated segments]
  // With options.split_spares: spares split for requests of sizes that came
  // before (Note [Recurring large sizes]), and the exact sizes asked for
  // segments of their own.
  detail::TlsfBlockAllocator recurring{kBlockGranularity};
  std::unordered_set<std::size_t> large_sizes_seen;
  std::unique_ptr<detail::ExpandableArena> arena;  // with options.expandable (Note [Expandable arena])
  // With options.assemble_blocks: the blocks assembled from the free ends of
  // the arena's pages (Note [Assembled blocks]), by address, and the pieces of
  // them that `blocks` holds allocated meanwhile.
  struct AssembledBlock {
    std::size_t bytes;        // as the index rounds requests
    std::uintptr_t tail;      // its piece at a page's free end (0: none)
    std::uintptr_t head;      // its piece at a page's free start (0: none)
    std::size_t own_bytes;    // the rest: the bytes of its own pages it uses
    std::size_t own_pages;    // (counted in driver_frees when they go)
  };
  std::unordered_map<std::uintptr_t, AssembledBlock> assembled;
  std::size_t assembled_own_bytes = 0;  // of all of them
  std::size_t blocks_assembled = 0;     // PoolStatistics'
  // Free blocks that a request near the peak looks at for pages' free ends.
  static constexpr int kAssemblyLooks = 64;
  // Near the peak means within this fraction of it, or past it.
  static constexpr std::size_t kAssemblySlackDivisor = 4;
  detail::ReuseEpochs epochs{context};
  struct Quarantined {
    std::uintptr_t address;
    std::size_t size;
    std::uint64_t epoch;
    bool dedicated;
  };
  std::deque<Quarantined> quarantine;  // freed, waiting for the GPU; oldest first
  // Whether the quarantine may hold blocks, for a look without the lock: a
  // loop of one class (whose frees stay in its thread's ring) then does not
  // take the pool's lock at every seal to find the quarantine empty.
  std::atomic<bool> quarantine_may_hold{false};
  std::size_t quarantined_bytes = 0;
  std::uint64_t newest_quarantined_epoch = 0;  // of any block it took in (seal_for_quarantine())
  std::size_t quarantined_segment_bytes = 0;  // the part in segments of their own
  std::size_t quarantined_segments = 0;
  // The seals that requests for a segment of their own (for a block from
  // the index) pay, which buy one more (see allocate_dedicated()).
  detail::RentOrBuy segment_rental;
  detail::RentOrBuy index_rental;
  std::size_t largest_request_grown_for = 0;  // by grow()
  std::size_t driver_allocations = 0, driver_frees = 0, spares_taken_over = 0;  // PoolStatistics'
  std::size_t peak_reserved = 0;  // the most reserved_bytes() after any growth (raise_peak_after_growth())
  // Note [Growth while the GPU is busy]: the bytes the pool grew past its
  // peak rather than wait, whether the growth under way was decided so, and
  // how often.
  std::size_t busy_overshoot = 0;
  // The room past the peak is PoolOptions::busy_overshoot times this: it
  // doubles, up to kMostBusyRoomWidening, each time a request finds the room
  // too narrow while the GPU is busy, and is 1 again once the GPU reads idle
  // at such a decision.
  double busy_room_widening = 1;
  static constexpr double kMostBusyRoomWidening = 2;
  bool growing_while_busy = false;
  // Whether the room forced this request to wait: the GPU then reads idle
  // because the pool waited, which says nothing of the program's pace.
  bool room_forced_a_wait = false;
  std::size_t gpu_waits_avoided = 0;  // PoolStatistics'
  std::size_t queued_large_frees = 0;  // PoolStatistics': taken in from foreign_frees
  std::size_t queued_small_frees = 0;  // PoolStatistics': the same, of the size classes
  std::vector<std::unique_ptr<ThreadCache>> caches;
  int defer_depth = 0;
  cuda::CUevent ordering_event = nullptr;  // order_after()'s
  // Read by every thread's pairs, written seldom: a line of their own, away
  // from the fields written under `mutex` and from last_seal.
  // Large frees that did not go through their thread's lent blocks (ThreadCache::Lent).
  alignas(64) std::atomic<std::uint64_t> large_frees_elsewhere{0};
  detail::ForeignFrees foreign_frees;  // Note [Large frees from another thread]
  // Whether the quarantine wanted a seal when it last took in such a free.
  std::atomic<bool> foreign_free_wanted_seal{false};
  // Read at every free and every fast path: a line of its own, away from
  // the flag above, which the pool's lock holder writes.
  alignas(64) std::atomic<bool> retired{false};
  // For util::ThreadSlots: every fast path compares it with its thread's last slot.
  const std::uint64_t thread_slots_id_ = util::next_thread_slots_id();
  // Bytes a thread's rotation of large blocks may take beyond its cache
  // budget: kLargestHeldRotationBudget within a 16th of the device's memory,
  // which initialize() reads (until then, a 16 GiB device's). Written once.
  std::atomic<std::size_t> held_rotation_budget{std::size_t{1} << 30};
  alignas(64) std::atomic<std::int64_t> last_seal{0};  // steady_clock ticks; written at each seal

  Core(Context* context_, PoolOptions options_) : context(context_), options(options_) {}

  // Thrown instead of growing a retired core: a reset() from another thread
  // retired it while this request was under way, and its memory is gone.
  // The slow paths catch it and ask the successor (Note [Resets under way]).
  // Not a std::exception, so that nothing on the way mistakes it.
  struct Retired {};
  // The core that replaced this one at a reset (null until then, and for
  // a core retired by the manager's end).
  std::atomic<Core*> successor{nullptr};
  // The core that last served a request of this thread in its successor's
  // place; cleared by callers that need the serving core (memalloc's
  // finalizer frees into it).
  [[gnu::tls_model("initial-exec")]] static inline thread_local Core* forwarded_to = nullptr;
  // A request this retired core could not serve, to the newest core: one
  // successor at a time, a thread that fell behind resets made in a loop
  // never caught up, and recursed until its stack ran out. Tries again, in
  // a loop, where a reset retired that one too meanwhile.
  // (`ordered`: a stream-ordered request, on the stream that `stream` tags.)
  [[gnu::noinline, gnu::cold]] std::uintptr_t forward(std::size_t size, int size_class, bool ordered,
                                                       std::uint64_t stream = detail::kDefaultStreams);
  // Whether this thread is in forward(): Retired then goes to its loop.
  [[gnu::tls_model("initial-exec")]] static inline thread_local bool forwarding = false;
  // serve(), or where it met Retired, forward() (the slow paths' entries).
  template <typename Serve>
  std::uintptr_t serve_or_forward(std::size_t size, int size_class, bool ordered, Serve&& serve,
                                  std::uint64_t stream = detail::kDefaultStreams) {
    try {
      return serve();
    } catch (const Retired&) {
      if (forwarding) throw;
      return forward(size, size_class, ordered, stream);
    }
  }
  // Every growth calls this first, under `mutex` (as retire() sets
  // `retired`): a retired core's new segment would never be freed.
  void refuse_growth_if_retired() const {
    if (retired.load(std::memory_order_relaxed)) [[unlikely]]
      throw Retired{};
  }

  // --- under `mutex` ---

  void quarantine_block(std::uintptr_t address, std::size_t size, std::uint64_t epoch,
                        bool in_segment_of_its_own = false);

  std::size_t reserved_bytes() const noexcept {
    return (arena ? arena->mapped_bytes() : blocks.region_bytes()) + small_segment_bytes() + dedicated.bytes() +
           recurring.region_bytes();
  }
  // The small segments' bytes not carved from the initial segment.
  std::size_t small_segment_bytes() const noexcept {
    return small_blocks.region_bytes() - carved_small_bytes;
  }
  std::size_t segment_count() const noexcept {
    return blocks.region_count() + small_blocks.region_count() - carved_small_segments.size() +
           recurring.region_count() + dedicated.count();
  }
  // Whether requests of `size` bytes come from the small segments.
  bool is_small(std::size_t size) const noexcept {
    return options.small_blocks_apart && !options.expandable && size <= detail::kLargestCachedSize;
  }
  // Whether taking `more` bytes from the driver would take the pool past its peak footprint.
  bool passes_peak(std::size_t more) const noexcept { return reserved_bytes() + more > peak_reserved; }
  // With options.assemble_blocks: whether taking `more` would take the pool
  // near its peak, where it places blocks for footprint rather than for
  // fewer driver calls (Note [Assembled blocks]).
  bool assembles_near_peak(std::size_t more) const noexcept {
    return options.assemble_blocks && passes_peak(more + peak_reserved / kAssemblySlackDivisor);
  }

  // The bytes of the block handed out at `address` (0 if none), and whether
  // it has a segment of its own.
  struct BlockAt {
    std::size_t bytes;
    bool dedicated;
  };
  BlockAt block_at(std::uintptr_t address) const;

  // Defers `block` to the quarantine; without host memory to, waits for the
  // GPU's work before its free and then reuses it, rather than leak it or
  // hand it out under that work. Returns whether it is in the quarantine.
  bool quarantine_or_reuse(const Quarantined& block) noexcept;

  // A safe block goes back to the index, or to the spares.
  void reuse(const Quarantined& block);

  // A block of the shared segments, the small segments or the spares split
  // for recurring sizes goes back to its index. (The threads hold no block
  // of the spares' index today, its sizes wanting segments of their own, but
  // a held block going back through the shared segments' index alone would
  // stay allocated there for good: an experiment that gave such blocks to
  // the threads lost 245 MiB that way.)
  void deallocate_in_index(std::uintptr_t address) {
    if (!assembled.empty() && give_back_assembled(address)) return;
    if (recurring.allocated_blocks() && recurring.deallocate(address)) {
      return_whole_recurring_regions();
      return;
    }
    if (small_blocks.allocated_blocks() && small_blocks.deallocate(address)) return;
    blocks.deallocate(address);
  }

  // The spares that recurring requests split, once whole again, are spares
  // again (or go back to the driver, without host memory to keep them).
  void return_whole_recurring_regions() noexcept;

  // Gives a dedicated segment's memory back to the driver (its context current).
  void free_segment_memory(std::uintptr_t base) noexcept {
    ++driver_frees;
    CUEMM_CU_RESULT(cuMemFree, base);
  }

  void free_segment(std::uintptr_t base) noexcept {
    dedicated.forget(base);
    ScopedContext scope(*context);
    free_segment_memory(base);
  }

  void free_segments(const std::vector<detail::DedicatedSegments::Segment>& segments) noexcept {
    if (segments.empty()) return;
    ScopedContext scope(*context);
    for (const auto& segment : segments) free_segment_memory(segment.base);
  }

  void seal() noexcept { epochs.seal(); }
  // seal(), under `mutex`, unless another thread is sealing: then its seal,
  // where that covers the quarantine's blocks, without a second one. In a
  // hand-over the freeing thread seals at its frees (Note [Large frees from
  // another thread]), and the allocating thread slept on the epochs' lock
  // behind that seal, then sealed again. (With the lock free, seal(): it
  // also covers the caller's held blocks, which its rotation waits for.)
  void seal_for_quarantine() noexcept { epochs.seal_or_join(newest_quarantined_epoch); }

  // Looks for completed epochs (with `wait`, waits for all), then returns the
  // safe part of the quarantine to the index.
  // Returns the bytes reclaimed.
  std::size_t reclaim(bool wait) {
    epochs.poll(wait);
    return reclaim_quarantine();
  }
  // Waits for the GPU one sealed epoch at a time, oldest first, returning
  // the quarantine's safe part after each, until take() finds a block: the
  // work queued after the frees it needed keeps running (reclaim(true)
  // waits for all of it). What take() last found, once nothing is pending.
  template <class Take>
  auto wait_for_freed(Take take) -> decltype(take()) {
    while (epochs.wait_for_oldest()) {
      reclaim_quarantine();
      if (auto found = take()) return found;
    }
    reclaim_quarantine();
    return take();
  }

  std::size_t reclaim_quarantine();

  // A seal if one is due, then the quarantine's safe part back to the index.
  // A failed poll leaves the quarantine as it is, for a later one.
  void seal_and_reclaim() noexcept {
    try {
      seal_if_due();
      reclaim(false);
    } catch (...) {
    }
  }

  // --- without `mutex` ---

  // Seals the open epoch (at most every kSealInterval: with many threads one
  // seal covers them all) and looks for completed ones. The epochs have a
  // lock of their own, so the seal's stream query does not hold up the pool;
  // a thread that finds another sealing skips it. Then the quarantine's safe
  // blocks go back to the index, unless another thread holds the pool's lock.
  // (Sealing at once whenever a thread's oldest cached block was still in the
  // open epoch made 1 MiB pairs 3x faster on the H100, but RMM's random
  // workload up to 1 MiB then reserved 1.229x its live bytes, not 1.146x.)
  // Returns whether this thread sealed.
  bool advance_epochs() {
    const bool sealed = seal_if_due();
    epochs.try_poll();
    if (quarantine_may_hold.load(std::memory_order_relaxed)) {
      std::unique_lock lock(mutex, std::try_to_lock);
      if (lock.owns_lock()) reclaim_quarantine();
    }
    return sealed;
  }

  // steady_clock's ticks, or a replay's own clock (detail::replay_clock).
  static std::int64_t now_ticks() noexcept {
    if (const std::atomic<std::int64_t>* replay = detail::replay_clock.load(std::memory_order_relaxed))
      return replay->load(std::memory_order_relaxed);
    return std::chrono::steady_clock::now().time_since_epoch().count();
  }

  bool seal_if_due() noexcept {
    const std::int64_t now = now_ticks();
    const std::int64_t interval = std::chrono::steady_clock::duration(kSealInterval).count();
    // (A latest seal more than an interval ahead of now was made by a replay's
    // clock, set or cleared since: due, rather than held back until now
    // catches up. Threads' reads of now race by far less.)
    const std::int64_t since = now - last_seal.load(std::memory_order_relaxed);
    if ((since < interval && since >= -interval) || !epochs.try_seal()) return false;
    last_seal.store(now, std::memory_order_relaxed);
    return true;
  }

  // --- under `mutex` ---

  // Moves every block of one thread's cache into the quarantine; the caller
  // holds the cache's lock (or the cache's thread has finished).
  // Its stream-ordered blocks are tagged with the open epoch: their freeing
  // work is on a default stream, which the next seal's event covers.
  void quarantine_cached_blocks(ThreadCache& cache) noexcept {
    const std::uint64_t epoch = epochs.tag();
    quarantine_ring_blocks(cache, -1, epoch);
    quarantine_ordered_large(cache, epoch);
    quarantine_held_blocks(cache);
  }

  // The same for the blocks of its rings and ordered bins only, but for its
  // latest request's class (which a loop is using). The class of the
  // request that takes them back (`wanted`, -1: none), if that thread kept
  // blocks of it and never asked for it, goes to the pool at its later frees
  // (Note [Classes a thread frees for others]).
  void quarantine_idle_ring_blocks(ThreadCache& cache, int wanted) {
    if (wanted >= 0 && wanted != cache.latest_class) {
      using Taker = ThreadCache::Bin::Taker;
      ThreadCache::Bin& bin = cache.bins[wanted];
      if (bin.count > 0 && bin.taker == Taker::unknown) bin.taker = Taker::others;
    }
    quarantine_ring_blocks(cache, cache.latest_class, epochs.tag());
  }

  // Moves the blocks of a thread's rings, ordered bins and side streams
  // into the quarantine, but for class `kept` (-1: none) of the rings and
  // bins; stream-ordered ones get `epoch`.
  void quarantine_ring_blocks(ThreadCache& cache, int kept, std::uint64_t epoch) noexcept;
  // The blocks of a thread's ordered bins, but for class `kept`, with `epoch`; whether there were any.
  bool quarantine_ordered_bins(ThreadCache& cache, int kept, std::uint64_t epoch) noexcept;
  // The large blocks a thread keeps from its stream-ordered frees, with `epoch`; whether there were any.
  bool quarantine_ordered_large(ThreadCache& cache, std::uint64_t epoch) noexcept {
    const bool any = cache.ordered_large_count > 0;
    while (cache.ordered_large_count) {
      const ThreadCache::OrderedLarge large = cache.remove_ordered_large(cache.ordered_large_count - 1);
      quarantine_or_reuse({large.address, large.bytes, epoch, large.dedicated});
    }
    return any;
  }

  // Moves the large blocks a thread holds into the quarantine, with their
  // epochs; the caller holds `mutex` and the cache's lock.
  void quarantine_held_blocks(ThreadCache& cache) {
    while (cache.held_large_count) quarantine_held_block(cache, 0);
  }
  // The same for the held blocks that `keeps` does not keep.
  template <typename Keeps>
  void quarantine_held_unless(ThreadCache& cache, Keeps&& keeps) {
    for (std::uint32_t i = 0; i < cache.held_large_count;) {
      if (keeps(cache.held(i).block))
        ++i;
      else
        quarantine_held_block(cache, i);
    }
  }
  // The held blocks of a size that the thread holds only one of.
  void quarantine_held_strays(ThreadCache& cache) {
    quarantine_held_unless(cache, [&](const ThreadCache::OrderedLarge& block) {
      // (The blocks that a request for 8/9 of its bytes would take: within 1/8 below it, itself included.)
      return cache.count_held_large(block.bytes - block.bytes / 9, block.dedicated) > 1;
    });
  }
  // The held blocks that a request of `needed` bytes does not fit.
  void quarantine_held_misfits(ThreadCache& cache, std::size_t needed, bool dedicated) {
    quarantine_held_unless(cache, [&](const ThreadCache::OrderedLarge& block) {
      return ThreadCache::fits(block, needed, dedicated);
    });
  }
  void quarantine_held_block(ThreadCache& cache, std::uint32_t i) {
    const ThreadCache::HeldLarge& held = cache.held(i);
    quarantine_or_reuse({held.block.address, held.block.bytes, held.epoch, held.block.dedicated});
    cache.remove_held_large(i);
  }

  // Gives the safe blocks of the calling thread's own cache back to the
  // index, but for the large blocks that would serve a request of
  // `request` bytes (a loop's rotation) and the ring of `kept_class` (a
  // loop's; -1 keeps none); the caller holds `mutex`.
  void return_safe_cached_blocks(ThreadCache& cache, std::size_t request, int kept_class = -1);

  // Moves every cached block of every thread into the quarantine.
  void flush_caches() {
    for_each_other_cache(nullptr, [&](ThreadCache& cache) { quarantine_cached_blocks(cache); });
  }

  // Why the pool grows: a request found no free block, or a loop's seals
  // have cost as much as a new segment (RentOrBuy), which buys room for
  // more blocks of its size: as many as `ring_bytes`, the bytes of the
  // loop's ring, hold (small segments: Note [Small blocks apart]).
  enum class Growth { needed, bought_by_seals };

  // Takes a new segment of at least `size` bytes from the driver. Returns
  // false when the driver or the pool's maximum has no room. (The index finds
  // the new free block for a request of `size` even when it lies in the
  // request's own list: Note [Two-level segregated fit].)
  bool grow(std::size_t size, Growth growth = Growth::needed, std::size_t ring_bytes = 0) {
    if (options.expandable) return grow_arena(size);
    if (is_small(size)) return grow_small(size, growth, ring_bytes);
    return grow_shared(size).has_value();
  }

  // grow() for the shared segments; the region they grew by, or nullopt.
  std::optional<detail::TlsfBlockAllocator::Region> grow_shared(std::size_t size);

  // A new driver allocation of `segment` bytes (or of `wanted`, where that
  // many do not fit the pool's maximum or the driver), made a region of
  // `index`; nullopt when not even `wanted` fits.
  std::optional<detail::TlsfBlockAllocator::Region> add_new_segment(detail::TlsfBlockAllocator& index,
                                                                     std::size_t wanted, std::size_t segment);

  // One more small segment (Note [Small blocks apart]): carved from the
  // initial segment's free space if it has room, else from the driver.
  bool grow_small(std::size_t size, Growth growth, std::size_t ring_bytes);

  // A small segment of up to `segment` bytes from the initial segment's free
  // space (looking at a few of its free blocks only); whether there was room.
  bool carve_small_segment(std::size_t segment);

  // Gives the entirely free small segments back: those carved from the
  // initial segment to it, the others to the driver. Returns the bytes that
  // left the pool.
  std::size_t release_free_small_segments() noexcept;
  // Gives the entirely free shared segments back to the driver (the arena's
  // pages are another matter: shrink_arena()). Returns their bytes.
  std::size_t release_free_shared_segments() noexcept;

  // Before one kind of segment (small with `small`, else shared) takes the
  // pool past its peak, the other kind's entirely free segments go back with
  // the spares (give_back_spares_within_peak()); not while the GPU is busy,
  // as cuMemFree would wait for it. (That is asked once, and only where there
  // is something to give back: the answer decides how the growth counts,
  // Note [Growth while the GPU is busy].) The two kinds otherwise peak apart,
  // each growing beside what the other left free. (Simulated, RMM's
  // workload, seeds 1-16, reserved over live, three alternated runs: up to
  // 2 MiB with 32 MiB live 1.746-1.762 -> 1.676-1.688, with 128 MiB
  // 1.265-1.289 -> 1.254-1.266, up to 8 MiB with 64 MiB 1.502-1.520 ->
  // 1.489-1.494, the seed workloads within their noise; the shared side
  // alone bought nothing: docs/pool-measurements.md.)
  void give_back_idle_segments_within_peak(bool small, std::size_t more) {
    const bool other_kind_free = !arena && (small ? blocks : small_blocks).has_free_region();
    if (!passes_peak(more) || (!other_kind_free && dedicated.spare_bytes() == 0) || grows_rather_than_waits(more))
      return;
    if (other_kind_free) {
      if (small)
        release_free_shared_segments();
      else
        release_free_small_segments();
    }
    free_spares_past_peak(more);
  }

  // Where the shared segments would grow past the pool's peak footprint
  // (or its maximum), a spare segment of its own that holds `size` and is
  // no larger than the `segment` that grow() would take becomes a shared
  // segment instead: memory the pool holds anyway, and no driver call. A
  // program whose sizes change between phases otherwise reserves the next
  // phase's blocks beside the last one's spares. (Simulated driver, the
  // training-like workload, seeds 1-6: 1.082-1.086 -> 1.059-1.065 reserved
  // over live, 78 -> 90 driver allocations a run on average, as later
  // requests for such a segment find no spare. RMM's workloads within their
  // noise. Any spare, whatever its size, took RMM's workload up to 64 MiB with
  // 256 MiB live from 1.17 to 1.27: small blocks split the large ones'
  // segments.) Not for the expandable arena, one range of its own. Returns
  // the spare it adopted, if any.
  std::optional<detail::TlsfBlockAllocator::Region> adopt_spare(std::size_t size, std::size_t segment) {
    auto adopted = move_spare_into(blocks, size, segment);
    if (adopted) ++spares_taken_over;
    return adopted;
  }

  // Makes the smallest spare that holds `size` bytes, if it is no larger than
  // `at_most`, a region of `index`. Returns that region, if there was one.
  std::optional<detail::TlsfBlockAllocator::Region> move_spare_into(detail::TlsfBlockAllocator& index,
                                                                     std::size_t size,
                                                                     std::size_t at_most = SIZE_MAX);

  // Gives back the largest spares until growing by `more` bytes keeps the
  // pool within its peak footprint (or no spare is left). Below its peak the
  // pool keeps its spares: they cost no more than the peak it reached, and a
  // program whose large sizes recur (a training step's activations and
  // gradients) finds them again rather than calling the driver for each.
  // (Simulated driver, means over seeds 1-8 of three runs each, before ->
  // after: driver allocations on RMM's workload up to 64 MiB with 1 GiB live
  // 8,550 -> 4,640, up to 16 MiB with 256 MiB 5,940 -> 2,380, on training
  // logs whose layers keep their sizes from step to step 636 -> 463, with
  // reserved over live 1.061 -> 1.069, 1.192 -> 1.195 and 1.256 -> 1.211;
  // before, the spares beyond 1/32 of the pool went back at each new
  // segment of their own.)
  void give_back_spares_within_peak(std::size_t more) {
    if (!passes_peak(more) || dedicated.spare_bytes() == 0 || grows_rather_than_waits(more)) return;
    free_spares_past_peak(more);
  }
  // Its giving back, once the GPU was asked: the spares over the peak.
  void free_spares_past_peak(std::size_t more) {
    if (!passes_peak(more) || dedicated.spare_bytes() == 0) return;
    const std::size_t over = reserved_bytes() + more - peak_reserved;
    const std::size_t spare = dedicated.spare_bytes();
    free_segments(dedicated.take_spares_over(spare > over ? spare - over : 0));
  }

  // Note [Growth while the GPU is busy]
  // Two things the pool does to stay within its peak footprint wait for the
  // GPU's queued work: giving spares back, as cuMemFree waits until the
  // device has run all its work, on every stream (H100,
  // bench/probes/probe_free_stall.cpp: 50 ms behind a 50 ms kernel on the
  // legacy, a blocking or a non-blocking stream, against 27-81 us idle;
  // cuMemAlloc does not wait), and waiting for freed blocks whose epochs
  // are pending. A program that queues work ahead (a training step) would
  // lose that lead each time. So where the GPU reads busy (ReuseEpochs::
  // gpu_busy(): work queued on any stream where the driver records an event
  // for the whole context, else on the legacy stream, which reads busy while
  // any blocking stream is), the pool grows instead, up to its
  // peak and then past it by at most PoolOptions::busy_overshoot of it (an
  // eighth by default); the bytes past the peak grown that way
  // (busy_overshoot) do not raise the peak that the rule keeps to, so they
  // do not compound. Beyond that, or with the GPU idle, it gives back and
  // waits as before (for the oldest epochs only, until a block fits:
  // wait_for_freed()); spares kept go back at the next growth past the peak
  // that finds the device idle, at trim(), and before an allocation fails.
  // A program whose busy steps need more room than that (training steps
  // whose layers' sizes all differ) would wait at every step, so each such
  // wait doubles the room, up to twice the option (a quarter of the peak by
  // default), until the GPU reads idle at one of these decisions (on the
  // H100, per-layer steps beside kernels: 109 ms a pass at an eighth, 95 at
  // a quarter, 92 at a half, against 72 for round sizes at any of them;
  // docs/pool-measurements.md).
  // (Before CUDA 12.5, work on non-blocking streams alone reads as idle:
  // cuMemFree may still wait for it.) Whether growing by `more` bytes,
  // rather than waiting, is right now.
  bool grows_rather_than_waits(std::size_t more) {
    growing_while_busy = false;
    const std::size_t reserved = reserved_bytes();
    busy_overshoot = std::min(busy_overshoot, past_peak(reserved));
    const double room = options.busy_overshoot * busy_room_widening;
    const bool within_room =
        reserved + more <= peak_reserved + static_cast<std::size_t>(static_cast<double>(peak_reserved) * room);
    if (!within_room && options.busy_overshoot == 0) return false;  // (no room to widen: no need to ask)
    if (!epochs.gpu_busy()) {
      if (!room_forced_a_wait) busy_room_widening = 1;
      return false;
    }
    if (!within_room) {
      if (!std::exchange(room_forced_a_wait, true))
        busy_room_widening = std::min(2 * busy_room_widening, kMostBusyRoomWidening);
      return false;
    }
    growing_while_busy = true;
    ++gpu_waits_avoided;
    return true;
  }
  // The peak after a growth: the reserved bytes but those grown past the
  // peak while the GPU was busy (a growth decided so raises it not at all).
  void raise_peak_after_growth() noexcept {
    const std::size_t reserved = reserved_bytes();
    if (std::exchange(growing_while_busy, false)) {
      busy_overshoot = past_peak(reserved);
      return;
    }
    peak_reserved = std::max(peak_reserved, reserved - std::min(busy_overshoot, reserved));
    busy_overshoot = std::min(busy_overshoot, past_peak(reserved));
  }
  std::size_t past_peak(std::size_t reserved) const noexcept {
    return reserved > peak_reserved ? reserved - peak_reserved : 0;
  }

  // grow() with options.expandable: extends the arena by what its free end
  // lacks for a block of `size`; take_block() maps the pages under the block
  // (Note [Expandable arena]).
  bool grow_arena(std::size_t size);

  // Note [Pages given back]
  // The arena's free space may lie over mapped pages or unmapped ones; a
  // block handed out has all its pages mapped (map_pages_under()). Where
  // mapping them would take the pool past its peak footprint, the pages
  // that lie wholly in free blocks are unmapped first (as many as it takes),
  // so the footprint peaks where the pages under the blocks in use peak,
  // rather than where the range's length does: a best fit that leaves a
  // large hole keeps only the hole's addresses. Below the peak nothing is
  // unmapped, so a loop does not map and unmap at each pair. (H100, means of
  // seeds 1-8, the expandable pool before -> after: RMM's random workload up
  // to 64 MiB with 256 MiB live 1.23 -> 1.12-1.16, up to 4 MiB 1.14 -> 1.11,
  // per-layer training 1.29 -> 1.19; small sizes unchanged, their holes
  // being smaller than a page: docs/pool-measurements.md.)

  // A block of the index that costs no memory: in the arena, one whose
  // pages are mapped already. Nullopt when the index has none that fits
  // (the best fit has unmapped pages, say: grow_and_take() maps them).
  std::optional<std::uintptr_t> take_block(std::size_t size);
  // In the arena: a free block whose pages are mapped, among kMappedLooks
  // that hold `size` (not only the good fit); nullopt if none.
  std::optional<std::uintptr_t> take_mapped_block(std::size_t size);

  // A block that may cost memory: the pool grows for it (in the arena, the
  // pages under the best fit are mapped, after the range grows if no free
  // block fits). Nullopt when the driver or the pool's maximum has no room.
  std::optional<std::uintptr_t> grow_and_take(std::size_t size, Growth growth = Growth::needed,
                                             std::size_t ring_bytes = 0);

  // Maps the arena's pages under [address, address + bytes) (a block just
  // taken from the index, or the initial size), giving free pages back
  // first where the pool would pass its peak or its maximum. False when the
  // driver or the maximum has no room.
  bool map_pages_under(std::uintptr_t address, std::size_t bytes);

  // Where the best fit's `new_pages` would take the pool near its peak
  // (assembles_near_peak()): a block of
  // `bytes` (more than half a page) made of a mapped page's free end and
  // another's free start, with fewer new pages between (Note [Assembled
  // blocks]). Nullopt if no pair of the free blocks it looks at saves a
  // page, or the driver has no room.
  std::optional<std::uintptr_t> assemble_block(std::size_t bytes, std::size_t new_pages);
  // An assembled block's pieces go back to the index, its own pages and
  // addresses to the driver; false if `address` is no assembled block.
  bool give_back_assembled(std::uintptr_t address) noexcept;

  // Before mapping up to `at_most` more bytes in the arena: where that would
  // pass the pool's peak, gives free pages (and spares) back first; false if
  // it would pass the pool's maximum even so.
  bool make_room_to_map(std::size_t at_most);

  // Unmaps the arena's pages that lie wholly in free blocks, largest blocks
  // first, until `bytes` are unmapped or none is left; returns the bytes.
  std::size_t unmap_free_pages(std::size_t bytes);

  // grow() for the initial size, which is reserved at once: in the arena,
  // its pages are mapped too.
  bool grow_initially(std::size_t size);

  // Gives back every spare and every entirely free shared segment.
  std::size_t release_free_segments();

  // Cuts the arena's free end and unmaps every page of its free space.
  std::size_t shrink_arena();

  // A block of `size` bytes from the index, trying in order of cost: the
  // index, completed epochs, pending epochs when they hold enough, the
  // driver, the thread caches and any pending epoch, and finally giving
  // empty segments back so that one large one fits.
  // `own` is the calling thread's cache, if it has one.
  std::uintptr_t allocate_from_index(std::size_t size, ThreadCache* own = nullptr, bool in_a_loop = false);

  // What threads other than `own` hold in classes other than their latest
  // goes back (through the quarantine); then a block of `size` from the
  // index, if that made one.
  std::optional<std::uintptr_t> take_back_idle_rings(std::size_t size, const ThreadCache* own) {
    const int wanted = detail::size_class_of(size);
    for_each_other_cache_holding(own, holds_ring_blocks,
                                 [&](ThreadCache& cache) { quarantine_idle_ring_blocks(cache, wanted); });
    seal();
    reclaim(false);
    return take_block(size);
  }

  // Returns a new segment of its own, or nullopt when the driver or the
  // pool's maximum has no room.
  std::optional<std::uintptr_t> new_dedicated_segment(std::size_t segment);

  // A block of `size` bytes in a segment of its own (Note [Dedicated
  // segments]): a spare, a spare once pending frees complete (waiting costs
  // microseconds; a new segment costs memory and a driver call of 100 us),
  // or a new segment, for which spares go back where the pool would pass its
  // peak; on out of memory, everything the other paths give back too.
  // `in_a_loop`: the thread asked for this size several times in a row,
  // freeing one each time (see ThreadCache::count_segment_request()).
  std::uintptr_t allocate_dedicated(std::size_t size, bool in_a_loop, ThreadCache* own = nullptr);

  // A block for a request that wants a segment of its own, from the free
  // space of the shared segments (this thread's safe cached blocks merged in
  // first), where a new segment would take the pool past its peak footprint:
  // that space costs nothing, while the new segment stays reserved. It is an
  // ordinary block of the index from then on (block_at()). (Simulated driver,
  // means over seeds 1-6, before -> after, expandable in brackets: RMM's
  // workload up to 64 MiB with 256 MiB live 1.177 -> 1.154 (1.195 -> 1.161),
  // up to 16 MiB 1.22 -> 1.20 (1.24 -> 1.21); the training-like workload
  // 1.08 -> 1.08 (1.078 -> 1.063); three recorded training logs 1.171 ->
  // 1.153, 1.099 -> 1.091 and 1.13 -> 1.12 (1.158 -> 1.127, 1.088 -> 1.07,
  // 1.115 -> 1.10). The ideal best fit reads 1.00 on these training logs:
  // tools/best_fit_reference.hpp.)
  std::optional<std::uintptr_t> allocate_from_index_within_peak(std::size_t size) {
    if (auto address = take_block(size)) return address;
    ThreadCache* own = cache_for_a_free();
    if (!own || own->bytes.load(std::memory_order_relaxed) == 0) return std::nullopt;
    return_safe_cached_blocks(*own, size);
    return take_block(size);
  }

  // Note [Recurring large sizes]
  // A training step's phases hold different large sizes (its activations,
  // then its parameters' gradients), each of which recurs at every step. In
  // segments of their own, the phases cannot keep each other's segments
  // within the peak: each phase gives the other's spares back to the driver
  // and buys its own again (up to 15 cuMemAlloc and cuMemFree a step on
  // training steps whose layers keep sizes of their own). With options.split_spares,
  // at the peak a request of an exact size asked for before is carved from a
  // spare instead (best fit, in an index of such spares apart from the
  // shared segments, whose small blocks would split them for good), and a
  // spare whole again is a spare again. Sizes that do not recur (RMM's
  // random ones) take the usual path, where splitting would cost them
  // footprint, as PyTorch's does. Not the default: the split spares hold
  // free space that the shared segments cannot use, where spares given back
  // let those grow within the peak (docs/pool-measurements.md).

  // Whether a segment of its own was asked for `size` bytes before (and
  // notes it). The set forgets everything when full: sizes that recur come back.
  bool saw_large_size(std::size_t size) noexcept;

  // A block of `size` bytes from the spares split for recurring sizes,
  // taking over the smallest spare that holds it when none has room.
  std::optional<std::uintptr_t> allocate_recurring(std::size_t size) {
    if (auto address = recurring.allocate(size)) return address;
    if (!move_spare_into(recurring, size)) return std::nullopt;
    return recurring.allocate(size);
  }

  // Bytes of segments of their own that may sit idle (spare, or waiting for
  // the GPU) to save stream queries in a loop of `segment`-byte requests: 1/32
  // of the pool, at least kRotationBudget, and at least room for kMinimumRotation.
  std::size_t rotation_budget(std::size_t segment) const noexcept {
    return std::max({reserved_bytes() / 32, kRotationBudget, kMinimumRotation * segment});
  }

  // Called once every cache was flushed and every free segment given back:
  // free bytes left in the segments with no block that holds the request
  // mean fragmentation, and the device's own free memory says whether
  // others hold the rest.
  OutOfMemory out_of_memory(std::size_t size) const {
    std::string detail = "the pool holds " + describe_bytes(reserved_bytes()) + " in " +
                         std::to_string(segment_count()) + " segment(s), " + describe_bytes(in_use_bytes()) +
                         " in use";
    const FreeSpace free = free_space();
    if (free.bytes > 0) {
      detail += ", " + describe_bytes(free.bytes) + " free in " + std::to_string(free.blocks) +
                " block(s), the largest " + describe_bytes(free.largest);
    }
    if (options.maximum_size) detail += "; maximum " + describe_bytes(options.maximum_size);
    if (std::string device = describe_device_memory(*context); !device.empty()) detail += "; " + device;
    return OutOfMemory("PoolMemoryManager::allocate", size, detail);
  }

  // The free space inside the pool's segments: blocks of the shared and
  // small segments and of split spares, and spare segments of their own.
  // None for the expandable arena, whose free blocks may lie over pages
  // given back: it maps what a block needs, and unmaps free pages first.
  struct FreeSpace {
    std::size_t bytes = 0;
    std::size_t blocks = 0;
    std::size_t largest = 0;
  };
  FreeSpace free_space() const noexcept {
    FreeSpace free;
    if (options.expandable) return free;
    for (const detail::TlsfBlockAllocator* index : {&blocks, &small_blocks, &recurring}) {
      free.bytes += index->free_bytes();
      free.blocks += index->free_blocks();
      free.largest = std::max(free.largest, index->largest_free_block());
    }
    free.bytes += dedicated.spare_bytes();
    free.blocks += dedicated.spare_count();
    free.largest = std::max(free.largest, dedicated.largest_spare());
    return free;
  }

  // Bytes in blocks handed out.
  std::size_t in_use_bytes() const noexcept { return in_use_bytes(cached_bytes()); }
  // The same with the caches' bytes read once by the caller. Threads change
  // their caches without `mutex`: a block on its way from one thread's cache
  // to another's may be read in both, so the figure stops at 0.
  std::size_t in_use_bytes(std::size_t cached) const noexcept {
    const std::size_t allocated = blocks.allocated_bytes() - carved_small_bytes + small_blocks.allocated_bytes() +
                                  recurring.allocated_bytes() + dedicated.bytes() - dedicated.spare_bytes() +
                                  assembled_own_bytes;
    return allocated > quarantined_bytes + cached ? allocated - quarantined_bytes - cached : 0;
  }

  // --- the thread caches (no `mutex` on their fast paths) ---

  // Null once the thread's caches have gone back (during its exit).
  ThreadCache* cache_of_this_thread() { return util::ThreadSlots<Core, ThreadCache>::of_this_thread(*this); }
  // The same for the fast paths, if it is the cache this thread used last
  // (else null; they leave the rest to the full paths).
  ThreadCache* last_cache_of_this_thread() const noexcept {
    return util::ThreadSlots<Core, ThreadCache>::of_this_thread_if_last(*this);
  }
  // The same for the free paths, which cannot throw: null also without host
  // memory for a new cache, or with the caches off.
  ThreadCache* cache_for_a_free() noexcept {
    if (!caches_enabled()) return nullptr;
    try {
      return cache_of_this_thread();
    } catch (...) {
      return nullptr;
    }
  }
  void forget_cache(ThreadCache* cache) noexcept;
  // For util::ThreadSlots (a finished thread's cache goes back through forget_cache).
  std::uint64_t thread_slots_id() const noexcept { return thread_slots_id_; }
  bool thread_slots_retired() const noexcept { return retired.load(std::memory_order_acquire); }
  ThreadCache* make_thread_slot();
  void thread_slot_done(ThreadCache* cache) noexcept { forget_cache(cache); }

  // The cache class of a request, or -1 for the shared index or a segment of its own.
  int size_class(std::size_t size) const noexcept {
    return caches_enabled() && !wants_own_segment(size) ? detail::size_class_of(size) : -1;
  }
  // Note [Own segments in the arena]: the expandable arena packs a block
  // beside its neighbours, page for page, so there a segment of its own (in
  // whole 2 MiB pages, as cuMemAlloc takes them) is worth its last page's
  // idle end only where that is at most 1/kArenaOwnSegmentWaste of the block,
  // as it always is from 16 MiB up. (Simulated, seeds 1-8, the expandable
  // pool's reserved over live: RMM's workload up to 8 MiB with 512 MiB live
  // 1.189 -> 1.111, up to 16 MiB with 256 MiB 1.148 -> 1.113, per-layer
  // training 1.146 -> 1.109, a queue up to 16 MiB 1.092 -> 1.058; inference
  // 1.030 -> 1.038; up to 64 MiB 21% more driver allocations, the footprint
  // the same. With a 16th: per-layer 1.102 but inference 1.052 and twice
  // the driver calls up to 64 MiB. With 8 MiB as the dedicated size
  // instead: per-layer 1.123, inference 1.041, up to 16 MiB 1.136.)
  // Dedicated size 0 (every block its own, for raw IPC handles) stays so.
  static constexpr std::size_t kArenaOwnSegmentWaste = 8;
  bool wants_own_segment(std::size_t size) const noexcept {
    if (size < options.dedicated_size) return false;
    if (!options.expandable || options.dedicated_size == 0) return true;
    const std::size_t segment = detail::DedicatedSegments::segment_size(size);
    return segment == 0 || (segment - size) <= size / kArenaOwnSegmentWaste;  // (0: too large for any segment)
  }
  // The bytes of the block that serves a large request of `size`: its own
  // segment's, or the index's rounding (0: no segment can be that large).
  std::size_t large_block_bytes(std::size_t size, bool own_segment) const noexcept {
    return own_segment ? detail::DedicatedSegments::segment_size(size) : blocks.rounded_size(size);
  }

  // A request too large for the size classes (or with the caches off); the
  // caller holds `mutex`. `own` as for allocate_from_index(), and its loop
  // for allocate_dedicated().
  std::uintptr_t allocate_beyond_classes(std::size_t size, ThreadCache* own) {
    if (!wants_own_segment(size))
      return allocate_from_index(size, own, own && own->count_index_request(blocks.rounded_size(size), kHitsOfALoop));
    return allocate_dedicated(size, own && own->segment_loop_length >= kHitsOfALoop, own);
  }

  // `size_class` is size_class(size), which the caller also needs.
  // The common case (a safe block in the thread's ring; for a loop of large
  // requests, its oldest held block) is kept apart from the rest, whose
  // stack frame and saved registers were a fifth of the pair's instructions.
  std::uintptr_t allocate(std::size_t size, int size_class) {
    if (size_class >= 0) [[likely]] {
      if (ThreadCache* own = last_cache_of_this_thread()) [[likely]] {
        const OwnerBiasedLock::TriedOwnerLock cache_lock(own->lock.owner());
        if (cache_lock.held()) [[likely]] {
          own->latest_class = size_class;
          if (const std::uintptr_t address = own->take_oldest_if_safe(size_class, epochs)) [[likely]]
            return address;
        }
      }
    } else if (ThreadCache* own = last_cache_of_this_thread()) {
      return allocate_held_or_otherwise(size, size_class, *own);  // (a tail call: the path above saves no registers)
    }
    return allocate_otherwise(size, size_class);
  }

  [[gnu::noinline]] std::uintptr_t allocate_held_or_otherwise(std::size_t size, int size_class, ThreadCache& own) {
    if (const std::uintptr_t address = take_oldest_held_if_safe(size, own)) return address;
    return allocate_otherwise(size, size_class);
  }

  // A loop's large request, when the oldest block the thread holds fits it
  // and is safe: what allocate_large() does then, without its other paths.
  // 0 (nothing changed) otherwise.
  std::uintptr_t take_oldest_held_if_safe(std::size_t size, ThreadCache& cache) noexcept {
    const bool own_segment = wants_own_segment(size);
    const std::size_t needed = large_block_bytes(size, own_segment);
    const OwnerBiasedLock::TriedOwnerLock cache_lock(cache.lock.owner());
    if (!cache_lock.held() || !cache.held_large_count || needed == 0) return 0;
    const ThreadCache::HeldLarge& oldest = cache.held(0);
    if (!ThreadCache::fits(oldest.block, needed, own_segment) || !epochs.is_safe(oldest.epoch)) return 0;
    if (own_segment) cache.count_segment_request(needed, kHitsOfALoop);
    return take_held(cache, 0).address;
  }

  // Hands out the thread's held block `found`, which is safe: lent (so that
  // its free needs no lock) and counted as a hit of the thread's loop.
  ThreadCache::OrderedLarge take_held(ThreadCache& cache, std::uint32_t found) noexcept {
    const ThreadCache::OrderedLarge block = cache.remove_held_large(found).block;
    cache.lend(block, large_frees_elsewhere.load(std::memory_order_acquire));
    cache.held_skips = found > 0 ? cache.held_skips + 1 : 0;
    if (cache.held_hits_since_miss < kHeldHitsOfALoop) ++cache.held_hits_since_miss;  // (a loop would wrap it)
    return block;
  }

  [[gnu::noinline]] std::uintptr_t allocate_otherwise(std::size_t size, int size_class) {
    return serve_or_forward(size, size_class, false, [&] { return allocate_otherwise_here(size, size_class); });
  }
  std::uintptr_t allocate_otherwise_here(std::size_t size, int size_class);

  // --- large blocks in the thread caches (Note [Large blocks in the thread caches]) ---

  // Bytes of large blocks a thread may hold: its cache's budget (through up
  // to kMaximumHeldRotation blocks), room to rotate through kMinimumRotation
  // blocks of `bytes` whatever their size, and through
  // kMaximumHeldRotationBeyondBudget within held_rotation_budget. (64 MiB
  // pairs on the H100 from one thread: 150-280 ns through 4 blocks, 75-110
  // through 8, 41-90 through 16, 59-93 through 32.)
  std::size_t held_budget(std::size_t bytes) const noexcept {
    return std::max({options.thread_cache_size, kMinimumRotation * bytes,
                     std::min(kMaximumHeldRotationBeyondBudget * bytes, held_rotation_budget.load(std::memory_order_relaxed))});
  }
  // Whether the rotation of blocks of `bytes` has room for one more, within held_budget().
  bool rotation_has_room(const ThreadCache& cache, std::size_t bytes, bool dedicated) const noexcept {
    return cache.bytes_held_large(bytes, dedicated) + bytes <= held_budget(bytes);
  }
  // Whether it has, and the thread has room for one more (two rotations' worth).
  bool has_room_to_hold(const ThreadCache& cache, std::size_t bytes, bool dedicated) const noexcept {
    return cache.held_large_count < kHeldCapacity && rotation_has_room(cache, bytes, dedicated) &&
           cache.held_large_bytes + bytes <=
               2 * std::max(held_budget(bytes), held_rotation_budget.load(std::memory_order_relaxed));
  }
  // Whether a loop of requests of `needed` bytes may rotate through one more block.
  bool rotation_may_grow(const ThreadCache& cache, std::size_t needed, bool dedicated) const noexcept {
    return cache.count_held_large(needed, dedicated) < kMaximumHeldRotation && has_room_to_hold(cache, needed, dedicated);
  }

  // A request beyond the size classes, without a stream, from a thread with
  // a cache: a block it holds once safe, else one from the pool.
  std::uintptr_t allocate_large(std::size_t size, ThreadCache& cache);

  // Where a request would take the pool past its peak: what threads other
  // than `own` hold of their large frees, unless they are loops, goes to the
  // quarantine (allocate_large()'s rule for the requesting thread, for every
  // thread). A thread of random sizes otherwise kept them idle while another
  // grew the pool (RMM's random workload on 8 threads, simulated, seeds 1-4:
  // up to 64 MiB with 1 GiB and 256 MiB live 1.24 -> 1.06 and 1.36 -> 1.09,
  // up to 16 MiB 1.26 -> 1.15). The caller holds `mutex`.
  void quarantine_idle_held_of_others(const ThreadCache& own) {
    for_each_other_cache_holding(&own, holds_large_blocks, [&](ThreadCache& other) {
      if (other.held_hits_since_miss < kHeldHitsOfALoop) quarantine_held_blocks(other);
    });
  }

  // A free block of the size that the pool has at hand (a spare segment, or
  // from the index without growing it), lent to the thread; 0 if none, or
  // if the pool's lock is busy (the caller seals instead).
  std::uintptr_t take_idle_block(std::size_t size, bool own_segment, ThreadCache& cache);

  // Records a block just taken from the pool as lent to the thread, so that
  // its free needs no lock; the caller holds `mutex`.
  void lend_from_pool(ThreadCache& cache, std::uintptr_t address) noexcept {
    const BlockAt block = block_at(address);
    std::lock_guard cache_lock(cache.lock.owner());
    cache.lend({address, block.bytes, block.dedicated}, large_frees_elsewhere.load(std::memory_order_acquire));
  }

  // Keeps a large block that this thread took (so it knows its size) with
  // the thread; its oldest held blocks go to the quarantine when it holds too
  // many. Returns false, changing nothing, for a block it does not know.
  // With kTryOnly, false (nothing done) also when the cache's lock is busy:
  // the free's fast path, which leaves the rest to deallocate_otherwise().
  template <bool kTryOnly = false>
  bool hold_large(std::uintptr_t address, std::uint64_t epoch, ThreadCache& cache) noexcept {
    std::optional<ThreadCache::OrderedLarge> lent;
    // A block of the index that a request for a segment of its own took
    // (allocate_from_index_within_peak()) goes back to the index: no
    // request looks for it in the thread's rotations.
    bool strays_from_its_kind = false;
    {
      std::unique_lock cache_lock(cache.lock.owner(), std::defer_lock);
      if constexpr (kTryOnly) {
        if (!cache_lock.try_lock()) return false;
      } else {
        cache_lock.lock();
      }
      lent = cache.take_lent(address, large_frees_elsewhere.load(std::memory_order_acquire));
      if (!lent) return false;
      cache.count_large_free(detail::DedicatedSegments::segment_size(lent->bytes));
      strays_from_its_kind = !lent->dedicated && wants_own_segment(lent->bytes);
      if (!strays_from_its_kind && has_room_to_hold(cache, lent->bytes, lent->dedicated)) [[likely]] {
        cache.push_held_large(*lent, epoch);
        return true;
      }
    }
    hold_large_otherwise(address, epoch, cache, *lent, strays_from_its_kind);
    return true;
  }

  // The rest of hold_large(): the thread took `lent` at `address`, and no
  // room was found for it (or it strays from its kind).
  [[gnu::noinline]] void hold_large_otherwise(std::uintptr_t address, std::uint64_t epoch, ThreadCache& cache,
                                              const ThreadCache::OrderedLarge& lent, bool strays_from_its_kind) noexcept;

  // The common case (room in the thread's ring) apart, as allocate()'s.
  void deallocate(std::uintptr_t address, int size_class) noexcept {
    if (retired.load(std::memory_order_acquire)) return;
    const std::uint64_t epoch = epochs.tag();
    if (size_class >= 0) [[likely]] {
      if (ThreadCache* cache = last_cache_of_this_thread()) [[likely]] {
        const OwnerBiasedLock::TriedOwnerLock cache_lock(cache->lock.owner());
        if (cache_lock.held() && push_if_room(*cache, address, size_class, epoch)) [[likely]]
          return;
      }
    } else if (ThreadCache* cache = last_cache_of_this_thread()) {
      return hold_large_or_otherwise(address, size_class, epoch, *cache);  // (a tail call, as allocate()'s)
    }
    deallocate_otherwise(address, size_class, epoch);
  }

  [[gnu::noinline]] void hold_large_or_otherwise(std::uintptr_t address, int size_class, std::uint64_t epoch,
                                                 ThreadCache& cache) noexcept {
    if (!hold_large</*kTryOnly=*/true>(address, epoch, cache)) deallocate_otherwise(address, size_class, epoch);
  }

  [[gnu::noinline]] void deallocate_otherwise(std::uintptr_t address, int size_class, std::uint64_t epoch) noexcept;

  // Note [Large frees from another thread]
  // A large block that its thread did not lend to the freeing thread (a
  // loader's block freed by the compute thread; one lent too long ago) needs
  // the pool's lock: its size is in the index. Taken at each such free, the
  // lock went back and forth between a thread that allocates and one that
  // frees, each waiting for the other (the freeing thread held it through
  // the index, the quarantine and, about one free in three, a seal): 1.3 us
  // a block handed over at 4 and 64 MiB, against 0.2-0.3 up to 1 MiB, whose
  // frees stay in the freeing thread's cache. Where another thread took the
  // pool's lock last, and so is at work in the pool, such a free now queues
  // the block (detail::ForeignFrees) and returns; whoever next takes or
  // gives up the lock moves the queue into the quarantine, so that nothing
  // under the lock sees the pool without those blocks. A full queue, or a
  // thread that took the lock last itself, takes the lock as before (one
  // thread's frees keep their order and their seals). The seal that the
  // quarantine wanted at its last such block (quarantine_foreign_free()) is
  // the freeing thread's, made without the pool's lock, so that the block's
  // epoch closes at its free, as it did. Drains seal nothing: a lock may be
  // taken at a thread's end, whose driver state may be gone. (Their only
  // driver calls are quarantine_or_reuse()'s seal and wait, with no host
  // memory left.)
  //
  // Note [Classes a thread frees for others]
  // A thread that frees blocks of a class it does not ask for (the compute
  // thread of a loader's 1 MiB blocks) keeps them in its ring, where the
  // thread that asks for them finds them only by taking them back
  // (take_back_idle_rings()) once the index runs dry: a barrier across the
  // process for each visit of that cache (OwnerBiasedLock), once per ring's
  // worth of blocks. On a virtual machine of two CPUs that barrier was a
  // third of the 1 MiB hand-over's time. So a class that another thread
  // asks for and takes back so, and which its own thread has kept blocks of
  // but never asked for, is marked given to others: that thread's later
  // frees of the class skip its ring and go to the pool as a large free from
  // another thread does (the queue above, or the pool's lock), until it asks
  // for the class itself, and without the seal such a free would make: the
  // thread that asks for the class seals once it needs the blocks. (Only
  // that class, and only if never asked for: threads of random sizes, whose
  // rings are all taken back where the pool would grow, keep their frees of
  // the classes they use; docs/pool-measurements.md.)
  //
  // Under `mutex`: the queued blocks go to the quarantine.
  void take_in_foreign_frees() noexcept {
    if (foreign_frees.may_hold()) [[unlikely]]
      take_in_queued_frees();
  }
  // (Only where may_hold() found a block: its caller's.)
  [[gnu::noinline]] void take_in_queued_frees() noexcept;
  // One block freed by another thread to the quarantine; returns (and
  // records, for the frees that queue) whether the quarantine then wants a
  // seal, so that requests of its size seldom wait. Its size (0: no block
  // starts there) in `bytes`.
  bool quarantine_foreign_free(const Freed& freed, std::size_t* bytes = nullptr) noexcept;
  // Queues a block freed by a thread that did not take it, for the thread at
  // work in the pool (Note [Large frees from another thread]); false where
  // this thread took the pool's lock last, or the queue is full: the caller
  // takes the lock. With QueuedSeal::as_wanted the freeing thread seals
  // where the quarantine last wanted a seal; with left_to_the_taker it
  // leaves that to the thread that will ask for the block.
  enum class QueuedSeal { as_wanted, left_to_the_taker };
  bool queue_for_the_lock_holder(const Freed& freed, QueuedSeal seal = QueuedSeal::as_wanted) noexcept {
    if (!mutex.taken_last_by_another_thread() || !foreign_frees.offer(freed)) return false;
    // The seal its free would have made, without the pool's lock.
    if (seal == QueuedSeal::as_wanted && foreign_free_wanted_seal.load(std::memory_order_relaxed)) seal_if_due();
    return true;
  }

  // The common free: room in the ring and in the budget. Apart from the
  // spilling path, whose 4 KiB of stack the pair otherwise paid for (a stack
  // probe and a cold page at every free).
  static bool keep_in_ring(ThreadCache& cache, std::uintptr_t address, int size_class, std::uint64_t epoch) noexcept {
    std::lock_guard cache_lock(cache.lock.owner());
    return push_if_room(cache, address, size_class, epoch);
  }
  // The same; the caller holds the cache's lock.
  static bool push_if_room(ThreadCache& cache, std::uintptr_t address, int size_class, std::uint64_t epoch) noexcept {
    ThreadCache::Bin& bin = cache.bins[size_class];
    if (bin.count == bin.capacity || cache.rings_set_aside || bin.taker == ThreadCache::Bin::Taker::others ||
        cache.bytes.load(std::memory_order_relaxed) + detail::size_class_bytes(size_class) > cache.budget)
      return false;
    cache.push_to_ring(size_class, address, epoch);
    return true;
  }

  [[gnu::noinline]] void deallocate_spilling(ThreadCache* cache, std::uintptr_t address, int size_class,
                                             std::uint64_t epoch) noexcept;

  // Blocks of one class that a thread's cache had no room for go to the
  // quarantine; with no host memory to record them there, to the index at
  // once (rather than leak), those not yet recorded.
  // With `kept_small`, seals once the quarantine holds much (Note [A quarantine kept small]).
  void quarantine_spilled(const Freed* spilled, std::size_t count, std::size_t class_bytes, bool kept_small) noexcept;

  // --- stream-ordered (Note [Stream-ordered reuse], Note [Same-stream reuse]) ---

  // The tag of a stream that is not a default one, under which a thread may
  // reuse its frees on it at once: its id plus one (cuStreamGetId's ids are
  // never given to another stream, as a destroyed stream's handle may be).
  // 0 where it may not: the seals do not cover every stream (so blocks freed
  // there could not go to the quarantine later), the stream is being
  // captured into a graph, or the driver cannot say. Two driver calls.
  std::uint64_t same_stream_tag(cuda::CUstream stream) const noexcept;
  // Whether the thread's bins may hold `stream`'s frees: they hold those of
  // a stream with its handle. Only then may a request there take them, so
  // only then does it ask same_stream_tag() (a request on another stream of
  // a thread that takes turns between streams makes no driver call).
  bool may_hold_frees_of(cuda::CUstream stream) const noexcept {
    const ThreadCache* own = last_cache_of_this_thread();
    const auto handle = reinterpret_cast<std::uintptr_t>(stream);
    return own && (own->ordered_handle == handle || own->has_side_handle(handle));
  }
  // Whether a free on `stream` (not a default one) goes to the quarantine
  // whatever its tag, counted as a miss (see keep_frees_of()): the bins hold
  // blocks of a stream with another handle, whose turn is not up yet. Spares
  // that free same_stream_tag()'s driver calls.
  bool refuses_without_asking(cuda::CUstream stream) noexcept;

  // The common case (a block in the thread's bin, freed on the same stream)
  // apart, as allocate()'s. `stream`: kDefaultStreams or same_stream_tag()'s.
  std::uintptr_t allocate_ordered(std::size_t size, int size_class, std::uint64_t stream = detail::kDefaultStreams) {
    if (size_class >= 0) [[likely]] {
      if (ThreadCache* own = last_cache_of_this_thread()) [[likely]] {
        const OwnerBiasedLock::TriedOwnerLock cache_lock(own->lock.owner());
        if (cache_lock.held() && own->ordered_stream == stream) [[likely]] {
          if (const std::uintptr_t address = own->take_ordered(size_class)) [[likely]] {
            own->ordered_misses = 0;
            return address;
          }
        }
      }
    }
    return allocate_ordered_otherwise(size, size_class, stream);
  }

  [[gnu::noinline]] std::uintptr_t allocate_ordered_otherwise(std::size_t size, int size_class, std::uint64_t stream) {
    return serve_or_forward(
        size, size_class, true, [&] { return allocate_ordered_otherwise_here(size, size_class, stream); }, stream);
  }
  std::uintptr_t allocate_ordered_otherwise_here(std::size_t size, int size_class, std::uint64_t stream);

  // Frees on other streams than the one whose blocks a thread keeps, in a
  // row, after which that stream's blocks go to the quarantine and the
  // thread keeps the new stream's (Note [Same-stream reuse]).
  static constexpr std::uint32_t kOrderedStreamPatience = 64;
  // Whether a thread's ordered bins take a free on `stream` (a tag, as
  // allocate_ordered()'s): they hold that stream's blocks or none (they are
  // then its), or the stream they hold has had no use in
  // kOrderedStreamPatience of the thread's frees on others: its blocks then
  // go to the quarantine, and the bins are the new stream's. Takes the
  // cache's lock, and `mutex` to give blocks back.
  // `handle`: the stream's (0 for the default streams).
  bool keep_frees_of(ThreadCache& cache, std::uint64_t stream, std::uintptr_t handle) noexcept;
  // The same without giving blocks back; the caller holds the cache's lock.
  // (Empty bins are not taken by a side stream's frees: the stream whose
  // they are would then find no slot, and the side stream would be kept
  // twice.)
  static bool claim_ordered_bins(ThreadCache& cache, std::uint64_t stream, std::uintptr_t handle) noexcept {
    if (cache.ordered_stream != stream) {
      if (cache.ordered_count || cache.side_stream(stream)) return false;
      cache.ordered_stream = stream;
      cache.ordered_handle = handle;
    }
    cache.ordered_misses = 0;
    return true;
  }

  // Before the pool grows past its peak for a request of class `kept` (-1:
  // beyond the classes): the blocks that `own` keeps from its stream-ordered
  // frees of other classes and sizes (up to its whole cache budget; of its
  // streams, those ThreadCache::gives_back() names), and the
  // large ones every other thread keeps (up to kOrderedLargeCapacity each, of
  // any size), go to the quarantine, tagged with the open epoch, whose seal
  // covers their default streams; then that seal. They otherwise sat beside
  // the growth. (Simulated, RMM's random workload through allocate(size,
  // stream), seeds 1-8: up to 4 MiB with 512 MiB live 1.21 -> 1.14, up to
  // 64 MiB with 256 MiB 1.81 -> 1.14, up to 1 MiB with 64 MiB 2.64 -> 1.25,
  // near the stream-less interface's 1.14, 1.07 and 1.26.) Returns whether
  // any went; the caller holds `mutex`. A loop of one size seldom comes
  // here: its frees serve it.
  bool give_back_ordered_blocks(ThreadCache& own, int kept);
  // Names the stream of the request a thread serves, for give_back_ordered_blocks(), while in scope.
  class RequestingStream {
   public:
    RequestingStream(ThreadCache& cache, std::uint64_t stream) noexcept : cache_(cache) {
      cache_.requesting_stream = stream;
    }
    ~RequestingStream() { cache_.requesting_stream = detail::kNoStream; }
    RequestingStream(const RequestingStream&) = delete;
    RequestingStream& operator=(const RequestingStream&) = delete;

   private:
    ThreadCache& cache_;
  };
  // A request on a stream of the program's whose frees the thread does not
  // keep: as allocate(), but at the peak the blocks kept for streams in
  // turn stay. (Where the seals cover only the legacy stream no such stream
  // is kept, and it is allocate().)
  std::uintptr_t allocate_on_another_stream(std::size_t size, int size_class) {
    ThreadCache* own = epochs.covers_every_stream() ? last_cache_of_this_thread() : nullptr;
    if (!own) return allocate(size, size_class);
    const RequestingStream requesting(*own, detail::kOtherStream);
    return allocate(size, size_class);
  }

  // The common case (room in the thread's bin, which holds the same
  // stream's frees) apart, as deallocate()'s. `stream`: as allocate_ordered()'s;
  // `handle`: the stream's (0 for the default streams).
  void deallocate_ordered(std::uintptr_t address, int size_class, std::uint64_t stream = detail::kDefaultStreams,
                          std::uintptr_t handle = 0) noexcept {
    if (retired.load(std::memory_order_acquire)) return;
    if (size_class >= 0) [[likely]] {
      if (ThreadCache* cache = last_cache_of_this_thread()) [[likely]] {
        const OwnerBiasedLock::TriedOwnerLock cache_lock(cache->lock.owner());
        if (cache_lock.held() && cache->ordered_stream == stream && push_ordered_if_room(*cache, address, size_class))
            [[likely]] {
          cache->ordered_misses = 0;
          return;
        }
      }
    }
    deallocate_ordered_otherwise(address, size_class, stream, handle);
  }

  [[gnu::noinline]] void deallocate_ordered_otherwise(std::uintptr_t address, int size_class, std::uint64_t stream,
                                                      std::uintptr_t handle) noexcept {
    ThreadCache* cache = cache_for_a_free();
    if (!cache) return deallocate(address, size_class);  // tagged with the epoch: still safe
    // (Only this thread changes whose frees its bins hold: once they are
    // the stream's, they stay so below.)
    if (!keep_frees_of(*cache, stream, handle)) {
      if (keep_on_side(*cache, stream, handle, address, size_class)) return;
      return deallocate(address, size_class);  // (as above)
    }
    if (size_class < 0) return deallocate_ordered_large(address, *cache);
    if (keep_in_ordered_bin(*cache, address, size_class)) return;
    deallocate_ordered_spilling(*cache, address, size_class);
  }

  // Room in the bin and in the budget (as keep_in_ring()).
  static bool keep_in_ordered_bin(ThreadCache& cache, std::uintptr_t address, int size_class) noexcept {
    std::lock_guard cache_lock(cache.lock.owner());
    return push_ordered_if_room(cache, address, size_class);
  }
  // The same; the caller holds the cache's lock.
  static bool push_ordered_if_room(ThreadCache& cache, std::uintptr_t address, int size_class) noexcept {
    ThreadCache::OrderedBin& bin = cache.ordered[size_class];
    if (bin.count == bin.capacity ||
        cache.bytes.load(std::memory_order_relaxed) + detail::size_class_bytes(size_class) > cache.budget)
      return false;
    cache.push_ordered(size_class, address);
    return true;
  }

  [[gnu::noinline]] void deallocate_ordered_spilling(ThreadCache& cache, std::uintptr_t address,
                                                   int size_class) noexcept;

  // The size lookup needs the lock; the block then stays with the thread,
  // and the oldest one it kept goes to the quarantine when it has too many.
  void deallocate_ordered_large(std::uintptr_t address, ThreadCache& cache) noexcept;
  // A large block freed by this thread, its size and kind: from the blocks
  // it lent the thread, else (under `mutex`) from the pool's records;
  // nullopt if no block starts there.
  std::optional<ThreadCache::OrderedLarge> large_block_freed_here(std::uintptr_t address, ThreadCache& cache) noexcept;
  // The same from the pool's records alone, under `mutex`; a lent block's
  // size is then stale to its thread (large_frees_elsewhere).
  std::optional<ThreadCache::OrderedLarge> large_block_in_records(std::uintptr_t address) noexcept;

  // A free on a stream of the program's that the ordered bins do not hold
  // (Note [Same-stream reuse]): kept on the thread's side stream of that
  // tag, or on one it takes for it (a free slot, or the one least recently
  // used if no request or free has used it in kOrderedStreamPatience of the
  // thread's frees on the program's streams: its blocks go to the
  // quarantine). False where no slot is to be had: the caller frees it to
  // the pool. A slot over kSideStreamDepth blocks (or kOrderedLargeCapacity
  // large ones, or the cache's budget) sends its oldest to the quarantine.
  bool keep_on_side(ThreadCache& cache, std::uint64_t stream, std::uintptr_t handle, std::uintptr_t address,
                    int size_class) noexcept;
  // The slot a new side stream may take, or null; the caller holds the cache's lock.
  static ThreadCache::SideStream* side_slot_to_claim(ThreadCache& cache) noexcept;
  // Every block of the thread's side streams (with
  // `as_the_request_gives_back`, those that ThreadCache::gives_back() names),
  // to the quarantine with `epoch`; whether there were any. The caller holds
  // `mutex` and the cache's lock. (The slots keep their streams.)
  bool quarantine_side_streams(ThreadCache& cache, std::uint64_t epoch, bool as_the_request_gives_back = false) noexcept;

  // Where seals cover only the legacy stream, makes it wait for the work
  // queued so far on `stream` (if any), so that the next epoch's event
  // covers it; failing that, waits for it here.
  void order_after(cuda::CUstream stream) noexcept;

  bool caches_enabled() const noexcept { return options.thread_cache_size > 0; }

  // Calls visit(cache) for every thread's cache but `own`'s (null: every
  // one), each under its visitor lock; the caller holds `mutex`.
  template <class Visit>
  void for_each_other_cache(const ThreadCache* own, Visit visit) {
    for_each_other_cache_holding(own, [](const ThreadCache&) { return true; }, visit);
  }
  // The same for the caches where holds(cache), read without their lock: a
  // visitor's lock costs a barrier across the process (a system call, about
  // 10 us on the simulated driver's host), which a thread that allocates
  // what another frees paid at each request for a cache that held nothing.
  // (What an owner adds meanwhile waits for the next visit, as it would
  // have after this one.)
  template <class Holds, class Visit>
  void for_each_other_cache_holding(const ThreadCache* own, Holds holds, Visit visit) {
    for (auto& cache : caches) {
      if (cache.get() == own || !holds(*cache)) continue;
      std::lock_guard cache_lock(cache->lock.visitor());
      visit(*cache);
    }
  }
  static bool holds_ring_blocks(const ThreadCache& cache) noexcept {
    return cache.bytes.load(std::memory_order_relaxed) > 0;
  }
  static bool holds_large_blocks(const ThreadCache& cache) noexcept {
    return cache.large_bytes.load(std::memory_order_relaxed) > 0;
  }

  // What the threads' caches hold, but for `except`'s.
  std::size_t cached_bytes(const ThreadCache* except = nullptr) const noexcept {
    std::size_t total = 0;
    for (const auto& cache : caches) {
      if (cache.get() != except) total += bytes_cached_by(*cache);
    }
    return total;
  }
  // What a thread's cache holds: its rings, ordered bins and large blocks.
  static std::size_t bytes_cached_by(const ThreadCache& cache) noexcept {
    return cache.bytes.load(std::memory_order_relaxed) + cache.large_bytes.load(std::memory_order_relaxed);
  }

  // Gives everything back to the driver; late finalizers become no-ops.
  void retire() noexcept;
};

}  // namespace cuemm
