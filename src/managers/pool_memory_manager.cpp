#include "cuemm/managers/pool_memory_manager.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>

#include "cuemm/driver/driver.hpp"
#include "cuemm/managers/detail/dedicated_segments.hpp"
#include "cuemm/managers/detail/expandable_arena.hpp"
#include "cuemm/managers/detail/rent_or_buy.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"
#include "cuemm/managers/detail/size_classes.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "pool_thread_cache.hpp"
#include "raw_free_checker.hpp"
#include "threading/owner_biased_lock.hpp"
#include "util/environment.hpp"
#include "util/hex_address.hpp"
#include "util/keep_until_exit.hpp"
#include "util/owned_counter.hpp"
#include "util/round_up.hpp"
#include "util/thread_slots.hpp"

namespace cuemm {
namespace {

using detail::Freed;
using detail::kHeldCapacity;
using detail::kMaximumBinCapacity;
using detail::kMinimumBinCapacity;
using detail::kOrderedLargeCapacity;
using detail::ThreadCache;

constexpr std::size_t kMinimumGrowth = std::size_t{8} << 20;
// Note [Small blocks apart]: segments of room for 4 of the request, in
// whole pages, up to kLargestSmallSegment.
constexpr std::size_t kLargestSmallSegment = std::size_t{4} << 20;
// Free blocks of the initial segment's that a new small segment looks at
// (a bound, so that it stays O(1)).
constexpr int kCarveLooks = 8;
// Free blocks that a request in the expandable arena looks at for one whose
// pages are mapped (a bound, so that allocation stays O(1)).
constexpr int kMappedLooks = 32;
// A thread's ring with this many blocks of a class may be sealed for its own
// next request when the index is empty; a seal costs one stream query. (64
// before the cache budget went to 256 MiB: 1 MiB loops then sealed every 64
// pairs, now every 128.)
constexpr std::uint32_t kRingBatchWorthSealing = 128;
// Or this fraction of its capacity: a loop's ring settles at the batch it
// seals, and half paid the fewest stream queries without the threads' rings
// taking much of the pool (docs/pool-measurements.md).
constexpr std::uint32_t kRingFractionWorthSealing = 2;
// Segments of their own that rotate to save stream queries (see allocate_dedicated()):
// idle bytes, idle count, and the stream queries that buy one more.
constexpr std::size_t kRotationBudget = std::size_t{32} << 20;
constexpr std::size_t kMaximumRotation = 8;
constexpr std::size_t kMinimumRotation = 4;  // whatever their size
// Beyond its cache budget a thread may rotate through up to 32 large blocks,
// within 2 GiB and a 16th of the device's memory (Core::held_rotation_budget).
// With 16 threads of 64 MiB pairs on the H100 a freed block became safe about
// 3.2 us after its free, however long the rotation, so a rotation must last
// that long: 8 blocks within 512 MiB 19.2 ns a pair in aggregate, 16 within
// 1 GiB 12.0, 24 within 1.5 GiB 8.7, 32 within 2 GiB 6.3 (16 over one
// thread's 6.8x, 9.0x, 11.3x; docs/pool-measurements.md).
constexpr std::size_t kMaximumHeldRotationBeyondBudget = 32;
constexpr std::size_t kLargestHeldRotationBudget = std::size_t{2} << 30;
constexpr std::size_t kDeviceFractionOfHeldRotationBudget = 16;  // at most a 16th of the device
// A thread's rotation of blocks it holds pays a stream query per rotation:
// within its cache budget it may hold eight times as many (4 MiB pairs at 16
// threads: 8 blocks 20-26 ns a pair, 32 blocks 7.0-8.8, 64 blocks 3.9
// against 32's 5.4, from one thread 45 against 62: docs/pool-measurements.md).
constexpr std::size_t kMaximumHeldRotation = 8 * kMaximumRotation;
// A thread holds up to two rotations: loops that alternate between two large sizes keep both.
static_assert(kHeldCapacity == 2 * kMaximumHeldRotation, "a thread cache holds two rotations");
// Requests in a row whose block was found behind held blocks of other sizes,
// after which those go back to the pool: a thread that moved on to another
// size left them idle, and every request scanned past them (H100, 4 MiB
// pairs after the pool had served 64 MiB ones: 66 -> 117 ns a pair). Loops
// that take turns, each for fewer requests, keep both rotations.
constexpr std::uint32_t kSkipsBeforeGivingBack = 4096;
constexpr std::size_t kSealsWorthASegment = 256;
// Requests that found a held block since the last that found none, below
// which a thread is not looping over its held sizes (see allocate_large()).
constexpr std::uint32_t kHitsOfALoop = 4;
// Threads' seals closer than this share one (a seal's stream query costs
// 0.2-0.4 us on the H100 machine, and queries from many threads queue). Short
// enough that a fast loop's half ring (256 pairs of 256 B, about 5 us there
// at 20 ns a pair) does not miss its seal: with 5 us it did, as pairs got faster.
constexpr std::chrono::microseconds kSealInterval{2};

}  // namespace

PoolOptions PoolOptions::from_environment() {
  PoolOptions options;
  options.initial_size = util::byte_size_from_environment("CUEMM_POOL_INITIAL_SIZE").value_or(0);
  options.maximum_size = util::byte_size_from_environment("CUEMM_POOL_MAXIMUM_SIZE").value_or(0);
  options.thread_cache_size =
      util::byte_size_from_environment("CUEMM_POOL_THREAD_CACHE_SIZE").value_or(options.thread_cache_size);
  options.dedicated_size =
      util::byte_size_from_environment("CUEMM_POOL_DEDICATED_SIZE").value_or(options.dedicated_size);
  options.expandable = util::flag_from_environment("CUEMM_POOL_EXPANDABLE").value_or(options.expandable);
  options.split_spares = util::flag_from_environment("CUEMM_POOL_SPLIT_SPARES").value_or(options.split_spares);
  options.small_blocks_apart =
      util::flag_from_environment("CUEMM_POOL_SMALL_BLOCKS_APART").value_or(options.small_blocks_apart);
  options.pinned_host_pool = util::flag_from_environment("CUEMM_PINNED_HOST_POOL").value_or(options.pinned_host_pool);
  options.check_frees = util::flag_from_environment("CUEMM_POOL_CHECK_FREES").value_or(options.check_frees);
  return options;
}


// Everything the pointers' finalizers reach. A finalizer holds a raw pointer
// to its Core (so it fits std::function's inline storage: no allocation), and
// Cores are never deleted: reset and destruction retire them, and a retired
// Core ignores late finalizers.
struct PoolMemoryManager::Core : std::enable_shared_from_this<PoolMemoryManager::Core> {
  Context* context;
  PoolOptions options;
  mutable BlockingAwareMutex mutex;
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
  std::size_t quarantined_segment_bytes = 0;  // the part in segments of their own
  std::size_t quarantined_segments = 0;
  // The seals that requests for a segment of their own (for a block from
  // the index) pay, which buy one more (see allocate_dedicated()).
  detail::RentOrBuy segment_rental;
  detail::RentOrBuy index_rental;
  std::size_t largest_request_grown_for = 0;  // by grow()
  std::size_t driver_allocations = 0, driver_frees = 0, spares_taken_over = 0;  // PoolStatistics'
  std::size_t peak_reserved = 0;  // the most reserved_bytes() after any growth
  std::vector<std::unique_ptr<ThreadCache>> caches;
  int defer_depth = 0;
  cuda::CUevent ordering_event = nullptr;  // order_after()'s
  // Read by every thread's pairs, written seldom: a line of their own, away
  // from the fields written under `mutex` and from last_seal.
  // Large frees that did not go through their thread's lent blocks (ThreadCache::Lent).
  alignas(64) std::atomic<std::uint64_t> large_frees_elsewhere{0};
  std::atomic<bool> retired{false};
  // For util::ThreadSlots: every fast path compares it with its thread's last slot.
  const std::uint64_t thread_slots_id_ = util::next_thread_slots_id();
  // Bytes a thread's rotation of large blocks may take beyond its cache
  // budget: kLargestHeldRotationBudget within a 16th of the device's memory,
  // which initialize() reads (until then, a 16 GiB device's). Written once.
  std::atomic<std::size_t> held_rotation_budget{std::size_t{1} << 30};
  alignas(64) std::atomic<std::int64_t> last_seal{0};  // steady_clock ticks; written at each seal

  Core(Context* context_, PoolOptions options_) : context(context_), options(options_) {}

  // --- under `mutex` ---

  void quarantine_block(std::uintptr_t address, std::size_t size, std::uint64_t epoch, bool in_segment_of_its_own = false) {
    quarantine.push_back({address, size, epoch, in_segment_of_its_own});
    quarantine_may_hold.store(true, std::memory_order_relaxed);
    quarantined_bytes += size;
    if (in_segment_of_its_own) {
      quarantined_segment_bytes += size;
      ++quarantined_segments;
    }
  }

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

  // The bytes of the block handed out at `address` (0 if none), and whether
  // it has a segment of its own.
  struct BlockAt {
    std::size_t bytes;
    bool dedicated;
  };
  BlockAt block_at(std::uintptr_t address) const {
    if (const std::size_t segment = dedicated.size_of(address)) return {segment, true};
    if (recurring.allocated_blocks()) {
      if (const std::size_t bytes = recurring.block_size(address)) return {bytes, false};
    }
    if (small_blocks.allocated_blocks()) {
      if (const std::size_t bytes = small_blocks.block_size(address)) return {bytes, false};
    }
    return {blocks.block_size(address), false};
  }

  // Defers `block` to the quarantine; without host memory to, reuses it at
  // once rather than leak it. Returns whether it is in the quarantine.
  bool quarantine_or_reuse(const Quarantined& block) noexcept {
    try {
      quarantine_block(block.address, block.size, block.epoch, block.dedicated);
      return true;
    } catch (...) {
      reuse(block);
      return false;
    }
  }

  // A safe block goes back to the index, or to the spares.
  void reuse(const Quarantined& block) {
    if (!block.dedicated) {
      deallocate_in_index(block.address);
      return;
    }
    try {
      dedicated.make_spare(block.address);
    } catch (...) {
      free_segment(block.address);  // no room to keep it
    }
  }

  // A block of the shared segments, the small segments or the spares split
  // for recurring sizes goes back to its index. (The threads hold no block
  // of the spares' index today, its sizes wanting segments of their own, but
  // a held block going back through the shared segments' index alone would
  // stay allocated there for good: an experiment that gave such blocks to
  // the threads lost 245 MiB that way.)
  void deallocate_in_index(std::uintptr_t address) {
    if (recurring.allocated_blocks() && recurring.deallocate(address)) {
      return_whole_recurring_regions();
      return;
    }
    if (small_blocks.allocated_blocks() && small_blocks.deallocate(address)) return;
    blocks.deallocate(address);
  }

  // The spares that recurring requests split, once whole again, are spares
  // again (or go back to the driver, without host memory to keep them).
  void return_whole_recurring_regions() noexcept {
    std::vector<detail::TlsfBlockAllocator::Region> whole;
    try {
      whole = recurring.take_free_regions();
    } catch (...) {
      return;  // (they stay in the index, free, until the next try)
    }
    for (const auto& region : whole) {
      try {
        dedicated.add(region.base, region.size);
        dedicated.make_spare(region.base);
      } catch (...) {
        free_segment(region.base);  // (forgets it, if add() recorded it)
      }
    }
  }

  void free_segment(std::uintptr_t base) noexcept {
    dedicated.forget(base);
    ++driver_frees;
    ScopedContext scope(*context);
    CUEMM_CU_RESULT(cuMemFree, base);
  }

  void free_segments(const std::vector<detail::DedicatedSegments::Segment>& segments) noexcept {
    if (segments.empty()) return;
    driver_frees += segments.size();
    ScopedContext scope(*context);
    for (const auto& segment : segments) CUEMM_CU_RESULT(cuMemFree, segment.base);
  }

  void seal() noexcept { epochs.seal(); }

  // Looks for completed epochs (with `wait`, waits for all), then returns the
  // safe part of the quarantine to the index.
  // Returns the bytes reclaimed.
  std::size_t reclaim(bool wait) {
    epochs.poll(wait);
    return reclaim_quarantine();
  }

  std::size_t reclaim_quarantine() {
    std::size_t reclaimed = 0;
    while (!quarantine.empty() && epochs.is_safe(quarantine.front().epoch)) {
      reuse(quarantine.front());
      reclaimed += quarantine.front().size;
      if (quarantine.front().dedicated) {
        quarantined_segment_bytes -= quarantine.front().size;
        --quarantined_segments;
      }
      quarantine.pop_front();
    }
    quarantine_may_hold.store(!quarantine.empty(), std::memory_order_relaxed);
    quarantined_bytes -= reclaimed;
    return reclaimed;
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

  static std::int64_t now_ticks() noexcept { return std::chrono::steady_clock::now().time_since_epoch().count(); }

  bool seal_if_due() noexcept {
    const std::int64_t now = now_ticks();
    const std::int64_t interval = std::chrono::steady_clock::duration(kSealInterval).count();
    if (now - last_seal.load(std::memory_order_relaxed) < interval || !epochs.try_seal()) return false;
    last_seal.store(now, std::memory_order_relaxed);
    return true;
  }

  // --- under `mutex` ---

  // Moves every block of one thread's cache into the quarantine; the caller
  // holds the cache's lock (or the cache's thread has finished).
  // Its stream-ordered blocks are tagged with the open epoch: their freeing
  // work is on a default stream, which the next seal's event covers.
  void quarantine_cached_blocks(ThreadCache& cache) {
    const std::uint64_t epoch = epochs.tag();
    quarantine_ring_blocks(cache, -1, epoch);
    quarantine_ordered_large(cache, epoch);
    quarantine_held_blocks(cache);
  }

  // The same for the blocks of its rings and ordered bins only, but for its
  // latest request's class (which a loop is using).
  void quarantine_idle_ring_blocks(ThreadCache& cache) {
    quarantine_ring_blocks(cache, cache.latest_class, epochs.tag());
  }

  // Moves the blocks of a thread's rings and ordered bins into the
  // quarantine, but for class `kept` (-1: none); stream-ordered ones get `epoch`.
  void quarantine_ring_blocks(ThreadCache& cache, int kept, std::uint64_t epoch) {
    std::array<Freed, kMaximumBinCapacity> taken;
    for (int c = 0; c < detail::kSizeClassCount; ++c) {
      if (c == kept) continue;
      while (const std::size_t n = cache.take_oldest(c, kMaximumBinCapacity, taken.data()))
        for (std::size_t i = 0; i < n; ++i) quarantine_block(taken[i].address, detail::size_class_bytes(c), taken[i].epoch);
    }
    quarantine_ordered_bins(cache, kept, epoch);
  }
  // The blocks of a thread's ordered bins, but for class `kept`, with `epoch`; whether there were any.
  bool quarantine_ordered_bins(ThreadCache& cache, int kept, std::uint64_t epoch) {
    bool any = false;
    std::array<Freed, kMaximumBinCapacity> taken;
    for (int c = 0; c < detail::kSizeClassCount; ++c) {
      if (c == kept) continue;
      while (const std::size_t n = cache.take_oldest_ordered(c, kMaximumBinCapacity, epoch, taken.data())) {
        for (std::size_t i = 0; i < n; ++i) quarantine_block(taken[i].address, detail::size_class_bytes(c), epoch);
        any = true;
      }
    }
    return any;
  }
  // The large blocks a thread keeps from its stream-ordered frees, with `epoch`; whether there were any.
  bool quarantine_ordered_large(ThreadCache& cache, std::uint64_t epoch) {
    const bool any = cache.ordered_large_count > 0;
    while (cache.ordered_large_count) {
      const ThreadCache::OrderedLarge large = cache.remove_ordered_large(cache.ordered_large_count - 1);
      quarantine_block(large.address, large.bytes, epoch, large.dedicated);
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
    quarantine_block(held.block.address, held.block.bytes, held.epoch, held.block.dedicated);
    cache.remove_held_large(i);
  }

  // Gives the safe blocks of the calling thread's own cache back to the
  // index, but for the large blocks that would serve a request of
  // `request` bytes (a loop's rotation); the caller holds `mutex`.
  void return_safe_cached_blocks(ThreadCache& cache, std::size_t request) {
    std::lock_guard cache_lock(cache.lock.owner());
    std::array<Freed, kMaximumBinCapacity> taken;
    for (int c = 0; c < detail::kSizeClassCount; ++c) {
      ThreadCache::Bin& bin = cache.bins[c];
      std::uint32_t safe = 0;
      while (safe < bin.count && epochs.is_safe(bin.at(safe).epoch)) ++safe;  // epochs only grow along a ring
      const std::size_t n = cache.take_oldest(c, safe, taken.data());
      for (std::size_t i = 0; i < n; ++i) deallocate_in_index(taken[i].address);
    }
    // The large blocks it holds from the index too (not those with segments
    // of their own, which do not merge). A training step's layers each free
    // a gradient and a scratch block of sizes of their own: held, they kept
    // the pool from reusing that memory for the next layer's sizes.
    // (Simulated driver, `cuemm random --pattern training --shapes
    // per-layer`, seeds 1-8: 1.25-1.45 -> 1.15-1.29 reserved over live.)
    const std::size_t needed = detail::size_class_of(request) < 0 ? blocks.rounded_size(request) : 0;
    for (std::uint32_t i = 0; i < cache.held_large_count;) {
      const ThreadCache::HeldLarge& held = cache.held(i);
      if (held.block.dedicated || !epochs.is_safe(held.epoch) ||
          (needed && ThreadCache::fits(held.block, needed, false))) {
        ++i;
        continue;
      }
      deallocate_in_index(held.block.address);
      cache.remove_held_large(i);
    }
  }

  // Moves every cached block of every thread into the quarantine.
  void flush_caches() {
    for_each_other_cache(nullptr, [&](ThreadCache& cache) { quarantine_cached_blocks(cache); });
  }

  // Why the pool grows: a request found no free block, or a loop's seals
  // have cost as much as a new segment (RentOrBuy), which buys room for a
  // few more blocks of its size (small segments: Note [Small blocks apart]).
  enum class Growth { needed, bought_by_seals };

  // Takes a new segment of at least `size` bytes from the driver. Returns
  // false when the driver or the pool's maximum has no room. (The index finds
  // the new free block for a request of `size` even when it lies in the
  // request's own list: Note [Two-level segregated fit].)
  bool grow(std::size_t size, Growth growth = Growth::needed) {
    if (options.expandable) return grow_arena(size);
    if (is_small(size)) return grow_small(size, growth);
    return grow_shared(size).has_value();
  }

  // grow() for the shared segments; the region they grew by, or nullopt.
  std::optional<detail::TlsfBlockAllocator::Region> grow_shared(std::size_t size) {
    const std::size_t wanted = util::round_up(size, kSegmentGranularity);
    // Growing by a 32nd of the shared segments keeps them few while
    // reserving little more than is needed. At least 8 MiB, or room for 4 of
    // the largest request grown for where that is less: a pool of small
    // blocks grows by small steps. (RMM's random workload, seeds 1-8 twice,
    // simulated driver: with a 16th and room for 8, the means of reserved
    // over live were 1.22, 1.20 and 1.20 up to 4 MiB, 1 MiB and 256 KiB with
    // 512, 512 and 64 MiB live, 1.32 up to 1 MiB with 64 MiB; now 1.19, 1.17,
    // 1.18 and 1.28. A 64th read the same as a 32nd. An 8th and 32 MiB had
    // read up to 1.33.)
    largest_request_grown_for = std::max(largest_request_grown_for, size);
    const std::size_t floor = std::clamp(util::round_up(4 * largest_request_grown_for, kSegmentGranularity),
                                         kSegmentGranularity, kMinimumGrowth);
    std::size_t segment = std::max(wanted, util::round_up(std::max(blocks.region_bytes() / 32, floor),
                                                    kSegmentGranularity));
    if (passes_peak(segment)) {
      if (auto adopted = adopt_spare(size, segment)) return adopted;
    }
    give_back_spares_within_peak(segment);
    return add_new_segment(blocks, wanted, segment);
  }

  // A new driver allocation of `segment` bytes (or of `wanted`, where that
  // many do not fit the pool's maximum or the driver), made a region of
  // `index`; nullopt when not even `wanted` fits.
  std::optional<detail::TlsfBlockAllocator::Region> add_new_segment(detail::TlsfBlockAllocator& index,
                                                                     std::size_t wanted, std::size_t segment) {
    if (options.maximum_size) {
      const std::size_t room = options.maximum_size > reserved_bytes() ? options.maximum_size - reserved_bytes() : 0;
      if (room < wanted) return std::nullopt;
      segment = std::min(segment, room / kSegmentGranularity * kSegmentGranularity);
    }
    ScopedContext scope(*context);
    cuda::CUdeviceptr base = 0;
    for (;;) {
      const cuda::CUresult result = CUEMM_CU_RESULT(cuMemAlloc, &base, segment);
      if (result == cuda::CUDA_SUCCESS) break;
      if (result != cuda::CUDA_ERROR_OUT_OF_MEMORY) driver::throw_allocation_error(result, "cuMemAlloc", segment);
      if (segment == wanted) return std::nullopt;
      segment = wanted;  // the generous size did not fit: try the exact one
    }
    ++driver_allocations;
    try {
      index.add_region(base, segment);
    } catch (...) {
      ++driver_frees;
      CUEMM_CU_RESULT(cuMemFree, base);
      throw;
    }
    peak_reserved = std::max(peak_reserved, reserved_bytes());
    return detail::TlsfBlockAllocator::Region{base, segment};
  }

  // One more small segment (Note [Small blocks apart]): carved from the
  // initial segment's free space if it has room, else from the driver.
  bool grow_small(std::size_t size, Growth growth) {
    constexpr std::size_t wanted = kSegmentGranularity;  // (holds any small request)
    std::size_t segment =
        growth == Growth::bought_by_seals
            ? std::clamp(util::round_up(4 * size, kSegmentGranularity), wanted, kLargestSmallSegment)
            : wanted;
    if (carve_small_segment(segment)) return true;
    give_back_spares_within_peak(segment);
    return add_new_segment(small_blocks, wanted, segment).has_value();
  }

  // A small segment of up to `segment` bytes from the initial segment's free
  // space (looking at a few of its free blocks only); whether there was room.
  bool carve_small_segment(std::size_t segment) {
    if (!initial_segment) return false;
    segment = std::min(segment, initial_segment->size);
    const std::uintptr_t first = initial_segment->base, end = first + initial_segment->size;
    const std::optional<std::uintptr_t> base = blocks.allocate_where(
        segment, [&](std::uintptr_t address, std::size_t bytes) { return address >= first && address + bytes <= end; },
        kCarveLooks);
    if (!base) return false;
    try {
      carved_small_segments.insert(*base);
      try {
        small_blocks.add_region(*base, segment);
      } catch (...) {
        carved_small_segments.erase(*base);
        throw;
      }
    } catch (...) {
      blocks.deallocate(*base);
      throw;
    }
    carved_small_bytes += segment;
    return true;
  }

  // Gives the entirely free small segments back: those carved from the
  // initial segment to it, the others to the driver. Returns the bytes that
  // left the pool.
  std::size_t release_free_small_segments() noexcept {
    std::vector<detail::TlsfBlockAllocator::Region> free;
    try {
      free = small_blocks.take_free_regions();
    } catch (...) {
      return 0;  // (no host memory for the list: they stay until the next try)
    }
    std::size_t released = 0;
    ScopedContext scope(*context);
    for (const auto& region : free) {
      if (carved_small_segments.erase(region.base)) {
        blocks.deallocate(region.base);
        carved_small_bytes -= region.size;
        continue;
      }
      CUEMM_CU_RESULT(cuMemFree, region.base);
      ++driver_frees;
      released += region.size;
    }
    return released;
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
                                                                     std::size_t at_most = SIZE_MAX) {
    const std::optional<detail::DedicatedSegments::Segment> spare =
        dedicated.smallest_spare_of_at_least(index.rounded_size(size));
    if (!spare || spare->size > at_most) return std::nullopt;
    index.add_region(spare->base, spare->size);  // (first: it may throw, with nothing changed)
    dedicated.forget_spare(*spare);
    return detail::TlsfBlockAllocator::Region{spare->base, spare->size};
  }

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
    if (!passes_peak(more)) return;
    const std::size_t over = reserved_bytes() + more - peak_reserved;
    const std::size_t spare = dedicated.spare_bytes();
    free_segments(dedicated.take_spares_over(spare > over ? spare - over : 0));
  }

  // grow() with options.expandable: extends the arena by what its free end
  // lacks for a block of `size`; take_block() maps the pages under the block
  // (Note [Expandable arena]).
  bool grow_arena(std::size_t size) {
    ScopedContext scope(*context);
    if (!arena) arena = std::make_unique<detail::ExpandableArena>(context->device().id());
    if (!arena->reserved()) {
      std::size_t free = 0, total = 0;
      CUEMM_CU(cuMemGetInfo, &free, &total);
      // Addresses for the whole device, even under a maximum: that bounds
      // the pages mapped, while the free space between blocks takes addresses.
      arena->reserve(std::max(options.maximum_size, total));
    }
    const std::uintptr_t base = arena->base();
    const std::uintptr_t end = base + arena->extent();
    const std::size_t free_at_end = arena->extent() ? end - blocks.free_tail(base) : 0;
    const std::size_t wanted = util::round_up(size, kBlockGranularity);
    const std::size_t step = util::round_up(wanted > free_at_end ? wanted - free_at_end : 1, arena->granularity());
    if (!arena->extend(step)) return false;
    try {
      if (end == base) {
        blocks.add_region(base, step);
      } else {
        blocks.extend_region(base, step);
      }
    } catch (...) {
      arena->shrink_to(end - base);
      throw;
    }
    return true;
  }

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
  std::optional<std::uintptr_t> take_block(std::size_t size) {
    if (!arena) [[likely]]
      return (is_small(size) ? small_blocks : blocks).allocate(size);
    // Not only the best fit: a free block a little larger whose pages are
    // mapped costs no driver call, where the best fit's would cost a
    // mapping now and an unmapping later. (Simulated, seeds 1-8: pages
    // mapped up to 4 MiB with 512 MiB and 128 MiB live 4,565 -> 3,331 and
    // 2,607 -> 1,819; per-layer training 4,708 -> 4,517; the footprint within
    // 0.015 of taking the best fit only.)
    const std::uintptr_t base = arena->base();
    return blocks.allocate_where(
        size, [&](std::uintptr_t address, std::size_t bytes) { return arena->committed(address - base, bytes); },
        kMappedLooks);
  }

  // A block that may cost memory: the pool grows for it (in the arena, the
  // pages under the best fit are mapped, after the range grows if no free
  // block fits). Nullopt when the driver or the pool's maximum has no room.
  std::optional<std::uintptr_t> grow_and_take(std::size_t size, Growth growth = Growth::needed) {
    if (!options.expandable) return grow(size, growth) ? take_block(size) : std::nullopt;
    std::optional<std::uintptr_t> address = blocks.allocate(size);  // the best fit, mapped or not
    if (!address && grow(size)) address = blocks.allocate(size);
    if (!address) return std::nullopt;
    try {
      if (map_pages_under(*address, blocks.block_size(*address))) return address;
    } catch (...) {
      blocks.deallocate(*address);
      throw;
    }
    blocks.deallocate(*address);
    return std::nullopt;
  }

  // Maps the arena's pages under [address, address + bytes) (a block just
  // taken from the index, or the initial size), giving free pages back
  // first where the pool would pass its peak or its maximum. False when the
  // driver or the maximum has no room.
  bool map_pages_under(std::uintptr_t address, std::size_t bytes) {
    const std::size_t offset = address - arena->base();
    if (arena->committed(offset, bytes)) [[likely]]
      return true;
    const std::size_t page = arena->granularity();
    const std::size_t at_most = (util::round_up(offset + bytes, page) - offset / page * page);
    if (passes_peak(at_most) && defer_depth == 0) {
      // Frees waiting for the GPU may have finished: their pages count too.
      if (quarantined_bytes) {
        seal();
        reclaim(false);
      }
      const std::size_t over = reserved_bytes() + at_most - peak_reserved;
      if (unmap_free_pages(over) < over) give_back_spares_within_peak(at_most);
    }
    if (options.maximum_size && reserved_bytes() + at_most > options.maximum_size) {
      unmap_free_pages(reserved_bytes() + at_most - options.maximum_size);
      if (reserved_bytes() + at_most > options.maximum_size) return false;
    }
    ScopedContext scope(*context);
    std::size_t mapped = 0;
    if (!arena->commit(offset, bytes, mapped)) return false;
    driver_allocations += mapped;
    peak_reserved = std::max(peak_reserved, reserved_bytes());
    return true;
  }

  // Unmaps the arena's pages that lie wholly in free blocks, largest blocks
  // first, until `bytes` are unmapped or none is left; returns the bytes.
  std::size_t unmap_free_pages(std::size_t bytes) {
    const std::size_t page = arena->granularity();
    const std::uintptr_t base = arena->base();
    std::size_t unmapped = 0;
    ScopedContext scope(*context);
    blocks.for_each_free_block(page, [&](std::uintptr_t address, std::size_t size) {
      const std::size_t pages = arena->decommit(address - base, size);
      driver_frees += pages;
      unmapped += pages * page;
      return unmapped < bytes;
    });
    return unmapped;
  }

  // grow() for the initial size, which is reserved at once: in the arena,
  // its pages are mapped too.
  bool grow_initially(std::size_t size) {
    if (!options.expandable) {
      initial_segment = grow_shared(size);
      return initial_segment.has_value();
    }
    if (!grow(size)) return false;
    if (map_pages_under(arena->base(), arena->extent())) return true;
    blocks.take_free_regions();
    arena->shrink_to(0);
    return false;
  }

  // Gives back every spare and every entirely free shared segment.
  std::size_t release_free_segments() {
    return_whole_recurring_regions();
    const auto spares = dedicated.take_spares_over(0);
    free_segments(spares);
    std::size_t released = 0;
    for (const auto& spare : spares) released += spare.size;
    released += release_free_small_segments();
    ScopedContext scope(*context);
    if (arena) return released + shrink_arena();
    for (const auto& region : blocks.take_free_regions()) {
      if (initial_segment && region.base == initial_segment->base) initial_segment.reset();
      CUEMM_CU_RESULT(cuMemFree, region.base);
      ++driver_frees;
      released += region.size;
    }
    return released;
  }

  // Cuts the arena's free end and unmaps every page of its free space.
  std::size_t shrink_arena() {
    if (arena->extent() == 0) return 0;
    const std::size_t before = arena->mapped_bytes();
    const std::uintptr_t base = arena->base();
    const std::size_t cut = util::round_up(blocks.free_tail(base) - base, arena->granularity());
    if (cut < arena->extent()) {
      if (cut == 0) {
        blocks.take_free_regions();  // the arena's one region, all free
      } else {
        blocks.shrink_region(base, base + cut);
      }
      driver_frees += arena->shrink_to(cut);
    }
    if (cut > 0) unmap_free_pages(SIZE_MAX);
    return before - arena->mapped_bytes();
  }

  // A block of `size` bytes from the index, trying in order of cost: the
  // index, completed epochs, pending epochs when they hold enough, the
  // driver, the thread caches and any pending epoch, and finally giving
  // empty segments back so that one large one fits.
  // `own` is the calling thread's cache, if it has one.
  std::uintptr_t allocate_from_index(std::size_t size, ThreadCache* own = nullptr, bool in_a_loop = false) {
    if (auto address = take_block(size)) [[likely]]
      return *address;
    // A long loop whose frees wait in the quarantine grows the pool once its
    // seals have cost about as much as a new segment (as allocate_dedicated()).
    // Only a loop (the thread's requests that reached the index were for
    // these bytes several times in a row): requests of sizes that vary grew
    // the pool beside the blocks that waited for their seal, which a FIFO of
    // random sizes up to 4 MiB then left as holes (simulated: 1.30 -> 1.21
    // reserved over live; RMM's workload up to 4 MiB with 512 MiB live, seeds
    // 1-16, 1.16 -> 1.14, a third more seals).
    // Not while the caller's cache holds a 32nd of the pool in other sizes:
    // returning those (below) costs no memory. (A thread that had freed
    // 13 MiB of a 36 MiB pool into its rings grew it. With an 8th, RMM's
    // random workload up to 256 KiB with 16 MiB live reserved 1.38 times its
    // live bytes, not 1.29, for 4-10% fewer seals; simulated driver, seeds 1-8.)
    if (in_a_loop && index_rental.buys(kSealsWorthASegment) && quarantined_bytes + size <= rotation_budget(size) &&
        !(own && own->bytes_in_other_classes(size) > reserved_bytes() / 32)) {
      // Other threads' idle rings first, as below: threads of random sizes
      // otherwise grew here while their caches held over half the pool
      // (the caller's own rings stay: a loop buys instead of sealing).
      if (cached_bytes(own) > reserved_bytes() / 32) {
        if (auto address = take_back_idle_rings(size, own)) return *address;
      }
      if (auto address = grow_and_take(size, Growth::bought_by_seals)) {
        index_rental.bought();
        return *address;
      }
    }
    seal();
    index_rental.rent();
    reclaim(false);
    if (auto address = take_block(size)) return *address;
    // Enough freed memory is waiting for the GPU: wait for it rather than grow.
    // (The threads' caches are left alone here: emptying them whenever the
    // index runs dry makes busy threads thrash; measured, 16 threads at 64 KiB
    // went from 16 ns to 1.1 us a pair.)
    if (quarantined_bytes >= size) {
      seal();
      reclaim(true);
      if (auto address = take_block(size)) return *address;
    }
    // The caller's own cached blocks that are safe already may merge into
    // one that fits: cheaper than growing, where this thread holds most of
    // what the threads cache (it hoards rather than shares a busy pool).
    // Nothing waits here, and other threads' caches are left alone: both made
    // busy threads thrash. (Measured on the H100: RMM's random workload up
    // to 1 MiB went from 1.59 to 1.15 reserved over live, and up to 4 MiB,
    // once requests above the classes did this too, from 1.31 to 1.23; done
    // for every thread, 16 threads of 64 KiB pairs went from 4 to 53 ns.)
    const std::size_t own_bytes = own ? bytes_cached_by(*own) : 0;
    if (own_bytes >= size && 2 * own_bytes >= cached_bytes()) {
      return_safe_cached_blocks(*own, size);
      if (auto address = take_block(size)) return *address;
    }
    // Other threads' caches may hold much of the pool in classes they are
    // not asking for now (a thread's rings keep what it freed, up to its
    // budget): past a 32nd of the pool, those go back before it grows.
    // A thread's latest class stays, so loops keep their rings. (RMM's random
    // workload from 4 and 8 threads, up to 1 MiB and 256 KiB: 2.7-8.6
    // reserved over live with none of this, 1.38-1.56 past a quarter, 1.12-1.31
    // past a 32nd; pair loops ran this as often either way, about 100 times
    // in a benchmark run. Emptying whole caches here made pair loops of 4
    // and 16 threads 1.5-2x slower. Simulated driver.)
    if (cached_bytes() > reserved_bytes() / 32) {
      if (auto address = take_back_idle_rings(size, own)) return *address;
    }
    // A hole of the shared segments no larger than the largest request they
    // grew for (holes their requests seldom fit; every block there is over
    // the classes' largest) takes a small block before a new small segment
    // would take the pool past its peak (Note [Small blocks apart]).
    if (is_small(size) && passes_peak(kSegmentGranularity)) {
      if (auto address = blocks.allocate_in_hole(size, largest_request_grown_for)) return *address;
    }
    // Stream-ordered frees kept idle, before the pool grows past its peak beside them.
    if (own && passes_peak(is_small(size) ? kSegmentGranularity : std::max(size, kMinimumGrowth)) &&
        give_back_ordered_blocks(*own, detail::size_class_of(size))) {
      if (auto address = take_block(size)) return *address;
    }
    if (auto address = grow_and_take(size)) return *address;
    flush_caches();
    seal();
    reclaim(true);
    if (auto address = take_block(size)) return *address;
    if (release_free_segments() > 0) {
      if (auto address = grow_and_take(size)) return *address;
    }
    // At the driver's limit or the pool's maximum, a small block may come
    // from the shared segments' free space (Note [Small blocks apart]).
    if (is_small(size)) {
      if (auto address = blocks.allocate(size)) return *address;
    }
    throw out_of_memory(size);
  }

  // What threads other than `own` hold in classes other than their latest
  // goes back (through the quarantine); then a block of `size` from the
  // index, if that made one.
  std::optional<std::uintptr_t> take_back_idle_rings(std::size_t size, const ThreadCache* own) {
    for_each_other_cache(own, [&](ThreadCache& cache) { quarantine_idle_ring_blocks(cache); });
    seal();
    reclaim(false);
    return take_block(size);
  }

  // Returns a new segment of its own, or nullopt when the driver or the
  // pool's maximum has no room.
  std::optional<std::uintptr_t> new_dedicated_segment(std::size_t segment) {
    if (options.maximum_size && reserved_bytes() + segment > options.maximum_size) return std::nullopt;
    ScopedContext scope(*context);
    cuda::CUdeviceptr base = 0;
    const cuda::CUresult result = CUEMM_CU_RESULT(cuMemAlloc, &base, segment);
    if (result == cuda::CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
    if (result != cuda::CUDA_SUCCESS) driver::throw_allocation_error(result, "cuMemAlloc", segment);
    ++driver_allocations;
    try {
      dedicated.add(base, segment);
    } catch (...) {
      CUEMM_CU_RESULT(cuMemFree, base);
      ++driver_frees;
      throw;
    }
    peak_reserved = std::max(peak_reserved, reserved_bytes());
    return base;
  }

  // A block of `size` bytes in a segment of its own (Note [Dedicated
  // segments]): a spare, a spare once pending frees complete (waiting costs
  // microseconds; a new segment costs memory and a driver call of 100 us),
  // or a new segment, for which spares go back where the pool would pass its
  // peak; on out of memory, everything the other paths give back too.
  // `in_a_loop`: the thread asked for this size several times in a row,
  // freeing one each time (see ThreadCache::count_segment_request()).
  std::uintptr_t allocate_dedicated(std::size_t size, bool in_a_loop, ThreadCache* own = nullptr) {
    const std::size_t segment = detail::DedicatedSegments::segment_size(size);
    if (segment == 0) throw OutOfMemory("PoolMemoryManager::allocate", size, "no device has that much memory");
    const bool recurs = options.split_spares && saw_large_size(size);
    if (auto base = dedicated.take_spare(segment)) return *base;
    // Reusing a segment freed since the last seal costs a stream query (a
    // third of a microsecond on the H100, and in Python the GIL's hand-over);
    // a new segment costs about 0.1 ms once (see RentOrBuy). Idle segments
    // stay within a small budget; spares of other sizes go first. Only for a
    // loop of this size, which the new segment serves again: requests of
    // sizes that vary (a program's temporaries) bought segments that no later
    // request fitted while the segment freed before them waited for its seal
    // (simulated, seeds 1-16: RMM's workload up to 64 MiB with 256 MiB live
    // 1.17-1.18 -> 1.108, max 1.27 -> 1.18; logs of small long-lived blocks
    // beside large temporaries 1.13-1.56 -> 1.05-1.06; the rest the same).
    const std::size_t budget = rotation_budget(segment);
    if (in_a_loop && segment_rental.buys(kSealsWorthASegment) && quarantined_segments < kMaximumRotation &&
        quarantined_segment_bytes + segment <= budget) {
      free_segments(dedicated.take_spares_over(budget - quarantined_segment_bytes - segment));
      give_back_spares_within_peak(segment);
      if (auto base = new_dedicated_segment(segment)) {
        segment_rental.bought();
        return *base;
      }
    }
    seal();
    segment_rental.rent();
    reclaim(false);
    if (auto base = dedicated.take_spare(segment)) return *base;
    if (quarantined_bytes >= segment) {
      reclaim(true);
      if (auto base = dedicated.take_spare(segment)) return *base;
    }
    // Before the pool's footprint passes its peak, the spares and the shared
    // segments left empty go back: a program whose sizes change (a training
    // step's activations, then its gradients) otherwise peaks at the sum of
    // its phases. Once at its peak the pool no longer comes here, so loops
    // keep their spares. (Simulated driver, seeds 1-6: RMM's workload up to
    // 64 MiB with 1 GiB and 256 MiB live, and up to 16 MiB with 256 MiB,
    // 1.08 -> 1.06, 1.23 -> 1.18 and 1.30 -> 1.24 reserved over live, with
    // the same driver calls; up to 4 MiB unchanged; a training-like log 1.19
    // -> 1.17. Giving back the threads' held blocks of other sizes here too
    // took that log to 1.14, but broke the rotations of loops that alternate
    // between large sizes.)
    if (passes_peak(segment)) {
      // Not for a loop: a block of the index goes back there at its free,
      // so the loop would never hold a rotation, and would seal for each
      // request and take the pool's lock for each pair (16 threads of 4 MiB
      // pairs on the H100, in a pool left at its peak by smaller ones:
      // 78-137 ns a pair, against 8.5-12 with segments of their own).
      if (!in_a_loop) {
        if (own && give_back_ordered_blocks(*own, -1)) {
          if (auto base = dedicated.take_spare(segment)) return *base;
        }
        if (auto address = allocate_from_index_within_peak(size)) return *address;
        if (recurs) {
          if (auto address = allocate_recurring(size)) return *address;
        }
      }
      // (A recurring size gives back only what it needs: the spares are
      // what the next ones split.)
      if (recurs) {
        give_back_spares_within_peak(segment);
      } else {
        release_free_segments();
      }
    }
    if (auto base = new_dedicated_segment(segment)) return *base;
    flush_caches();
    seal();
    reclaim(true);
    if (auto base = dedicated.take_spare(segment)) return *base;
    release_free_segments();
    if (auto base = new_dedicated_segment(segment)) return *base;
    throw out_of_memory(size);
  }

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
  bool saw_large_size(std::size_t size) noexcept {
    constexpr std::size_t kRemembered = 4096;
    if (large_sizes_seen.size() >= kRemembered) large_sizes_seen.clear();
    try {
      return !large_sizes_seen.insert(size).second;
    } catch (...) {
      return false;  // (no host memory to remember it)
    }
  }

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

  OutOfMemory out_of_memory(std::size_t size) const {
    return OutOfMemory("PoolMemoryManager::allocate", size,
                       "the pool holds " + describe_bytes(reserved_bytes()) + " in " +
                           std::to_string(segment_count()) + " segment(s), " +
                           describe_bytes(in_use_bytes()) + " in use" +
                           (options.maximum_size ? "; maximum " + describe_bytes(options.maximum_size) : ""));
  }

  // Bytes in blocks handed out.
  std::size_t in_use_bytes() const noexcept {
    return blocks.allocated_bytes() - carved_small_bytes +
           small_blocks.allocated_bytes() + recurring.allocated_bytes() + dedicated.bytes() - dedicated.spare_bytes() -
           quarantined_bytes - cached_bytes();
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
  ThreadCache* make_thread_slot();
  void thread_slot_done(ThreadCache* cache) noexcept { forget_cache(cache); }

  // The cache class of a request, or -1 for the shared index or a segment of its own.
  int size_class(std::size_t size) const noexcept {
    return caches_enabled() && !wants_own_segment(size) ? detail::size_class_of(size) : -1;
  }
  bool wants_own_segment(std::size_t size) const noexcept { return size >= options.dedicated_size; }
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
    if (cache.held_hits_since_miss < kHitsOfALoop) ++cache.held_hits_since_miss;  // (a loop would wrap it)
    return block;
  }

  [[gnu::noinline]] std::uintptr_t allocate_otherwise(std::size_t size, int size_class) {
    if (size_class < 0) {
      ThreadCache* own = caches_enabled() ? cache_of_this_thread() : nullptr;
      if (own) return allocate_large(size, *own);
      std::lock_guard lock(mutex);
      return allocate_beyond_classes(size, nullptr);
    }
    ThreadCache* own = cache_of_this_thread();
    if (!own) [[unlikely]] {
      std::lock_guard lock(mutex);
      return allocate_from_index(detail::size_class_bytes(size_class));
    }
    ThreadCache& cache = *own;
    bool advance = false, sealed = false;
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        std::lock_guard cache_lock(cache.lock.owner());
        cache.latest_class = size_class;
        if (const std::uintptr_t address = cache.take_oldest_if_safe(size_class, epochs)) [[likely]]
          return address;
        ThreadCache::Bin& bin = cache.bins[size_class];
        // A seal that was not due yet (another thread's was recent) is tried
        // again after a sixteenth of a ring, not a half: a loop faster than
        // a ring per kSealInterval otherwise missed most seals, filled its
        // ring and took its blocks from the index (simulated driver, 256 B
        // pairs: 8 -> 20 ns, once the pair was fast enough to miss them).
        if (attempt == 1 && !sealed) {
          const std::uint32_t retry = std::max<std::uint32_t>(bin.capacity / 16, 1);
          bin.frees_since_advance = bin.capacity / 2 - std::min(retry, bin.capacity / 2);
        }
        // Half a ring of frees since the last advance: seal and look for
        // completed epochs, once per batch.
        // (Or many frees of any class: a thread whose requests are spread
        // over many classes must still see its frees become reusable.)
        advance = attempt == 0 && (bin.frees_since_advance >= bin.capacity / 2 ||
                                   cache.frees_since_advance >= kMaximumBinCapacity / 2);
        if (advance) bin.frees_since_advance = cache.frees_since_advance = 0;
      }
      if (!advance) break;
      sealed = advance_epochs();
    }
    const std::size_t class_bytes = detail::size_class_bytes(size_class);
    const bool in_a_loop = cache.count_index_request(class_bytes, kHitsOfALoop);
    // The ring may hold most of the pool before its batch is due: once
    // sealed, its oldest block is cheaper than giving the ring back to the
    // index (measured: 64 KiB pairs in an 8 MiB pool, 42 -> 16 ns a pair
    // here). Only from a ring that holds a batch worth a seal: short rings
    // (many threads) let the pool grow instead. Not under the pool's lock,
    // and skipped while another thread seals (that seal may cover this ring
    // too): 16 threads of 1 MiB pairs otherwise queued behind each other's
    // stream queries.
    const ThreadCache::Bin& bin = cache.bins[size_class];  // (its own thread: no other writes the count now)
    auto seal_for_own_ring = [&]() -> std::uintptr_t {
      if (bin.count < std::min(kRingBatchWorthSealing, bin.capacity / kRingFractionWorthSealing)) return 0;
      epochs.try_seal();
      epochs.try_poll();
      std::lock_guard cache_lock(cache.lock.owner());
      return cache.take_oldest_if_safe(size_class, epochs);
    };
    // A ring that the budget keeps short (the largest classes) seals before
    // it takes from the index: with other threads' spills feeding the index,
    // it otherwise grew to the budget, spilled, and took the other threads'
    // blocks back, through the pool's lock at every pair (simulated driver,
    // 2 threads of 1 MiB pairs: 147 -> 42 ns a pair; H100, 16 threads over 1
    // at 1 MiB: 1.6-3.4x -> 16.7x). Smaller classes take from the index
    // first: a pair served there calls no driver, which keeps the Python
    // bridge's GIL (see BlockingHook).
    const bool ring_first = bin.capacity < kMaximumBinCapacity;
    if (ring_first) {
      if (const std::uintptr_t address = seal_for_own_ring()) return address;
    }
    {
      std::lock_guard lock(mutex);
      if (auto address = take_block(class_bytes)) [[likely]]
        return *address;
      // A ring that seals because the index ran dry pays a seal for every
      // batch, as many as the pool holds: once those have cost about as much
      // as a segment, the pool grows instead (allocate_from_index()), and
      // the batches with it. (Pools start small: 64 KiB loops in a 4 MiB
      // pool paid a stream query per 64 pairs.)
      if (!ring_first) {
        if (in_a_loop && index_rental.buys(kSealsWorthASegment)) return allocate_from_index(class_bytes, &cache, true);
        index_rental.rent();
      }
    }
    if (!ring_first) {
      if (const std::uintptr_t address = seal_for_own_ring()) return address;
    }
    std::lock_guard lock(mutex);
    return allocate_from_index(class_bytes, &cache, in_a_loop);
  }

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
  std::uintptr_t allocate_large(std::size_t size, ThreadCache& cache) {
    const bool own_segment = wants_own_segment(size);
    const std::size_t needed = large_block_bytes(size, own_segment);
    // Whether the thread's loop takes one more block from the pool rather
    // than wait for one it holds (see RentOrBuy).
    bool buys_one_more = false;
    bool waits_for_the_gpu = false;
    bool missed = false;  // no held block fits
    if (own_segment) cache.count_segment_request(needed, kHitsOfALoop);
    for (int attempt = 0; needed != 0 && attempt < 2; ++attempt) {
      std::uint64_t waits_for = 0;
      bool may_hold_more = false;
      {
        std::unique_lock cache_lock(cache.lock.owner());
        const int found = cache.find_held_large(needed, own_segment);
        if (found < 0) {
          missed = true;
          break;
        }
        if (epochs.is_safe(cache.held(found).epoch)) {
          const ThreadCache::OrderedLarge block = take_held(cache, static_cast<std::uint32_t>(found));
          if (cache.held_skips < kSkipsBeforeGivingBack) [[likely]]
            return block.address;
          cache.held_skips = 0;
          cache_lock.unlock();  // the pool's lock comes first
          std::lock_guard lock(mutex);
          std::lock_guard relock(cache.lock.owner());
          quarantine_held_misfits(cache, needed, own_segment);
          return block.address;
        }
        if (attempt == 1) {
          waits_for_the_gpu = true;  // the pool's path waits for it
          break;
        }
        may_hold_more = rotation_may_grow(cache, needed, own_segment);
        if (may_hold_more && cache.held_rental.buys(kSealsWorthASegment)) {
          cache.held_rental.bought();
          buys_one_more = true;
          break;
        }
        waits_for = cache.held(found).epoch;
      }
      // An idle block of the size costs less than a seal (and then the loop
      // seals once a rotation): a new thread takes over a finished one's.
      if (may_hold_more) {
        if (const std::uintptr_t address = take_idle_block(size, own_segment, cache)) return address;
      }
      cache.held_rental.rent();
      epochs.seal_through(waits_for);
    }
    std::lock_guard lock(mutex);
    if (!buys_one_more) {
      // A request for another size gives back the held blocks that are no
      // rotation (no other held block is of their size): a thread that
      // moved on would leave them idle (RMM's random workload up to 64 MiB:
      // 1.06-1.10 reserved over live, 1.14-1.19 keeping them). One that
      // must wait for the GPU gives back all, for the pool to wait on.
      std::lock_guard cache_lock(cache.lock.owner());
      if (waits_for_the_gpu)
        quarantine_held_blocks(cache);
      else
        quarantine_held_strays(cache);
      // A thread whose requests seldom find a held block is no loop: it
      // keeps no more than a quarter of the pool's live bytes, oldest
      // blocks first back, and none where the request would take the pool
      // past its peak: they go back before it grows. (RMM's random workload
      // up to 64 MiB with 256 MiB live, where random sizes pass for
      // rotations: 2.06 -> 1.21 reserved over live on the simulated driver,
      // and none at the peak 1.108 -> 1.09; logs of inference requests of
      // random batch sizes 1.23 -> 1.09. Loops keep every rotation.)
      if (missed) {
        if (cache.held_hits_since_miss < kHitsOfALoop) {
          const std::size_t keep = passes_peak(needed) ? 0 : in_use_bytes() / 4;
          while (cache.held_large_count && cache.held_large_bytes > keep) quarantine_held_block(cache, 0);
        }
        cache.held_hits_since_miss = 0;
      }
    }
    if (missed && passes_peak(needed)) quarantine_idle_held_of_others(cache);
    const std::uintptr_t address = allocate_beyond_classes(size, &cache);
    lend_from_pool(cache, address);
    return address;
  }

  // Where a request would take the pool past its peak: what threads other
  // than `own` hold of their large frees, unless they are loops, goes to the
  // quarantine (allocate_large()'s rule for the requesting thread, for every
  // thread). A thread of random sizes otherwise kept them idle while another
  // grew the pool (RMM's random workload on 8 threads, simulated, seeds 1-4:
  // up to 64 MiB with 1 GiB and 256 MiB live 1.24 -> 1.06 and 1.36 -> 1.09,
  // up to 16 MiB 1.26 -> 1.15). The caller holds `mutex`.
  void quarantine_idle_held_of_others(const ThreadCache& own) {
    for_each_other_cache(&own, [&](ThreadCache& other) {
      if (other.held_hits_since_miss < kHitsOfALoop) quarantine_held_blocks(other);
    });
  }

  // A free block of the size that the pool has at hand (a spare segment, or
  // from the index without growing it), lent to the thread; 0 if none, or
  // if the pool's lock is busy (the caller seals instead).
  std::uintptr_t take_idle_block(std::size_t size, bool own_segment, ThreadCache& cache) {
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return 0;
    const std::optional<std::uintptr_t> address =
        own_segment ? dedicated.take_spare(detail::DedicatedSegments::segment_size(size)) : take_block(size);
    if (!address) return 0;
    lend_from_pool(cache, *address);
    return *address;
  }

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
                                              const ThreadCache::OrderedLarge& lent, bool strays_from_its_kind) noexcept {
    std::lock_guard lock(mutex);
    if (strays_from_its_kind) {
      quarantine_or_reuse({address, lent.bytes, epoch, false});
      return;
    }
    std::lock_guard cache_lock(cache.lock.owner());
    try {
      // The oldest of its own rotation when that is full, else the oldest of all.
      while (cache.held_large_count && !has_room_to_hold(cache, lent.bytes, lent.dedicated)) {
        const int own = rotation_has_room(cache, lent.bytes, lent.dedicated)
                            ? -1
                            : cache.find_held_large(lent.bytes, lent.dedicated);
        quarantine_held_block(cache, own < 0 ? 0 : static_cast<std::uint32_t>(own));
      }
    } catch (...) {
      // No room to defer the oldest: this one waits in the quarantine instead.
      quarantine_or_reuse({address, lent.bytes, epoch, lent.dedicated});
      return;
    }
    cache.push_held_large(lent, epoch);
  }

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

  [[gnu::noinline]] void deallocate_otherwise(std::uintptr_t address, int size_class, std::uint64_t epoch) noexcept {
    if (size_class < 0) {
      ThreadCache* cache = cache_for_a_free();
      if (cache && hold_large(address, epoch, *cache)) return;
      std::lock_guard lock(mutex);
      large_frees_elsewhere.fetch_add(1, std::memory_order_acq_rel);
      const auto [block, in_segment_of_its_own] = block_at(address);
      if (block == 0) return;
      if (!quarantine_or_reuse({address, block, epoch, in_segment_of_its_own})) return;
      // The block is in the quarantine now: a failed poll below leaves it
      // there for a later one (reusing it here as well counted it twice).
      try {
        if (in_segment_of_its_own) {
          // Beyond the segments that rotate (see allocate_dedicated()), a
          // request of this size may wait for this one: seal now, so that it seldom does.
          if (quarantined_segments >= kMaximumRotation ||
              quarantined_segment_bytes + dedicated.spare_bytes() > rotation_budget(block)) {
            seal_if_due();
            reclaim(false);
          }
        } else if (quarantined_bytes > reserved_bytes() / 8) {
          // At most one seal every kSealInterval: in a small pool one block
          // is 1/8 of it, and sealing at every free cost 1-4 MiB pairs a
          // stream query each (and in Python the GIL's hand-over: 2-3 us).
          seal_if_due();
          reclaim(false);
        }
      } catch (...) {
      }
      return;
    }
    ThreadCache* cache = cache_for_a_free();
    if (cache && keep_in_ring(*cache, address, size_class, epoch))
      return;
    deallocate_spilling(cache, address, size_class, epoch);
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
    if (bin.count == bin.capacity ||
        cache.bytes.load(std::memory_order_relaxed) + detail::size_class_bytes(size_class) > cache.budget)
      return false;
    cache.push_to_ring(size_class, address, epoch);
    return true;
  }

  [[gnu::noinline]] void deallocate_spilling(ThreadCache* cache, std::uintptr_t address, int size_class,
                                             std::uint64_t epoch) noexcept {
    const std::size_t class_bytes = detail::size_class_bytes(size_class);
    std::array<Freed, kMaximumBinCapacity / 2> spilled;
    std::size_t spill_count = 0;
    int spill_class = size_class;
    if (cache) {
      std::lock_guard cache_lock(cache->lock.owner());
      ThreadCache::Bin& bin = cache->bins[size_class];
      // Full ring: its older half goes to the shared quarantine; full
      // budget: see spill_stalest().
      if (bin.count == bin.capacity)
        spill_count = cache->take_oldest(size_class, bin.count / 2, spilled.data());
      else if (cache->bytes.load(std::memory_order_relaxed) + class_bytes > cache->budget)
        spill_class = cache->spill_stalest(size_class, epoch, spilled.data(), spill_count);
      if (bin.count < bin.capacity) {
        cache->push_to_ring(size_class, address, epoch);
        address = 0;
      }
    }
    quarantine_spilled(spilled.data(), spill_count, detail::size_class_bytes(spill_class));
    if (address) {  // no cache, or no room in it
      const Freed freed{address, epoch};
      quarantine_spilled(&freed, 1, class_bytes);
    }
  }

  // Blocks of one class that a thread's cache had no room for go to the
  // quarantine; with no host memory to record them there, to the index at
  // once (rather than leak), those not yet recorded.
  void quarantine_spilled(const Freed* spilled, std::size_t count, std::size_t class_bytes) noexcept {
    if (count == 0) return;
    std::lock_guard lock(mutex);
    std::size_t recorded = 0;
    try {
      for (; recorded < count; ++recorded) quarantine_block(spilled[recorded].address, class_bytes, spilled[recorded].epoch);
    } catch (...) {
      for (std::size_t i = recorded; i < count; ++i) deallocate_in_index(spilled[i].address);
    }
  }

  // --- stream-ordered, on a default stream (Note [Stream-ordered reuse]) ---

  // The common case (a block in the thread's bin) apart, as allocate()'s.
  std::uintptr_t allocate_ordered(std::size_t size, int size_class) {
    if (size_class >= 0) [[likely]] {
      if (ThreadCache* own = last_cache_of_this_thread()) [[likely]] {
        const OwnerBiasedLock::TriedOwnerLock cache_lock(own->lock.owner());
        if (cache_lock.held()) [[likely]] {
          if (const std::uintptr_t address = own->take_ordered(size_class)) [[likely]]
            return address;
        }
      }
    }
    return allocate_ordered_otherwise(size, size_class);
  }

  [[gnu::noinline]] std::uintptr_t allocate_ordered_otherwise(std::size_t size, int size_class) {
    ThreadCache* own = caches_enabled() ? cache_of_this_thread() : nullptr;
    if (!own) return allocate(size, size_class);
    ThreadCache& cache = *own;
    // (The index and the segments of their own give the thread's other
    // stream-ordered frees back before they grow: give_back_ordered_blocks().)
    if (size_class >= 0) {
      {
        std::lock_guard cache_lock(cache.lock.owner());
        if (const std::uintptr_t address = cache.take_ordered(size_class)) return address;
      }
      return allocate(size, size_class);
    }
    const bool own_segment = wants_own_segment(size);
    const std::size_t needed = large_block_bytes(size, own_segment);
    {
      std::lock_guard cache_lock(cache.lock.owner());
      if (auto found = cache.take_ordered_large(needed, own_segment)) {
        cache.lend(*found, large_frees_elsewhere.load(std::memory_order_acquire));
        return found->address;
      }
    }
    std::lock_guard lock(mutex);
    if (passes_peak(needed)) give_back_ordered_blocks(cache, -1);
    const std::uintptr_t address = allocate_beyond_classes(size, &cache);
    lend_from_pool(cache, address);
    return address;
  }

  // Before the pool grows past its peak for a request of class `kept` (-1:
  // beyond the classes): the blocks that `own` keeps from its stream-ordered
  // frees of other classes and sizes (up to its whole cache budget), and the
  // large ones every other thread keeps (up to kOrderedLargeCapacity each, of
  // any size), go to the quarantine, tagged with the open epoch, whose seal
  // covers their default streams; then that seal. They otherwise sat beside
  // the growth. (Simulated, RMM's random workload through allocate(size,
  // stream), seeds 1-8: up to 4 MiB with 512 MiB live 1.21 -> 1.14, up to
  // 64 MiB with 256 MiB 1.81 -> 1.14, up to 1 MiB with 64 MiB 2.64 -> 1.25,
  // near the stream-less interface's 1.14, 1.07 and 1.26.) Returns whether
  // any went; the caller holds `mutex`. A loop of one size seldom comes
  // here: its frees serve it.
  bool give_back_ordered_blocks(ThreadCache& own, int kept) {
    const std::uint64_t epoch = epochs.tag();
    bool moved = false;
    {
      std::lock_guard cache_lock(own.lock.owner());
      moved |= quarantine_ordered_bins(own, kept, epoch);
      moved |= quarantine_ordered_large(own, epoch);
    }
    for_each_other_cache(&own, [&](ThreadCache& other) { moved |= quarantine_ordered_large(other, epoch); });
    if (moved) {
      seal();
      reclaim(false);
    }
    return moved;
  }

  // The common case (room in the thread's bin) apart, as deallocate()'s.
  void deallocate_ordered(std::uintptr_t address, int size_class) noexcept {
    if (retired.load(std::memory_order_acquire)) return;
    if (size_class >= 0) [[likely]] {
      if (ThreadCache* cache = last_cache_of_this_thread()) [[likely]] {
        const OwnerBiasedLock::TriedOwnerLock cache_lock(cache->lock.owner());
        if (cache_lock.held() && push_ordered_if_room(*cache, address, size_class)) [[likely]]
          return;
      }
    }
    deallocate_ordered_otherwise(address, size_class);
  }

  [[gnu::noinline]] void deallocate_ordered_otherwise(std::uintptr_t address, int size_class) noexcept {
    ThreadCache* cache = cache_for_a_free();
    if (!cache) return deallocate(address, size_class);  // tagged with the epoch: still safe
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

  [[gnu::noinline]] void deallocate_ordered_spilling(ThreadCache& cache, std::uintptr_t address, int size_class) noexcept {
    const std::size_t class_bytes = detail::size_class_bytes(size_class);
    std::array<Freed, kMaximumBinCapacity / 2> spilled;
    std::size_t spill_count = 0;
    int spill_class = size_class;
    {
      std::lock_guard cache_lock(cache.lock.owner());
      ThreadCache::OrderedBin& bin = cache.ordered[size_class];
      // Full bin or budget, as deallocate(): the older half goes to the
      // quarantine, tagged now (their freeing work was queued before this call).
      if (bin.count == bin.capacity)
        spill_count = cache.take_oldest_ordered(size_class, bin.count / 2, epochs.tag(), spilled.data());
      else if (cache.bytes.load(std::memory_order_relaxed) + class_bytes > cache.budget)
        spill_class = cache.spill_stalest(size_class, epochs.tag(), spilled.data(), spill_count);
      if (bin.count < bin.capacity) {
        cache.push_ordered(size_class, address);
        address = 0;
      }
    }
    quarantine_spilled(spilled.data(), spill_count, detail::size_class_bytes(spill_class));
    if (address) {
      const Freed freed{address, epochs.tag()};
      quarantine_spilled(&freed, 1, class_bytes);
    }
  }

  // The size lookup needs the lock; the block then stays with the thread,
  // and the oldest one it kept goes to the quarantine when it has too many.
  void deallocate_ordered_large(std::uintptr_t address, ThreadCache& cache) noexcept {
    {
      std::lock_guard cache_lock(cache.lock.owner());
      const auto lent = cache.take_lent(address, large_frees_elsewhere.load(std::memory_order_acquire));
      if (lent && cache.ordered_large_count < kOrderedLargeCapacity) [[likely]] {
        cache.push_ordered_large(*lent);
        return;
      }
    }
    std::lock_guard lock(mutex);
    large_frees_elsewhere.fetch_add(1, std::memory_order_acq_rel);
    const auto [block, in_segment_of_its_own] = block_at(address);
    if (block == 0) return;
    std::lock_guard cache_lock(cache.lock.owner());
    try {
      if (cache.ordered_large_count == kOrderedLargeCapacity) {
        const ThreadCache::OrderedLarge& oldest = cache.ordered_large[0];
        quarantine_block(oldest.address, oldest.bytes, epochs.tag(), oldest.dedicated);
        cache.remove_ordered_large(0);
      }
    } catch (...) {
      // No room to defer the oldest: it is still the thread's; this one waits for its epoch instead.
      quarantine_or_reuse({address, block, epochs.tag(), in_segment_of_its_own});
      return;
    }
    cache.push_ordered_large({address, block, in_segment_of_its_own});
  }

  // Makes the legacy stream wait for the work queued so far on `stream`, so
  // that the next epoch's event covers it; failing that, waits for it here.
  void order_after(cuda::CUstream stream) noexcept {
    std::lock_guard lock(mutex);  // one event: record and wait together
    try {
      ScopedContext scope(*context);
      if (!ordering_event) CUEMM_CU(cuEventCreate, &ordering_event, cuda::CU_EVENT_DISABLE_TIMING);
      CUEMM_CU(cuEventRecord, ordering_event, stream);
      CUEMM_CU(cuStreamWaitEvent, cuda::CU_STREAM_LEGACY, ordering_event, 0);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pool: cannot order a free on stream %p (%s); synchronising instead\n",
                   static_cast<void*>(stream), error.what());
      if (CUEMM_CU_RESULT(cuStreamSynchronize, stream) != cuda::CUDA_SUCCESS) CUEMM_CU_RESULT(cuCtxSynchronize);
    }
  }

  bool caches_enabled() const noexcept { return options.thread_cache_size > 0; }

  // Calls visit(cache) for every thread's cache but `own`'s (null: every
  // one), each under its visitor lock; the caller holds `mutex`.
  template <class Visit>
  void for_each_other_cache(const ThreadCache* own, Visit visit) {
    for (auto& cache : caches) {
      if (cache.get() == own) continue;
      std::lock_guard cache_lock(cache->lock.visitor());
      visit(*cache);
    }
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
  void retire() noexcept {
    std::lock_guard lock(mutex);
    retired = true;
    for (auto& cache : caches) {
      std::lock_guard cache_lock(cache->lock.visitor());
      for (auto& bin : cache->bins) bin.count = bin.head = bin.frees_since_advance = 0;
      for (auto& bin : cache->ordered) bin.count = 0;
      cache->ordered_large_count = 0;
      cache->forget_held_large();
      cache->bytes = 0;
      cache->large_bytes = 0;
    }
    epochs.retire();
    if (!context) return;  // the version-probe instance never touched the driver
    try {
      ScopedContext scope(*context);
      CUEMM_CU_RESULT(cuCtxSynchronize);  // blocks in use may still be read by queued work
      if (ordering_event) CUEMM_CU_RESULT(cuEventDestroy, std::exchange(ordering_event, nullptr));
      for (const auto& region : blocks.take_all_regions())
        if (!arena) CUEMM_CU_RESULT(cuMemFree, region.base);
      if (arena) arena->release();
      for (const auto& region : recurring.take_all_regions()) CUEMM_CU_RESULT(cuMemFree, region.base);
      for (const auto& region : small_blocks.take_all_regions())
        if (!carved_small_segments.count(region.base)) CUEMM_CU_RESULT(cuMemFree, region.base);
      free_segments(dedicated.take_all());
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pool: returning memory failed: %s\n", error.what());
    }
    quarantine.clear();
    quarantine_may_hold.store(false, std::memory_order_relaxed);
    quarantined_bytes = quarantined_segment_bytes = quarantined_segments = 0;
  }
};

ThreadCache* PoolMemoryManager::Core::make_thread_slot() {
  auto made = std::make_unique<ThreadCache>(options.thread_cache_size);
  std::lock_guard lock(mutex);
  caches.push_back(std::move(made));
  return caches.back().get();
}

void PoolMemoryManager::Core::forget_cache(ThreadCache* cache) noexcept {
  std::lock_guard lock(mutex);
  auto it = std::find_if(caches.begin(), caches.end(), [&](const auto& owned) { return owned.get() == cache; });
  if (it == caches.end()) return;
  if (!retired) {
    try {
      quarantine_cached_blocks(*cache);
    } catch (...) {
      std::fprintf(stderr, "cuemm pool: could not return a finished thread's cached blocks\n");
    }
  }
  caches.erase(it);
}

PoolMemoryManager::PoolMemoryManager(Context* context, PoolOptions options)
    : HostOnlyMemoryManager(context), options_(options), core_(std::make_shared<Core>(context, options)) {
  if (options_.pinned_host_pool) use_pinned_host_pool();
  if (options_.check_frees) free_checker_ = std::make_unique<detail::RawFreeChecker>();
  if (options_.maximum_size && options_.maximum_size < kSegmentGranularity) {
    throw InvalidArgument("pool: the maximum size (" + describe_bytes(options_.maximum_size) +
                          ") is less than one segment (" + describe_bytes(kSegmentGranularity) +
                          "): no allocation could succeed");
  }
  if (options_.maximum_size && options_.initial_size > options_.maximum_size) {
    throw InvalidArgument("pool: the initial size (" + describe_bytes(options_.initial_size) +
                          ") exceeds the maximum size (" + describe_bytes(options_.maximum_size) + ")");
  }
}

PoolMemoryManager::~PoolMemoryManager() {
  core_->retire();
  util::keep_until_exit(core_);  // pointers that outlive the manager still free into it
}

void PoolMemoryManager::on_initialize() {
  // At once, rather than at the first request.
  if (options_.expandable && has_context()) detail::ExpandableArena::require_support(context().device().id());
  if (has_context()) {
    const std::size_t share = context().device().total_memory() / kDeviceFractionOfHeldRotationBudget;
    core_->held_rotation_budget.store(std::min(kLargestHeldRotationBudget, share), std::memory_order_relaxed);
  }
  std::lock_guard lock(core_->mutex);
  if (options_.initial_size && core_->blocks.region_bytes() == 0 && !core_->grow_initially(options_.initial_size)) {
    throw OutOfMemory("PoolMemoryManager::initialize", options_.initial_size, "the initial pool does not fit");
  }
}

void PoolMemoryManager::on_reset() {
  auto retiring = std::exchange(core_, std::make_shared<Core>(has_context() ? &context() : nullptr, options_));
  core_->held_rotation_budget.store(retiring->held_rotation_budget.load());
  retiring->retire();
  util::keep_until_exit(std::move(retiring));
  if (free_checker_) free_checker_->forget_all();
}

CleanupGuard PoolMemoryManager::on_defer_cleanup() {
  {
    std::lock_guard lock(core_->mutex);
    ++core_->defer_depth;
  }
  return CleanupGuard([core = core_] {
    std::lock_guard lock(core->mutex);
    --core->defer_depth;
  });
}

cuda::CUdeviceptr PoolMemoryManager::allocate(std::size_t size) {
  require_allocation_size(size, "PoolMemoryManager::allocate");
  if (free_checker_) [[unlikely]]
    return allocate_recorded(size, nullptr);
  return core_->allocate(size, core_->size_class(size));
}

void PoolMemoryManager::deallocate(cuda::CUdeviceptr pointer, std::size_t size) noexcept {
  if (!pointer || !size) return;
  // A pointer off the block granularity is no block's: cheap enough to check
  // at every free. The rest only with the record (PoolOptions::check_frees).
  if (pointer % kBlockGranularity || free_checker_) [[unlikely]]
    return deallocate_checked(pointer, size, nullptr);
  core_->deallocate(pointer, core_->size_class(size));
}

cuda::CUdeviceptr PoolMemoryManager::allocate_recorded(std::size_t size, const cuda::CUstream* stream) {
  const cuda::CUdeviceptr address = stream ? allocate_unrecorded(size, *stream)
                                           : core_->allocate(size, core_->size_class(size));
  try {
    free_checker_->handed_out(address, size);
  } catch (...) {
    core_->deallocate(address, core_->size_class(size));  // no record, no block: as if it had failed
    throw;
  }
  return address;
}

void PoolMemoryManager::deallocate_checked(cuda::CUdeviceptr pointer, std::size_t size,
                                           const cuda::CUstream* stream) noexcept {
  std::optional<std::string> refused;
  try {
    if (pointer % kBlockGranularity != 0)
      refused = "it is not " + std::to_string(kBlockGranularity) + "-byte aligned, so no block of this pool starts there";
    else if (free_checker_)
      refused = free_checker_->take_back(pointer, size);
  } catch (const std::exception& error) {
    refused = std::string("its check failed: ") + error.what();
  }
  if (refused) {
    rejected_frees_.fetch_add(1, std::memory_order_relaxed);
    std::fprintf(stderr, "cuemm: PoolMemoryManager::deallocate(%s, %zu bytes%s) refused: %s; nothing was freed\n",
                 util::hex_address(pointer).c_str(), size, stream ? ", stream" : "", refused->c_str());
    return;
  }
  if (stream)
    deallocate_unchecked(pointer, size, *stream);
  else
    core_->deallocate(pointer, core_->size_class(size));
}

std::shared_ptr<MemoryPointer> PoolMemoryManager::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  Core* core = core_.get();
  const int size_class = core->size_class(size);
  const std::uintptr_t address = with_flush_and_retry([&] { return core->allocate(size, size_class); });
  // The finalizer keeps the size class in the address's low bits (blocks are
  // 256-byte aligned) so that its closure fits std::function's inline storage.
  const std::uintptr_t tagged = address | static_cast<std::uintptr_t>(size_class + 1);
  try {
    return detail::make_recycled<MemoryPointer>(&context(), address, size, nullptr, [core, tagged] {
      core->deallocate(tagged & ~std::uintptr_t{0xff}, static_cast<int>(tagged & 0xff) - 1);
    });
  } catch (...) {
    core->deallocate(address, size_class);
    throw;
  }
}

RawDeviceAllocator::Allocation PoolMemoryManager::allocate_raw(std::size_t size) {
  require_allocation_size(size, "memalloc");
  Core* core = core_.get();
  const int size_class = core->size_class(size);
  const std::uintptr_t address = with_flush_and_retry([&] { return core->allocate(size, size_class); });
  // The core stays until exit (see ~PoolMemoryManager); once retired it ignores frees.
  const Releaser releaser{[](void* state, std::uintptr_t freed, std::size_t bytes) noexcept {
                            Core* owner = static_cast<Core*>(state);
                            owner->deallocate(freed, owner->size_class(bytes));
                          },
                          core};
  return {address, releaser};
}

cuda::CUdeviceptr PoolMemoryManager::allocate(std::size_t size, cuda::CUstream stream) {
  require_allocation_size(size, "PoolMemoryManager::allocate");
  if (free_checker_) [[unlikely]]
    return allocate_recorded(size, &stream);
  return allocate_unrecorded(size, stream);
}

cuda::CUdeviceptr PoolMemoryManager::allocate_unrecorded(std::size_t size, cuda::CUstream stream) {
  const int size_class = core_->size_class(size);
  // The default streams' work is what the legacy stream's events cover, so a
  // thread may reuse its frees on them at once (Note [Stream-ordered reuse]);
  // a block for any other stream is one that every stream may use.
  return cuda::is_default_stream(stream) ? core_->allocate_ordered(size, size_class) : core_->allocate(size, size_class);
}

void PoolMemoryManager::deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept {
  if (!pointer || !size) return;
  if (pointer % kBlockGranularity || free_checker_) [[unlikely]]
    return deallocate_checked(pointer, size, &stream);
  deallocate_unchecked(pointer, size, stream);
}

void PoolMemoryManager::deallocate_unchecked(cuda::CUdeviceptr pointer, std::size_t size,
                                             cuda::CUstream stream) noexcept {
  const int size_class = core_->size_class(size);
  if (cuda::is_default_stream(stream)) return core_->deallocate_ordered(pointer, size_class);
  core_->order_after(stream);
  core_->deallocate(pointer, size_class);
}

IpcHandle PoolMemoryManager::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  require_device_memory_to_export(memory);
  if (options_.expandable) {
    // The arena's memory has no cuIpcGetMemHandle: the handle names the
    // mappings under the block (Note [Expandable arena]).
    std::lock_guard lock(core_->mutex);
    if (core_->arena && core_->arena->contains(memory->device_pointer())) {
      ScopedContext scope(context());
      std::size_t offset = 0;
      MappedExport exported = core_->arena->share(memory->device_pointer(), memory->size(), offset);
      return IpcHandle(memory, std::move(exported), memory->size(), context().device().identity(), offset);
    }
  }
  // The driver's handle names the whole segment; the block's offset in it
  // travels in the IpcHandle.
  return export_device_memory(context(), memory);
}

MemoryInfo PoolMemoryManager::get_memory_info() {
  MemoryInfo info = driver_memory_info(context());
  std::lock_guard lock(core_->mutex);
  // (The arena's free space counts where its pages are mapped.)
  const std::size_t free_in_index = core_->arena ? core_->arena->mapped_bytes() - core_->blocks.allocated_bytes()
                                                 : core_->blocks.free_bytes();
  info.free += free_in_index + core_->small_blocks.free_bytes() + core_->recurring.free_bytes() + core_->dedicated.spare_bytes() +
               core_->quarantined_bytes + core_->cached_bytes();
  return info;
}

std::size_t PoolMemoryManager::trim() {
  std::lock_guard lock(core_->mutex);
  if (core_->defer_depth > 0) return 0;
  core_->flush_caches();
  core_->seal();
  core_->reclaim(true);
  return core_->release_free_segments();
}

PoolStatistics PoolMemoryManager::statistics() const {
  std::lock_guard lock(core_->mutex);
  PoolStatistics statistics;
  statistics.reserved_bytes = core_->reserved_bytes();
  statistics.quarantined_bytes = core_->quarantined_bytes;
  statistics.cached_bytes = core_->cached_bytes();
  statistics.in_use_bytes = core_->in_use_bytes();
  statistics.segments = core_->segment_count();
  statistics.free_blocks = core_->blocks.free_blocks() + core_->small_blocks.free_blocks() +
                           core_->recurring.free_blocks() + core_->dedicated.spare_count();
  statistics.seals = core_->epochs.seals();
  statistics.driver_allocations = core_->driver_allocations;
  statistics.spares_taken_over = core_->spares_taken_over;
  statistics.driver_frees = core_->driver_frees;
  statistics.rejected_frees = rejected_frees_.load(std::memory_order_relaxed);
  return statistics;
}

}  // namespace cuemm
