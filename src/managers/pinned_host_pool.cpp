#include "cuemm/managers/pinned_host_pool.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/managers/detail/rent_or_buy.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "driver/mapped_host_memory.hpp"
#include "threading/owner_biased_lock.hpp"
#include "util/owned_counter.hpp"
#include "util/round_up.hpp"
#include "util/thread_slots.hpp"

namespace cuemm {
namespace {

constexpr std::size_t kSmallestHostBlock = 4096;
// From this size a block is worth waiting for rather than allocating anew.
constexpr std::size_t kWaitForBlocksFrom = std::size_t{1} << 20;
// A list of released blocks of one kind and size rotates through up to this
// many blocks (at least 4) within kRotationBytes, so a loop of same-size
// requests pays one stream query a rotation, not one a request. A list of
// small blocks takes new ones at once up to kEagerRotation (sealing after
// that many frees), and beyond, up to kSmallRotation, only as its seals pay
// for them, as large ones do: a program that cycles through 20 buffers
// reuses them from its second round, while a long loop of 4 KiB pairs
// seals once per 64 rather than once per 16.
constexpr std::size_t kEagerRotation = 16;
constexpr std::size_t kSmallRotation = 64;
constexpr std::size_t kLargeRotation = 16;
constexpr std::size_t kLongestRotation = std::max(kSmallRotation, kLargeRotation);
constexpr std::size_t kRotationBytes = std::size_t{32} << 20;
// A list of large blocks (kWaitForBlocksFrom) may rotate through up to this
// many bytes, as its seals buy them (seals_worth_a_host_block): 64 MiB pairs
// otherwise paid a seal every 4 (212-229 ns a pair on the H100).
constexpr std::size_t kLargeRotationBytes = std::size_t{512} << 20;
// A seal (an event recorded for the context and queried) costs 0.5-0.6 us on
// the H100, cuMemHostAlloc with its cuMemFreeHost 0.7-1.2 ms up to 1 MiB and
// 28-49 ms at 64 MiB: a list of large blocks grows by one only once its
// seals have cost about as much as the new block (short loops wait instead).
// A 64 MiB loop's 8 blocks then pay 100-220 ns a pair, a seal every 8
// (docs/pool-measurements.md).
constexpr std::size_t seals_worth_a_host_block(std::size_t bytes) { return 300 + 1500 * (bytes >> 20); }
// cuMemHostAlloc of a small block takes about 100 us: polling for a while first pays.
constexpr std::chrono::microseconds kPollBeforeAllocating{50};
// Blocks that go round stay cached past maximum_cached_bytes until idle, up
// to this many times it (see evict_over_maximum()): a hand-over of 64 MiB
// blocks, 16 at a time, holds 3.6 GiB.
constexpr std::size_t kMostCachedOverMaximum = 4;
// Kinds and sizes a thread's front keeps (Note [Per-thread fronts]).
constexpr std::size_t kFrontLists = 4;

// A quarter power of two, at least 4 KiB: at most 25% over the request.
std::size_t host_block_size(std::size_t size) {
  if (size <= kSmallestHostBlock) return kSmallestHostBlock;
  const std::size_t power = std::size_t{1} << (std::bit_width(size - 1) - 1);
  const std::size_t step = power / 4;
  return util::round_up(size, step);
}

// The pointer handed out for page-locked host memory: MappedMemory when it is
// mapped (device address known), else PinnedMemory.
// (The release callable becomes the finalizer in place: MemoryPointer's constructors.)
template <detail::InPlaceFinalizer Release>
std::shared_ptr<MemoryPointer> host_memory_pointer(Context* context, void* host, cuda::CUdeviceptr device,
                                                   std::size_t size, std::shared_ptr<const void> owner,
                                                   Release&& release) {
  // Made at allocation rate: through the recycling allocator, as the device pool's are.
  if (device)
    return detail::make_recycled<MappedMemory>(context, host, device, size, std::move(owner),
                                               std::forward<Release>(release));
  return detail::make_recycled<PinnedMemory>(context, host, size, std::move(owner), std::forward<Release>(release));
}

}  // namespace

// Note [Per-thread fronts]
// Each thread keeps the blocks it releases in a front of its own, up to a
// rotation (see the header) for each of four kinds and sizes, and takes them
// back without the pool's lock: the lock's two round trips per pair were a
// third of a cached pair. A front's blocks stay on the handed-out list; the
// pool's lock is taken only to move blocks between a front and the shared
// lists: a release that finds its front's list full (its older half goes)
// or all four lists taken (the least recently used one goes), a request
// that finds its front's list empty (the shared lists refill it with up to
// half a rotation of safe blocks), and a thread that ends. So a thread that
// allocates what another releases takes the lock once a batch, on either
// side (a pinned block handed over: 0.8 -> 0.2 us at 4 KiB, H200). trim(),
// release_everything() and the destructor take every front's blocks
// (through each front's owner-biased lock, which costs its owner nothing).
struct PinnedHostPool::State : std::enable_shared_from_this<PinnedHostPool::State> {
  struct Block;
  struct Freed {
    Block* block;
    std::uint64_t epoch;
  };
  // One thread's released blocks (Note [Per-thread fronts]).
  struct Front {
    struct List {
      unsigned flags = 0;
      std::size_t bytes = 0;  // 0: unused
      std::size_t rotation = 0;  // rotation_length(bytes), kept: every release asks, and it divides
      std::array<Freed, kLongestRotation> ring;  // released blocks, oldest at `head` (read below `count` only)
      std::uint32_t head = 0;
      std::uint32_t count = 0;
      std::size_t frees_since_seal = 0;
      detail::RentOrBuy rental;  // when the rotation grows beyond kEagerRotation
      std::uint64_t last_used = 0;

      const Freed& oldest() const noexcept { return ring[head]; }
      void push(Freed freed) noexcept { ring[(head + count++) % kLongestRotation] = freed; }
      Freed pop() noexcept {
        const Freed oldest = ring[head];
        head = (head + 1) % kLongestRotation;
        --count;
        return oldest;
      }
    };
    OwnerBiasedLock lock;  // the lists; the owner thread's side is nearly free
    std::array<List, kFrontLists> lists;
    std::uint64_t uses = 0;
    // Written by the owner (under `lock`), read by statistics() without it.
    std::atomic<std::size_t> bytes{0};
    std::atomic<std::size_t> hits{0};
    std::size_t claimed = 0;  // of the pool's maximum_cached_bytes (see claim())

    List* find(unsigned flags, std::size_t block_bytes) noexcept {
      for (List& list : lists)
        if (list.bytes == block_bytes && list.flags == flags) return &list;
      return nullptr;
    }
  };
  struct Block {
    std::shared_ptr<State> state;  // the pool outlives its blocks
    void* host;
    cuda::CUdeviceptr device;  // 0 unless mapped
    std::size_t bytes;
    unsigned flags;
    bool dead = false;  // freed by release_everything() while handed out
    std::deque<Freed>* list = nullptr;  // its kind and size's, once released
    std::chrono::steady_clock::time_point released_at{};  // into a shared list, the latest time
    Block* previous_out = nullptr;  // links of the handed-out list
    Block* next_out = nullptr;
  };
  struct Registration {
    std::shared_ptr<State> state;
    std::shared_ptr<const void> owner;  // kept alive while the range stays registered
    void* pointer;
    std::size_t size;
    bool mapped;
    cuda::CUdeviceptr device;
    std::list<Registration*>::iterator in_cache;  // valid while cached
    bool dead = false;
  };
  using RegistrationKey = std::tuple<std::uintptr_t, std::size_t, bool>;

  Context* context;
  PinnedHostPoolOptions options;
  BlockingAwareMutex mutex;
  detail::ReuseEpochs epochs;
  // Per (flags, block size). Lists stay once made (there are few), so a
  // block can keep a pointer to its own: no lookup to release it.
  std::map<std::pair<unsigned, std::size_t>, std::deque<Freed>> free_lists;
  std::pair<unsigned, std::size_t> last_key{};  // the last list a request found, to skip the map
  std::deque<Freed>* last_list = nullptr;
  std::size_t frees_since_seal = 0;
  // The shared lists' seals, which buy one more block (small and large apart).
  detail::RentOrBuy small_block_rental, large_block_rental;
  std::list<Registration*> cached_registrations;  // most recently released first
  std::map<RegistrationKey, Registration*> registration_index;  // cached ones only
  std::size_t registration_bytes = 0;
  PinnedHostPoolStatistics counters;
  Block* handed_out = nullptr;  // a list through the blocks: no allocation per request
  std::set<Registration*> pinned_out;
  // The pool is gone, or everything was released: released memory is freed
  // at once. Set under `mutex`; fronts read it under their own lock.
  std::atomic<bool> closed{false};
  std::vector<std::unique_ptr<Front>> fronts;  // of living threads
  // What the fronts have claimed of maximum_cached_bytes: the most each has
  // held, until it is emptied; the shared lists keep at most the rest.
  std::atomic<std::size_t> front_claims{0};
  const std::uint64_t thread_slots_id_ = util::next_thread_slots_id();

  State(Context& context_, PinnedHostPoolOptions options_)
      : context(&context_), options(options_), epochs(&context_) {}

  static void free_host(Context& context, void* host) noexcept {
    try {
      ScopedContext scope(context);
      CUEMM_CU(cuMemFreeHost, host);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pinned host pool: freeing a block failed: %s\n", error.what());
    }
  }
  static void free_block(Block* block) noexcept { free_host(*block->state->context, block->host); }
  static void unregister_range(Context& context, void* pointer) noexcept {
    try {
      ScopedContext scope(context);
      CUEMM_CU(cuMemHostUnregister, pointer);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pinned host pool: unregistering failed: %s\n", error.what());
    }
  }
  static void unregister(Registration* registration) noexcept {
    unregister_range(*registration->state->context, registration->pointer);
  }

  // Gives the memory of records no pointer names back to the driver, and
  // forgets them. Outside the lock: deleting the last record may destroy the state.
  static void discard(std::span<Registration* const> registrations) noexcept {
    for (Registration* registration : registrations) {
      unregister(registration);
      delete registration;
    }
  }

  // --- under `mutex` ---

  void hand_out(Block* block) noexcept {
    block->previous_out = nullptr;
    block->next_out = handed_out;
    if (handed_out) handed_out->previous_out = block;
    handed_out = block;
  }
  void take_back(Block* block) noexcept {
    (block->previous_out ? block->previous_out->next_out : handed_out) = block->next_out;
    if (block->next_out) block->next_out->previous_out = block->previous_out;
    block->previous_out = block->next_out = nullptr;
  }

  static std::size_t rotation_length(std::size_t bytes) noexcept {
    if (bytes >= kWaitForBlocksFrom) return std::clamp(kLargeRotationBytes / bytes, std::size_t{4}, kLargeRotation);
    return std::clamp(kRotationBytes / bytes, std::size_t{4}, kSmallRotation);
  }

  // Whether the oldest of `held` released blocks of `bytes` (tagged `epoch`)
  // may be handed out, sealing and waiting as the header says; false when a
  // new block should be allocated instead. The rental and the count of frees
  // are those of the list the block is in.
  bool wait_for_oldest(std::size_t held, std::size_t bytes, std::uint64_t epoch, detail::RentOrBuy& rental,
                       std::size_t& frees) {
    if (epochs.is_safe(epoch)) return true;
    const bool large = bytes >= kWaitForBlocksFrom;
    if (held < rotation_length(bytes)) {
      const bool eager = !large && held < kEagerRotation && frees < kEagerRotation;
      if (eager) return false;
      if (rental.buys(seals_worth_a_host_block(bytes))) {
        rental.bought();
        return false;
      }
    }
    epochs.seal_through(epoch);
    frees = 0;
    rental.rent();
    // A sealed epoch on an idle GPU completes within microseconds, far
    // sooner than cuMemHostAlloc returns: poll a little before giving up.
    if (!epochs.poll_until_safe(epoch, kPollBeforeAllocating) && large) epochs.poll(true);
    return epochs.is_safe(epoch);
  }

  // Takes a safe block of a shared list; null when a new block should be
  // allocated. Under `mutex`.
  Block* take_cached(std::deque<Freed>& list, std::size_t bytes) {
    detail::RentOrBuy& rental = bytes >= kWaitForBlocksFrom ? large_block_rental : small_block_rental;
    if (list.empty() || !wait_for_oldest(list.size(), bytes, list.front().epoch, rental, frees_since_seal))
      return nullptr;
    Block* block = list.front().block;
    list.pop_front();
    counters.cached_bytes -= block->bytes;
    return block;
  }

  // --- the fronts (Note [Per-thread fronts]) ---

  // For util::ThreadSlots.
  std::uint64_t thread_slots_id() const noexcept { return thread_slots_id_; }
  // A closed pool (released or gone) keeps nothing in fronts.
  bool thread_slots_retired() const noexcept { return closed.load(std::memory_order_acquire); }
  Front* make_thread_slot() {
    auto made = std::make_unique<Front>();
    std::lock_guard lock(mutex);
    fronts.push_back(std::move(made));
    return fronts.back().get();
  }
  void thread_slot_done(Front* front) noexcept {
    Leftovers leftovers;
    {
      std::lock_guard lock(mutex);
      {
        std::lock_guard front_lock(front->lock.visitor());
        empty_front(*front, leftovers);
      }
      counters.front_hits += front->hits.load(std::memory_order_relaxed);  // (counted on after the thread)
      std::erase_if(fronts, [&](const auto& owned) { return owned.get() == front; });
    }
    leftovers.discard();
  }
  // The calling thread's front; null without memory for a new one (or late in its exit).
  Front* front_of_this_thread() noexcept {
    try {
      return util::ThreadSlots<State, Front>::of_this_thread(*this);
    } catch (...) {
      return nullptr;
    }
  }

  // A block of the kind and size from the calling thread's front, sealing
  // and waiting as the header says; null when the front has none ready.
  // Under the front's lock.
  Block* take_from_front(Front& front, unsigned flags, std::size_t bytes) {
    Front::List* list = front.find(flags, bytes);
    if (!list || !list->count) return nullptr;
    list->last_used = ++front.uses;
    if (!wait_for_oldest(list->count, bytes, list->oldest().epoch, list->rental, list->frees_since_seal))
      return nullptr;
    Block* block = list->pop().block;
    util::subtract_own(front.bytes, bytes);
    util::add_own(front.hits, std::size_t{1});
    return block;
  }
  // Makes an empty front list the one of a kind and size.
  static void open_list(Front::List& list, unsigned flags, std::size_t bytes) noexcept {
    list = Front::List{};
    list.flags = flags;
    list.bytes = bytes;
    list.rotation = rotation_length(bytes);
  }
  // Keeps a released block in the calling thread's front; false when its
  // list is full. A new kind and size takes the least recently used list,
  // whose blocks go to `displaced` (for the shared lists: the caller cannot
  // take `mutex` under the front's lock). Under the front's lock.
  bool keep_in_front(Front& front, Block* block, Front::List& displaced) noexcept {
    Front::List* list = front.find(block->flags, block->bytes);
    if (!list) {
      list = &*std::min_element(front.lists.begin(), front.lists.end(),
                                [](const auto& a, const auto& b) { return a.last_used < b.last_used; });
      util::subtract_own(front.bytes, list->bytes * list->count);
      while (list->count) displaced.push(list->pop());
      open_list(*list, block->flags, block->bytes);
    }
    if (list->count >= list->rotation) {
      // Full: its older half goes to the shared lists in one trip (the
      // caller's), rather than every later release taking the lock, as a
      // thread that frees what another allocates would (Note [Per-thread fronts]).
      const std::uint32_t half = list->count / 2;
      for (std::uint32_t i = 0; i < half; ++i) displaced.push(list->pop());
      util::subtract_own(front.bytes, list->bytes * half);
    }
    if (!claim(front, block->bytes)) return false;
    list->last_used = ++front.uses;
    list->push({block, epochs.tag()});
    ++list->frees_since_seal;
    util::add_own(front.bytes, block->bytes);
    return true;
  }

  // After a shared list served the calling thread, moves up to half a
  // rotation of its blocks that are already safe into the thread's front:
  // a thread that allocates what another releases (a loader thread's
  // staging buffers) then takes the pool's lock once a batch, not at every
  // request. Only into the front's list of that kind and size, or an empty
  // one, and within kRotationBytes: what a front holds counts against
  // maximum_cached_bytes for as long as the thread lives, and a front of
  // 64 MiB blocks would leave the shared lists too little (they evicted,
  // and the loop bought new blocks, simulated). Under `mutex`; takes the
  // front's lock.
  void refill_front(Front& front, std::deque<Freed>& shared, unsigned flags, std::size_t bytes) noexcept {
    const std::size_t limit = std::min(rotation_length(bytes) / 2, kRotationBytes / bytes);
    if (limit == 0 || closed.load(std::memory_order_relaxed) || shared.empty() ||
        !epochs.is_safe(shared.front().epoch))
      return;
    std::lock_guard front_lock(front.lock.owner());
    Front::List* list = front.find(flags, bytes);
    if (!list) {
      for (Front::List& candidate : front.lists)
        if (!candidate.count && (!list || candidate.last_used < list->last_used)) list = &candidate;
      if (!list) return;
      open_list(*list, flags, bytes);
    }
    list->last_used = ++front.uses;
    while (list->count < limit && !shared.empty() && epochs.is_safe(shared.front().epoch) && claim(front, bytes)) {
      const Freed freed = shared.front();
      shared.pop_front();
      counters.cached_bytes -= bytes;
      hand_out(freed.block);  // (a front's blocks stay on the handed-out list)
      list->push(freed);
      util::add_own(front.bytes, bytes);
    }
  }

  // Makes room in the front for `bytes` more within maximum_cached_bytes;
  // false when the pool has none. Claims only past the front's highest
  // level so far: a loop in steady state claims nothing.
  bool claim(Front& front, std::size_t bytes) noexcept {
    const std::size_t needed = front.bytes.load(std::memory_order_relaxed) + bytes;
    if (needed <= front.claimed) return true;
    const std::size_t more = needed - front.claimed;
    std::size_t claims = front_claims.load(std::memory_order_relaxed);
    do {
      if (claims + more > options.maximum_cached_bytes) return false;
    } while (!front_claims.compare_exchange_weak(claims, claims + more, std::memory_order_relaxed));
    front.claimed += more;
    return true;
  }

  // --- under `mutex` ---

  // Blocks on their way out, chained through `next_out` (they are off the
  // handed-out list): no allocation on the release path. Discarded outside
  // the lock, as deleting the last record may destroy the state.
  struct Leftovers {
    Block* blocks = nullptr;   // memory and record to free
    Block* records = nullptr;  // records whose memory release_everything() freed
    void add(Block*& chain, Block* block) noexcept {
      block->next_out = chain;
      chain = block;
    }
    void discard() noexcept {
      while (Block* block = blocks) {
        blocks = block->next_out;
        free_block(block);
        delete block;
      }
      while (Block* block = records) {
        records = block->next_out;
        delete block;
      }
    }
  };
  // Moves a block that left a front into the shared lists, with its epoch;
  // into `leftovers` once the pool is closed (or when it is dead already).
  // Returns whether it went to a shared list.
  bool share(const Freed& freed, Leftovers& leftovers, std::chrono::steady_clock::time_point now) noexcept {
    Block* block = freed.block;
    take_back(block);
    if (block->dead) {
      leftovers.add(leftovers.records, block);
      return false;
    }
    if (!closed) {
      try {
        if (!block->list) block->list = &free_lists[{block->flags, block->bytes}];
        block->list->push_back(freed);
        block->released_at = now;
        counters.cached_bytes += block->bytes;
        return true;
      } catch (...) {  // no host memory: free the block rather than lose it
      }
    }
    counters.allocated_bytes -= block->bytes;
    leftovers.add(leftovers.blocks, block);
    return false;
  }
  void share(Front::List& list, Leftovers& leftovers) noexcept {
    if (!list.count) return;
    const auto now = std::chrono::steady_clock::now();  // (once: the lock is held)
    while (list.count) share(list.pop(), leftovers, now);
  }
  // Takes every block out of a front; the caller holds its lock as a visitor.
  void empty_front(Front& front, Leftovers& leftovers) noexcept {
    for (auto& list : front.lists) share(list, leftovers);
    front.bytes.store(0, std::memory_order_relaxed);
    front_claims.fetch_sub(std::exchange(front.claimed, 0), std::memory_order_relaxed);
  }
  void empty_fronts(Leftovers& leftovers) {
    for (auto& front : fronts) {
      std::lock_guard front_lock(front->lock.visitor());
      empty_front(*front, leftovers);
    }
  }
  std::size_t front_bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& front : fronts) total += front->bytes.load(std::memory_order_relaxed);
    return total;
  }

  // Moves the oldest blocks of the shared lists released by `released_by`
  // (kAnyTime: all) into `leftovers` until at most `keep` bytes are cached
  // there and in the fronts; returns the bytes.
  static constexpr auto kAnyTime = std::chrono::steady_clock::time_point::max();
  std::size_t evict_blocks(std::size_t keep, Leftovers& leftovers,
                           std::chrono::steady_clock::time_point released_by) noexcept {
    const std::size_t in_fronts = front_claims.load(std::memory_order_relaxed);
    keep = keep > in_fronts ? keep - in_fronts : 0;
    std::size_t evicted = 0;
    for (auto it = free_lists.begin(); it != free_lists.end() && counters.cached_bytes > keep; ++it) {
      auto& list = it->second;
      // (Oldest first: once one is too recent, so are the rest.)
      while (!list.empty() && counters.cached_bytes > keep && list.front().block->released_at <= released_by) {
        Block* block = list.front().block;
        list.pop_front();
        counters.cached_bytes -= block->bytes;
        counters.allocated_bytes -= block->bytes;
        evicted += block->bytes;
        leftovers.add(leftovers.blocks, block);
      }
    }
    return evicted;
  }

  // Cached registrations to unpin outside the lock, taken a batch at a time
  // into an array of the caller's: eviction allocates nothing, so a reset
  // or a trim where the host has run out of memory still unpins them all.
  using EvictedBatch = std::array<Registration*, 32>;
  // Takes up to a batch out, the oldest first, while over `keep` bytes; how many.
  std::size_t evict_registrations(std::size_t keep, EvictedBatch& evicted) noexcept {
    std::size_t taken = 0;
    while (taken < evicted.size() && registration_bytes > keep && !cached_registrations.empty()) {
      Registration* oldest = cached_registrations.back();
      cached_registrations.pop_back();
      registration_index.erase({reinterpret_cast<std::uintptr_t>(oldest->pointer), oldest->size, oldest->mapped});
      registration_bytes -= oldest->size;
      evicted[taken++] = oldest;
    }
    return taken;
  }
  // Unpins every cached registration; whether there were any. Takes the
  // lock; the caller holds the state (discard() may drop a record's share).
  bool evict_all_registrations() noexcept {
    bool any = false;
    for (;;) {
      EvictedBatch evicted;
      std::size_t taken = 0;
      {
        std::lock_guard lock(mutex);
        taken = evict_registrations(0, evicted);
      }
      discard(std::span(evicted.data(), taken));
      any |= taken > 0;
      if (taken < evicted.size()) return any;
    }
  }

  // --- the finalizers ---

  static void release(Block* block) noexcept {
    State& state = *block->state;
    Leftovers leftovers;
    if (Front* front = state.front_of_this_thread()) {
      Front::List displaced;
      bool kept = false;
      {
        std::lock_guard front_lock(front->lock.owner());
        if (!state.closed.load(std::memory_order_acquire)) kept = state.keep_in_front(*front, block, displaced);
      }
      if (kept && !displaced.count) return;
      std::lock_guard lock(state.mutex);
      state.share(displaced, leftovers);
      if (kept)
        state.evict_over_maximum(leftovers);
      else
        state.release_shared(block, leftovers);
    } else {
      std::lock_guard lock(state.mutex);
      state.release_shared(block, leftovers);
    }
    leftovers.discard();  // (the pool is gone, or full: free them now)
  }
  // A released block to the shared lists (or, when the pool is closed, to
  // `leftovers`). Under `mutex`.
  void release_shared(Block* block, Leftovers& leftovers) noexcept {
    if (!share({block, epochs.tag()}, leftovers, std::chrono::steady_clock::now())) return;
    ++frees_since_seal;
    evict_over_maximum(leftovers);
  }
  // Evicts the shared lists' oldest blocks beyond maximum_cached_bytes that
  // have been idle for idle_before_eviction, and any beyond
  // kMostCachedOverMaximum times that: blocks that go round between threads
  // (a loader thread's staging buffers, dropped by another) stay, while
  // most of a burst released at once goes back. Evicted at once, a
  // hand-over of 64 MiB blocks, 16 at a time (1 GiB, the maximum), evicted
  // a block for each three it took, and bought it again (35 ms on the
  // H200); at twice the maximum, one for each nine (simulated). Under `mutex`.
  void evict_over_maximum(Leftovers& leftovers) noexcept {
    // cuMemFreeHost waits until the GPU has run all its queued work, on every
    // stream (bench/probes/probe_free_stall.cpp: 50 ms behind a 50 ms kernel,
    // 0.4 ms idle): while the GPU reads busy, the cache may hold an
    // eighth more than its maximum rather than evict, as the device pool
    // grows rather than wait (Note [Growth while the GPU is busy]).
    // The GPU is asked (an event recorded and queried) only when an idle
    // block could go: requests and releases past the maximum whose blocks
    // all go round would otherwise pay that query each.
    const std::size_t maximum = options.maximum_cached_bytes;
    if (counters.cached_bytes + front_claims.load(std::memory_order_relaxed) <= maximum) return;
    const auto idle_since = std::chrono::steady_clock::now() - options.idle_before_eviction;
    if (holds_blocks_released_by(idle_since))
      evict_blocks(epochs.gpu_busy() ? maximum + maximum / 8 : maximum, leftovers, idle_since);
    evict_blocks(kMostCachedOverMaximum * maximum, leftovers, kAnyTime);
  }
  // Whether a shared list's oldest block was released by `time`. Under `mutex`.
  bool holds_blocks_released_by(std::chrono::steady_clock::time_point time) const noexcept {
    return std::any_of(free_lists.begin(), free_lists.end(), [&](const auto& entry) {
      return !entry.second.empty() && entry.second.front().block->released_at <= time;
    });
  }

  static void release(Registration* registration) noexcept {
    State& state = *registration->state;
    EvictedBatch evicted;
    std::size_t evicted_count = 0;
    std::shared_ptr<State> keep;  // outlives the lock below
    {
      std::lock_guard lock(state.mutex);
      state.pinned_out.erase(registration);
      if (registration->dead) {
        keep = std::move(registration->state);
        delete registration;
        return;
      }
      // Only with an owner that keeps the memory: without one, the caller may
      // unmap it next, and a later mapping at the same addresses, pinned
      // again, would find the old pages' registration.
      if (!state.closed && registration->owner && registration->size <= state.options.registration_cache_bytes) {
        // Both records or neither (no host memory for one: the range is unpinned below).
        const RegistrationKey key{reinterpret_cast<std::uintptr_t>(registration->pointer), registration->size,
                                  registration->mapped};
        bool cached = false;
        try {
          state.cached_registrations.push_front(registration);
          try {
            cached = state.registration_index.emplace(key, registration).second;
          } catch (...) {
          }
          if (!cached) state.cached_registrations.pop_front();
        } catch (...) {
        }
        if (cached) {
          registration->in_cache = state.cached_registrations.begin();
          state.registration_bytes += registration->size;
          registration = nullptr;
          // (Past a batch, the cache stays over its bytes until a later release.)
          evicted_count = state.evict_registrations(state.options.registration_cache_bytes, evicted);
        }
      }
    }
    discard(std::span(evicted.data(), evicted_count));
    if (registration) discard(std::span(&registration, 1));
  }
};

PinnedHostPool::PinnedHostPool(Context& context, PinnedHostPoolOptions options)
    : state_(std::make_shared<State>(context, options)) {}

PinnedHostPool::~PinnedHostPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->closed = true;
  }
  trim();
  std::lock_guard lock(state_->mutex);
  state_->epochs.retire();
}

std::shared_ptr<MemoryPointer> PinnedHostPool::allocate(std::size_t size, bool mapped, bool portable,
                                                        bool write_combined) {
  const unsigned flags = (mapped ? cuda::CU_MEMHOSTALLOC_DEVICEMAP : 0u) |
                         (portable ? cuda::CU_MEMHOSTALLOC_PORTABLE : 0u) |
                         (write_combined ? cuda::CU_MEMHOSTALLOC_WRITECOMBINED : 0u);
  const std::size_t bytes = host_block_size(size);
  if (bytes < size) throw OutOfMemory("PinnedHostPool::allocate", size, "no block of host memory can be that large");
  State::Block* block = nullptr;
  State::Front* front = state_->front_of_this_thread();
  if (front) {
    std::lock_guard front_lock(front->lock.owner());
    block = state_->take_from_front(*front, flags, bytes);
  }
  if (!block) {
    State::Leftovers leftovers;  // idle blocks past the maximum, freed outside the lock
    std::unique_lock lock(state_->mutex);
    State& state = *state_;
    const std::pair<unsigned, std::size_t> key{flags, bytes};
    if (!state.last_list || state.last_key != key) {
      auto found = state.free_lists.find(key);
      if (found != state.free_lists.end()) {
        state.last_key = key;
        state.last_list = &found->second;
      }
    }
    if (state.last_list && state.last_key == key) block = state.take_cached(*state.last_list, bytes);
    ++(block ? state.counters.hits : state.counters.misses);
    if (block) {
      state.hand_out(block);
      if (front) state.refill_front(*front, *state.last_list, flags, bytes);
    }
    // (A program that stops releasing still gives back what went idle.)
    state.evict_over_maximum(leftovers);
    lock.unlock();
    leftovers.discard();
  }
  if (!block) {
    ScopedContext scope(*state_->context);
    void* host = nullptr;
    cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostAlloc, &host, bytes, flags);
    if (result == cuda::CUDA_ERROR_OUT_OF_MEMORY && trim() > 0)
      result = CUEMM_CU_RESULT(cuMemHostAlloc, &host, bytes, flags);
    // (The size asked for, which the caller knows, and the block's.)
    if (result == cuda::CUDA_ERROR_OUT_OF_MEMORY)
      throw OutOfMemory("cuMemHostAlloc", size, "in a pinned block of " + describe_bytes(bytes));
    if (result != cuda::CUDA_SUCCESS)
      throw CudaError(result, "cuMemHostAlloc",
                      "requested " + describe_bytes(size) + " in a pinned block of " + describe_bytes(bytes));
    const cuda::CUdeviceptr device =
        mapped ? driver::mapped_device_pointer(host, [&] { CUEMM_CU_RESULT(cuMemFreeHost, host); }) : 0;
    try {
      block = new State::Block{state_, host, device, bytes, flags};
    } catch (...) {  // (no host memory for the record: the block goes back rather than leak)
      State::free_host(*state_->context, host);
      throw;
    }
    std::lock_guard lock(state_->mutex);
    state_->counters.allocated_bytes += bytes;
    state_->hand_out(block);
  }
  try {
    return host_memory_pointer(state_->context, block->host, block->device, size, nullptr,
                               [block] { State::release(block); });
  } catch (...) {
    State::release(block);
    throw;
  }
}

std::shared_ptr<MemoryPointer> PinnedHostPool::pin(std::shared_ptr<const void> owner, void* pointer,
                                                   std::size_t size, bool mapped) {
  State& state = *state_;
  State::Registration* registration = nullptr;
  State::Registration* unrecorded = nullptr;
  {
    std::lock_guard lock(state.mutex);
    auto found = state.registration_index.find({reinterpret_cast<std::uintptr_t>(pointer), size, mapped});
    if (found != state.registration_index.end()) {
      registration = found->second;
      state.cached_registrations.erase(registration->in_cache);
      state.registration_index.erase(found);
      state.registration_bytes -= size;
    }
    ++(registration ? state.counters.hits : state.counters.misses);
    if (registration) {
      try {
        state.pinned_out.insert(registration);
      } catch (...) {  // (no host memory for the record: the cached range is unpinned below, not left so)
        unrecorded = registration;
      }
    }
  }
  if (unrecorded) {
    State::discard(std::span(&unrecorded, 1));
    throw std::bad_alloc();
  }
  if (!registration) {
    ScopedContext scope(*state.context);
    const unsigned flags = mapped ? cuda::CU_MEMHOSTREGISTER_DEVICEMAP : 0u;
    cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostRegister, pointer, size, flags);
    if (result == cuda::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || result == cuda::CUDA_ERROR_OUT_OF_MEMORY) {
      // A cached registration may overlap the range, or hold the pinned memory the driver needs.
      if (state.evict_all_registrations()) result = CUEMM_CU_RESULT(cuMemHostRegister, pointer, size, flags);
    }
    if (result != cuda::CUDA_SUCCESS) driver::throw_allocation_error(result, "cuMemHostRegister", size);
    const cuda::CUdeviceptr device =
        mapped ? driver::mapped_device_pointer(pointer, [&] { CUEMM_CU_RESULT(cuMemHostUnregister, pointer); }) : 0;
    try {
      registration = new State::Registration{state_, owner, pointer, size, mapped, device, {}};
      std::lock_guard lock(state.mutex);
      state.pinned_out.insert(registration);
    } catch (...) {  // (no host memory for the record: the range is unpinned rather than left so)
      State::unregister_range(*state.context, pointer);
      delete registration;
      throw;
    }
  }
  try {
    return host_memory_pointer(state.context, pointer, registration->device, size, std::move(owner),
                               [registration] { State::release(registration); });
  } catch (...) {
    State::release(registration);
    throw;
  }
}

std::size_t PinnedHostPool::trim() {
  State& state = *state_;
  State::Leftovers leftovers;
  std::size_t freed = 0;
  {
    std::lock_guard lock(state.mutex);
    state.empty_fronts(leftovers);
    state.epochs.seal();
    state.epochs.poll(true);  // cached blocks may still be read by queued copies
    freed = state.evict_blocks(0, leftovers, State::kAnyTime);
  }
  leftovers.discard();
  state.evict_all_registrations();
  return freed;
}

void PinnedHostPool::release_everything() {
  State& state = *state_;
  State::Leftovers leftovers;
  // The memory, not the records: once marked dead, a record is deleted by
  // its pointer's release, which another thread may run meanwhile.
  std::vector<void*> blocks;
  // With their owners: a dead record's release may delete it before the
  // range is unregistered below, and an owner dropped then would free
  // memory that a new buffer, pinned in turn, finds still registered.
  std::vector<std::pair<void*, std::shared_ptr<const void>>> ranges;
  {
    std::lock_guard lock(state.mutex);
    state.closed = true;
    // The fronts first: a release after this sees `closed` and keeps nothing.
    state.empty_fronts(leftovers);
    // Each listed before it is marked dead: where the list cannot grow (the
    // host out of memory), the rest stay alive, and their pointers' releases
    // free them (the pool keeps nothing once closed).
    try {
      for (State::Block* block = state.handed_out; block; block = block->next_out) {
        if (block->dead) continue;  // (an earlier call freed it)
        blocks.push_back(block->host);
        block->dead = true;
        state.counters.allocated_bytes -= block->bytes;
      }
      for (State::Registration* registration : state.pinned_out) {
        if (registration->dead) continue;
        ranges.emplace_back(registration->pointer, registration->owner);
        registration->dead = true;
      }
    } catch (const std::bad_alloc&) {
    }
  }
  leftovers.discard();
  trim();
  // Handed-out records stay (their pointers still name them); only the memory goes.
  for (void* host : blocks) State::free_host(*state.context, host);
  for (const auto& [range, owner] : ranges) State::unregister_range(*state.context, range);
}

PinnedHostPoolStatistics PinnedHostPool::statistics() const {
  std::lock_guard lock(state_->mutex);
  PinnedHostPoolStatistics statistics = state_->counters;
  statistics.cached_bytes += state_->front_bytes();
  for (const auto& front : state_->fronts) statistics.front_hits += front->hits.load(std::memory_order_relaxed);
  statistics.hits += statistics.front_hits;
  statistics.cached_registrations = state_->cached_registrations.size();
  statistics.seals = state_->epochs.seals();
  return statistics;
}

}  // namespace cuemm
