// pool/thread_cache.hpp: one thread's cache of the blocks it freed, for
// PoolMemoryManager (whose notes say when blocks come and go; this is the
// bookkeeping).
//
// Each size class has a FIFO ring of blocks freed without a stream, each
// tagged with its epoch (Note [Stream-safe reuse]): the oldest is reused
// first, as the likeliest to be safe. Stream-ordered frees go to a LIFO bin
// per class, reusable at once by the same thread. Blocks beyond the classes
// are held in a ring of their own (Note [Large blocks in the thread caches]),
// and the thread remembers the sizes of the large blocks it has out, so that
// their frees need no lock.
//
// The owning thread takes `lock` on every operation (plain stores, see
// OwnerBiasedLock); other threads take it only to flush the cache.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "cuemm/managers/detail/rent_or_buy.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"
#include "cuemm/managers/detail/size_classes.hpp"
#include "threading/owner_biased_lock.hpp"
#include "util/own_lines.hpp"
#include "util/owned_counter.hpp"

namespace cuemm::detail {

// A class's ring holds at least kMinimumBinCapacity blocks and at most
// kMaximumBinCapacity, within the cache's byte budget.
inline constexpr std::uint32_t kMaximumBinCapacity = 512;
inline constexpr std::uint32_t kMinimumBinCapacity = 4;
// The tag of the default streams' frees (ThreadCache::ordered_stream).
inline constexpr std::uint64_t kDefaultStreams = 0;
// Tags that name no stream (a program stream's tag is its id plus one, and
// same_stream_tag() never gives these): kNoStream for a side stream that
// holds no stream's frees, and for a request without a stream; kOtherStream
// for a request on a stream of the program's whose frees the thread does
// not keep (ThreadCache::requesting_stream).
inline constexpr std::uint64_t kNoStream = ~std::uint64_t{0};
inline constexpr std::uint64_t kOtherStream = kNoStream - 1;
// A kept stream is in turn while it had a request or free among the
// thread's latest 16 on its other kept streams (four streams in turn use
// each every 3-6): its next request would take its blocks.
inline constexpr std::uint32_t kStreamInTurn = 16;
// Large blocks (beyond the size classes) a thread keeps from stream-ordered frees.
inline constexpr std::uint32_t kOrderedLargeCapacity = 4;
// Streams beside the ordered bins' whose frees a thread keeps too, and how
// many blocks each (Note [Same-stream reuse]).
inline constexpr std::uint32_t kSideStreams = 3;
inline constexpr std::uint32_t kSideStreamDepth = 16;
// Large blocks a thread has out whose size it remembers.
inline constexpr std::uint32_t kLentCapacity = 8;
// Large blocks a thread holds from frees without a stream: two of the
// pool's longest rotations.
inline constexpr std::size_t kHeldCapacity = 128;
static_assert(std::has_single_bit(kHeldCapacity), "the held blocks' ring indexes by mask");

// A freed block and the epoch it was freed in (Note [Stream-safe reuse]).
struct Freed {
  std::uintptr_t address;
  std::uint64_t epoch;
};

// One thread's cached blocks (see the top of this file). On cache lines of
// its own: its owner writes `lock` and `bytes` at every pair, and a
// neighbour that another thread writes as often would cost both threads
// about 100 ns a pair (as two threads' pointer objects on one line did,
// docs/pool-measurements.md, "4 threads' memalloc pairs after the
// benchmarks before them").
struct alignas(util::kOwnLines) ThreadCache {
  struct Bin {
    Freed* ring = nullptr;
    std::uint32_t head = 0;  // the oldest entry
    std::uint32_t count = 0;
    std::uint32_t capacity = 0;
    std::uint32_t frees_since_advance = 0;
    std::uint64_t last_free = 0;  // the cache's free_serial at its latest free
    // Who takes the class's blocks (Note [Classes a thread frees for
    // others]): its own thread once it has asked for the class past its ring
    // (for good), or others, after another thread took this ring's blocks
    // back before that: then its frees of the class go to the pool.
    enum class Taker : std::uint8_t { unknown, own_thread, others };
    Taker taker = Taker::unknown;

    Freed& at(std::uint32_t i) noexcept { return ring[(head + i) & (capacity - 1)]; }  // capacity: a power of two
  };

  // Blocks freed in stream order on the stream that `ordered_stream` names
  // (Note [Stream-ordered reuse]); reused at once by this thread, newest first.
  struct OrderedBin {
    std::uintptr_t* slots = nullptr;
    std::uint32_t count = 0;
    std::uint32_t capacity = 0;
    std::uint64_t last_free = 0;
  };
  struct OrderedLarge {
    std::uintptr_t address;
    std::size_t bytes;
    bool dedicated;  // a segment of its own
  };

  // Taken by the owning thread on every operation (plain stores), by other
  // threads only to flush the cache (see OwnerBiasedLock).
  OwnerBiasedLock lock;
  std::atomic<std::size_t> bytes{0};  // written by the owner under `lock`; rings and ordered bins
  std::atomic<std::size_t> large_bytes{0};  // in `ordered_large`, under `lock`
  std::uint32_t frees_since_advance = 0;  // of all classes
  std::uint64_t free_serial = 0;          // counts its frees into rings and ordered bins
  std::size_t budget;
  std::array<OrderedLarge, kOrderedLargeCapacity> ordered_large;  // oldest first
  std::uint32_t ordered_large_count = 0;
  // Whose frees `ordered` and `ordered_large` hold (Note [Same-stream
  // reuse]): kDefaultStreams, or one stream's tag, and its handle (0 for the
  // default streams; only this thread writes both); the blocks there, and
  // the frees on other streams since this thread last used that one's.
  std::uint64_t ordered_stream = kDefaultStreams;
  std::uintptr_t ordered_handle = 0;
  std::uint32_t ordered_count = 0;
  std::uint32_t ordered_misses = 0;
  // Streams beside `ordered_stream` whose frees this thread keeps (Note
  // [Same-stream reuse]): each its tag (kDefaultStreams for the default
  // streams; kNoStream: the slot is free) and handle, the
  // side_serial of its latest request or free here, and its blocks, oldest
  // first: a class's (in `bytes`) or, with size_class -1, a large one (in
  // `large_bytes`).
  struct SideBlock {
    std::uintptr_t address;
    std::size_t bytes;
    int size_class;
    bool dedicated;
  };
  struct SideStream {
    std::uint64_t stream = kNoStream;
    std::uintptr_t handle = 0;
    std::uint64_t last_use = 0;
    std::uint32_t count = 0;
    std::array<SideBlock, kSideStreamDepth> blocks;
  };
  std::uint64_t side_serial = 0;  // counts requests and frees on side streams
  // The stream of the stream-ordered request this thread is serving: a tag,
  // kOtherStream, or kNoStream (none, or a request without a stream). Only
  // this thread reads or writes it.
  std::uint64_t requesting_stream = kNoStream;
  // Large blocks this thread freed without a stream, oldest first, each with
  // its epoch (Note [Large blocks in the thread caches]); in `large_bytes` too.
  struct HeldLarge {
    OrderedLarge block;
    std::uint64_t epoch;
  };
  std::uint32_t held_large_head = 0;  // of held_large, below
  std::uint32_t held_large_count = 0;
  std::size_t held_large_bytes = 0;
  // The held blocks that fit the latest size asked about (needed 0: none
  // asked), kept up to date as blocks come and go: a loop asks about one
  // size at every pair, and scanning for it was a third of a 4 MiB pair.
  struct Fitting {
    std::size_t needed = 0;
    bool dedicated = false;
    std::uint32_t count = 0;
    std::size_t bytes = 0;
  };
  mutable Fitting fitting;
  // Its requests' seals for held blocks, which buy one more (only its own thread touches it).
  RentOrBuy held_rental;
  // Requests in a row that took a held block from behind blocks of other sizes (its own thread's).
  std::uint32_t held_skips = 0;
  // The size class of its latest request from the rings (-1: none yet): the
  // pool takes back its other classes' blocks when it would grow.
  int latest_class = -1;
  // Whether its frees go past the rings (Note [Rings set aside]), and its
  // ring misses and its free_serial since the current window began.
  bool rings_set_aside = false;
  std::uint32_t window_misses = 0;
  std::uint64_t window_start = 0;
  // A ring miss of `size_class`, under `lock`: sets the rings aside after
  // `window` misses that found the class's ring empty while others held
  // blocks (a loop's ring waiting for its seal is not such a miss), with
  // fewer than `frees_per_miss` frees into the rings each; takes them back
  // after `aside_for` misses of any kind. Whether it set them aside now.
  bool count_ring_miss(int size_class, std::uint32_t window, std::uint32_t frees_per_miss,
                       std::uint32_t aside_for) noexcept {
    if (!rings_set_aside && (bins[size_class].count || !bytes.load(std::memory_order_relaxed))) return false;
    ++window_misses;
    if (window_misses < (rings_set_aside ? aside_for : window)) return false;
    rings_set_aside = !rings_set_aside && free_serial - window_start < std::uint64_t{frees_per_miss} * window;
    window_misses = 0;
    window_start = free_serial;
    return rings_set_aside;
  }
  // Its requests that found a held block since the latest that found none,
  // up to kHeldHitsOfALoop (its own thread's).
  std::uint32_t held_hits_since_miss = 0;
  // A loop of requests for segments of their own, each after a free of the
  // size (its own thread's): the segment size of its latest such request,
  // how many in a row (up to kHitsOfALoop), and whether a block of that size
  // was freed since. Such a loop gets segments to rotate through even at the
  // pool's peak (allocate_dedicated()); many blocks of a size taken in a row
  // and kept (a model's gradients) are no loop.
  std::size_t latest_segment = 0;
  std::uint32_t segment_loop_length = 0;
  bool freed_latest_segment = false;
  void count_segment_request(std::size_t segment, std::uint32_t enough) noexcept {
    if (segment != latest_segment || !freed_latest_segment) {
      latest_segment = segment;
      segment_loop_length = 1;
    } else if (segment_loop_length < enough) {
      ++segment_loop_length;
    }
    freed_latest_segment = false;
  }
  void count_large_free(std::size_t segment) noexcept {
    if (segment == latest_segment) freed_latest_segment = true;
  }
  // Its requests that reached the index (a ring with no safe block, or a
  // size beyond the classes) for the same bytes in a row, up to `enough`: a
  // loop, which the pool may grow for once its seals have cost about as
  // much (allocate_from_index()); requests of sizes that vary are no loop.
  std::size_t latest_index_request = 0;
  std::uint32_t index_loop_length = 0;
  bool count_index_request(std::size_t bytes, std::uint32_t enough) noexcept {
    if (bytes != latest_index_request) {
      latest_index_request = bytes;
      index_loop_length = 1;
    } else if (index_loop_length < enough) {
      ++index_loop_length;
    }
    return index_loop_length >= enough;
  }
  // The large blocks this thread took, so that their free needs no lock to
  // learn their size. An entry is
  // trusted only if no large block was freed another way since it was made
  // (`generation`): a block freed elsewhere may have been merged or split.
  struct Lent {
    OrderedLarge block;
    std::uint64_t generation;
  };
  std::array<Lent, kLentCapacity> lent{};
  std::uint32_t next_lent = 0;  // the slot to overwrite next

  // The arrays last, so that the fields above, which pairs of every size
  // touch, share a few cache lines whatever the number of classes. (Sixteen
  // classes a doubling rather than eight moved them 3 KiB further on: on the
  // H100, alternated seven times with the build before, one thread's raw
  // pairs at 256 B / 64 KiB / 1 MiB / 64 MiB read 1.13 / 1.08 / 1.07 / 1.10
  // of its times; with the arrays last, 1.00 / 1.06 / 1.06 / 1.02.)
  std::array<Bin, kSizeClassCount> bins;
  std::unique_ptr<Freed[]> storage;
  std::array<OrderedBin, kSizeClassCount> ordered;
  std::unique_ptr<std::uintptr_t[]> ordered_storage;
  // A ring: a loop reuses its oldest block at every request.
  std::array<HeldLarge, kHeldCapacity> held_large;
  std::array<SideStream, kSideStreams> side;

  // The side stream with tag `stream`, or null.
  SideStream* side_stream(std::uint64_t stream) noexcept {
    for (auto& slot : side)
      if (slot.stream == stream && stream != kNoStream) return &slot;
    return nullptr;
  }
  // Whether a side stream has this handle (its tag then says whether it is the same stream).
  bool has_side_handle(std::uintptr_t handle) const noexcept {
    for (const auto& slot : side)
      if (slot.stream != kNoStream && slot.handle == handle) return true;
    return false;
  }
  // Marks a request or free on a side stream.
  void used(SideStream& slot) noexcept { slot.last_use = ++side_serial; }
  // Whether the bins' stream, or a side stream, is in turn (kStreamInTurn).
  bool bins_in_turn() const noexcept { return ordered_misses < kStreamInTurn; }
  bool in_turn(const SideStream& slot) const noexcept { return side_serial - slot.last_use < kStreamInTurn; }
  // Whether the blocks kept for `stream` go back before the pool grows past
  // its peak for the request being served (give_back_ordered_blocks()):
  // for a request without a stream, all; otherwise the requesting stream's
  // own (they did not fit it) and those of streams out of turn. (Giving
  // back the blocks of streams in turn made four streams in turn of 4 MiB
  // blocks, from a new pool, seal at every pair: each request, finding its
  // block given back by the request before, gave back the next stream's.)
  bool gives_back(std::uint64_t stream, bool stream_in_turn) const noexcept {
    return requesting_stream == kNoStream || requesting_stream == stream || !stream_in_turn;
  }
  // Its newest block of `size_class`, or (size_class -1) the newest large
  // one of the kind that fits `needed` (as take_ordered_large()); or nullopt.
  std::optional<SideBlock> take_side(SideStream& slot, int size_class, std::size_t needed, bool dedicated) noexcept {
    for (std::uint32_t i = slot.count; i-- > 0;) {
      const SideBlock& block = slot.blocks[i];
      const bool serves = size_class >= 0 ? block.size_class == size_class
                                          : block.size_class < 0 &&
                                                fits({block.address, block.bytes, block.dedicated}, needed, dedicated);
      if (serves) return remove_side(slot, i);
    }
    return std::nullopt;
  }
  // The caller checks that there is room.
  void push_side(SideStream& slot, const SideBlock& block) noexcept {
    slot.blocks[slot.count++] = block;
    if (block.size_class >= 0)
      add_bytes(block.bytes);
    else
      util::add_own(large_bytes, block.bytes);
  }
  SideBlock remove_side(SideStream& slot, std::uint32_t i) noexcept {
    const SideBlock removed = slot.blocks[i];
    std::copy(slot.blocks.begin() + i + 1, slot.blocks.begin() + slot.count, slot.blocks.begin() + i);
    --slot.count;
    if (removed.size_class >= 0)
      remove_bytes(removed.bytes);
    else
      util::subtract_own(large_bytes, removed.bytes);
    return removed;
  }

  void lend(const OrderedLarge& block, std::uint64_t generation) noexcept {
    lent[next_lent] = {block, generation};
    next_lent = (next_lent + 1) % kLentCapacity;
  }
  // The lent block at `address`, forgotten; nullopt if unknown or stale.
  // Newest first: a loop frees the block it took last.
  std::optional<OrderedLarge> take_lent(std::uintptr_t address, std::uint64_t generation) noexcept {
    for (std::uint32_t back = 1; back <= kLentCapacity; ++back) {
      Lent& entry = lent[(next_lent + kLentCapacity - back) % kLentCapacity];
      if (entry.block.address != address) continue;
      entry.block.address = 0;  // forgotten (the block is returned by value below)
      if (entry.generation != generation) return std::nullopt;
      return OrderedLarge{address, entry.block.bytes, entry.block.dedicated};
    }
    return std::nullopt;
  }

  explicit ThreadCache(std::size_t budget_) : budget(budget_) {
    std::size_t total = 0;
    for (int c = 0; c < kSizeClassCount; ++c) {
      // The whole budget may go to one class (the byte count still caps the
      // sum): a class's ring holds two sealing batches.
      const std::size_t fit = budget / size_class_bytes(c);
      bins[c].capacity = std::bit_floor(static_cast<std::uint32_t>(
          std::clamp<std::size_t>(fit, kMinimumBinCapacity, kMaximumBinCapacity)));
      total += bins[c].capacity;
    }
    // Not zeroed: slots are read only below a bin's count, and pages no ring
    // has reached stay untouched (16 threads of 256-byte pairs: 12-20 MB
    // resident with zeroed rings, 6 without).
    storage = std::make_unique_for_overwrite<Freed[]>(total);
    Freed* next = storage.get();
    for (auto& bin : bins) {
      bin.ring = next;
      next += bin.capacity;
    }
    // A stream-ordered free is reused by the thread's next request: a
    // quarter of a ring is enough depth.
    std::size_t ordered_total = 0;
    for (int c = 0; c < kSizeClassCount; ++c) {
      ordered[c].capacity = std::max(bins[c].capacity / 4, kMinimumBinCapacity);
      ordered_total += ordered[c].capacity;
    }
    ordered_storage = std::make_unique_for_overwrite<std::uintptr_t[]>(ordered_total);
    std::uintptr_t* slot = ordered_storage.get();
    for (auto& bin : ordered) {
      bin.slots = slot;
      slot += bin.capacity;
    }
  }

  void add_bytes(std::size_t n) noexcept { util::add_own(bytes, n); }
  void remove_bytes(std::size_t n) noexcept { util::subtract_own(bytes, n); }

  // A free into its class's ring, or stream-ordered bin; the caller checked
  // that there is room.
  void push_to_ring(int size_class, std::uintptr_t address, std::uint64_t epoch) noexcept {
    Bin& bin = bins[size_class];
    bin.at(bin.count) = {address, epoch};
    bin.last_free = ++free_serial;
    ++bin.count;
    ++bin.frees_since_advance;
    ++frees_since_advance;
    add_bytes(size_class_bytes(size_class));
  }
  void push_ordered(int size_class, std::uintptr_t address) noexcept {
    OrderedBin& bin = ordered[size_class];
    bin.last_free = ++free_serial;
    bin.slots[bin.count++] = address;
    ++ordered_count;
    add_bytes(size_class_bytes(size_class));
  }

  // Removes the oldest `count` stream-ordered blocks of a class into `out`,
  // tagged with `epoch`.
  std::size_t take_oldest_ordered(int size_class, std::uint32_t count, std::uint64_t epoch, Freed* out) noexcept {
    OrderedBin& bin = ordered[size_class];
    count = std::min(count, bin.count);
    for (std::uint32_t i = 0; i < count; ++i) out[i] = {bin.slots[i], epoch};
    std::copy(bin.slots + count, bin.slots + bin.count, bin.slots);
    bin.count -= count;
    ordered_count -= count;
    remove_bytes(count * size_class_bytes(size_class));
    return count;
  }

  // Whether `block` serves a request of `needed` bytes of the kind, wasting at most 1/8.
  static bool fits(const OrderedLarge& block, std::size_t needed, bool dedicated) noexcept {
    return block.dedicated == dedicated && block.bytes >= needed && block.bytes <= needed + needed / 8;
  }

  // The newest stream-ordered large block of the same kind that holds
  // `needed` bytes and wastes at most 1/8 of them, removed; or nullopt.
  std::optional<OrderedLarge> take_ordered_large(std::size_t needed, bool dedicated) noexcept {
    for (std::uint32_t i = ordered_large_count; i-- > 0;)
      if (fits(ordered_large[i], needed, dedicated)) return remove_ordered_large(i);
    return std::nullopt;
  }

  // The caller checks that there is room.
  void push_ordered_large(const OrderedLarge& block) noexcept {
    ordered_large[ordered_large_count++] = block;
    ++ordered_count;
    util::add_own(large_bytes, block.bytes);
  }

  OrderedLarge remove_ordered_large(std::uint32_t i) noexcept {
    const OrderedLarge removed = ordered_large[i];
    std::copy(ordered_large.begin() + i + 1, ordered_large.begin() + ordered_large_count, ordered_large.begin() + i);
    --ordered_large_count;
    --ordered_count;
    util::subtract_own(large_bytes, removed.bytes);
    return removed;
  }

  // The i-th oldest held block.
  HeldLarge& held(std::uint32_t i) noexcept { return held_large[(held_large_head + i) & (kHeldCapacity - 1)]; }
  const HeldLarge& held(std::uint32_t i) const noexcept {
    return held_large[(held_large_head + i) & (kHeldCapacity - 1)];
  }
  // The oldest held block that fits; -1 if none.
  int find_held_large(std::size_t needed, bool dedicated) const noexcept {
    for (std::uint32_t i = 0; i < held_large_count; ++i)
      if (fits(held(i).block, needed, dedicated)) return static_cast<int>(i);
    return -1;
  }
  // How many held blocks fit, and their bytes.
  const Fitting& fitting_for(std::size_t needed, bool dedicated) const noexcept {
    if (fitting.needed != needed || fitting.dedicated != dedicated) {
      fitting = {needed, dedicated, 0, 0};
      for (std::uint32_t i = 0; i < held_large_count; ++i) count_if_fitting(held(i).block, true);
    }
    return fitting;
  }
  std::uint32_t count_held_large(std::size_t needed, bool dedicated) const noexcept {
    return fitting_for(needed, dedicated).count;
  }
  std::size_t bytes_held_large(std::size_t needed, bool dedicated) const noexcept {
    return fitting_for(needed, dedicated).bytes;
  }
  void count_if_fitting(const OrderedLarge& block, bool added) const noexcept {
    if (!fitting.needed || !fits(block, fitting.needed, fitting.dedicated)) return;
    if (added) {
      ++fitting.count;
      fitting.bytes += block.bytes;
    } else {
      --fitting.count;
      fitting.bytes -= block.bytes;
    }
  }

  // Its bytes in rings and ordered bins other than those of `size`'s class
  // (a loop's own ring holds the blocks it is waiting for).
  std::size_t bytes_in_other_classes(std::size_t size) noexcept {
    std::lock_guard cache_lock(lock.owner());
    const std::size_t all = bytes.load(std::memory_order_relaxed);
    const int size_class = size_class_of(size);
    if (size_class < 0) return all;
    return all - (bins[size_class].count + ordered[size_class].count) * size_class_bytes(size_class);
  }
  // The bytes its ring of `size`'s class holds (0 beyond the classes): what a
  // loop's purchase may double (Note [Small blocks apart]).
  std::size_t bytes_in_ring(std::size_t size) noexcept {
    const int size_class = size_class_of(size);
    if (size_class < 0) return 0;
    std::lock_guard cache_lock(lock.owner());
    return std::size_t{bins[size_class].count} * size_class_bytes(size_class);
  }

  // The caller checks that there is room.
  void push_held_large(const OrderedLarge& block, std::uint64_t epoch) noexcept {
    held(held_large_count++) = {block, epoch};
    held_large_bytes += block.bytes;
    count_if_fitting(block, true);
    util::add_own(large_bytes, block.bytes);
  }

  HeldLarge remove_held_large(std::uint32_t i) noexcept {
    const HeldLarge removed = held(i);
    if (i == 0) {
      held_large_head = (held_large_head + 1) & (kHeldCapacity - 1);
    } else {
      for (std::uint32_t j = i; j + 1 < held_large_count; ++j) held(j) = held(j + 1);
    }
    --held_large_count;
    held_large_bytes -= removed.block.bytes;
    count_if_fitting(removed.block, false);
    util::subtract_own(large_bytes, removed.block.bytes);
    return removed;
  }
  void forget_held_large() noexcept {
    held_large_head = held_large_count = 0;
    held_large_bytes = 0;
    fitting = {};
  }

  // Over its budget a thread spills the ring or stream-ordered bin of
  // another class that it freed into longest ago (up to half a ring's
  // capacity of blocks at once): a thread that has moved on from one size
  // would otherwise spill every free of the next (measured: 256 B pairs
  // after 1 MiB ones, 101 -> 13 ns here), and spilling the fullest instead
  // halved the ring in use whenever it was the fullest (1 MiB pairs after
  // 64 KiB ones at 1-16 threads: 69-74 -> 53-55 ns here). Only when no
  // other class holds blocks does the freeing class spill its older half.
  // A scan of the classes, not of blocks, and only when spilling. Returns
  // the blocks' class; ring blocks keep their epochs, stream-ordered ones
  // get `epoch`.
  int spill_stalest(int freeing_class, std::uint64_t epoch, Freed* out, std::size_t& count) noexcept {
    int stalest = -1;
    bool in_ordered = false;
    std::uint64_t oldest = ~std::uint64_t{0};
    for (int c = 0; c < kSizeClassCount; ++c) {
      if (c == freeing_class) continue;
      if (bins[c].count && bins[c].last_free < oldest) {
        oldest = bins[c].last_free;
        stalest = c;
        in_ordered = false;
      }
      if (ordered[c].count && ordered[c].last_free < oldest) {
        oldest = ordered[c].last_free;
        stalest = c;
        in_ordered = true;
      }
    }
    const bool own = stalest < 0;
    if (own) {
      stalest = freeing_class;
      in_ordered = bins[stalest].count == 0;
    }
    const std::uint32_t held = in_ordered ? ordered[stalest].count : bins[stalest].count;
    const std::uint32_t taken =
        std::min(held, own ? std::max<std::uint32_t>(held / 2, 1) : kMaximumBinCapacity / 2);
    count = in_ordered ? take_oldest_ordered(stalest, taken, epoch, out) : take_oldest(stalest, taken, out);
    return stalest;
  }

  // The oldest block of a class, removed, if its epoch is safe; else 0.
  std::uintptr_t take_oldest_if_safe(int size_class, const ReuseEpochs& epochs) noexcept {
    Bin& bin = bins[size_class];
    if (!bin.count || !epochs.is_safe(bin.at(0).epoch)) return 0;
    const std::uintptr_t address = bin.at(0).address;
    bin.head = (bin.head + 1) & (bin.capacity - 1);
    --bin.count;
    remove_bytes(size_class_bytes(size_class));
    return address;
  }

  // The newest block of a class's ordered bin, or 0 when it has none.
  std::uintptr_t take_ordered(int size_class) noexcept {
    OrderedBin& bin = ordered[size_class];
    if (!bin.count) return 0;
    remove_bytes(size_class_bytes(size_class));
    --ordered_count;
    return bin.slots[--bin.count];
  }

  // Removes the oldest `count` entries of a class into `out`.
  std::size_t take_oldest(int size_class, std::uint32_t count, Freed* out) noexcept {
    Bin& bin = bins[size_class];
    count = std::min(count, bin.count);
    for (std::uint32_t i = 0; i < count; ++i) out[i] = bin.at(i);
    bin.head = (bin.head + count) & (bin.capacity - 1);
    bin.count -= count;
    remove_bytes(count * size_class_bytes(size_class));
    return count;
  }
};

}  // namespace cuemm::detail
