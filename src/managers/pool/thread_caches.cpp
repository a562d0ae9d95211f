// pool/thread_caches.cpp: the thread caches' slow paths: a miss, a full ring, a
// thread's end.
#include "core.hpp"

namespace cuemm {

auto PoolMemoryManager::Core::make_thread_slot() -> ThreadCache* {
  auto made = std::make_unique<ThreadCache>(options.thread_cache_size);
  std::lock_guard lock(mutex);
  caches.push_back(std::move(made));
  return caches.back().get();
}

void PoolMemoryManager::Core::forget_cache(ThreadCache* cache) noexcept {
  std::lock_guard lock(mutex);
  auto it = std::find_if(caches.begin(), caches.end(), [&](const auto& owned) { return owned.get() == cache; });
  if (it == caches.end()) return;
  if (!retired) quarantine_cached_blocks(*cache);
  caches.erase(it);
}

std::uintptr_t PoolMemoryManager::Core::allocate_otherwise_here(std::size_t size, int size_class) {
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
  if (options.expandable && set_rings_aside_if_missed(cache, size_class)) {
    // What the rings hold goes too, to merge with its neighbours.
    std::lock_guard lock(mutex);
    std::lock_guard cache_lock(cache.lock.owner());
    quarantine_ring_blocks(cache, -1, epochs.tag());
  }
  bool advance = false, sealed = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard cache_lock(cache.lock.owner());
      cache.latest_class = size_class;
      cache.bins[size_class].taker = ThreadCache::Bin::Taker::own_thread;
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
  const ThreadCache::Bin& bin = cache.bins[size_class];
  // (Its count under the cache's lock: another thread's trim() or flush may
  // take the ring's blocks meanwhile, a race that TSan found.)
  auto holds_a_batch = [&] {
    std::lock_guard cache_lock(cache.lock.owner());
    return bin.count >= std::min(kRingBatchWorthSealing, bin.capacity / kRingFractionWorthSealing);
  };
  auto seal_for_own_ring = [&]() -> std::uintptr_t {
    if (!holds_a_batch()) return 0;
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

void PoolMemoryManager::Core::deallocate_otherwise(std::uintptr_t address, int size_class,
                                                   std::uint64_t epoch) noexcept {
  if (size_class < 0) {
    ThreadCache* cache = cache_for_a_free();
    if (cache && hold_large(address, epoch, *cache)) return;
    // Where another thread is at work in the pool, it takes the block in
    // (Note [Large frees from another thread]), and marks the lent entries
    // stale then (take_in_queued_frees()).
    if (queue_for_the_lock_holder({address, epoch})) return;
    // (Before the block can merge: every thread's lent entries are stale.)
    large_frees_elsewhere.fetch_add(1, std::memory_order_acq_rel);
    std::lock_guard lock(mutex);
    if (quarantine_foreign_free({address, epoch})) seal_and_reclaim();
    return;
  }
  ThreadCache* cache = cache_for_a_free();
  if (cache && keep_in_ring(*cache, address, size_class, epoch))
    return;
  deallocate_spilling(cache, address, size_class, epoch);
}

bool PoolMemoryManager::Core::quarantine_foreign_free(const Freed& freed, std::size_t* bytes) noexcept {
  const auto [block, in_segment_of_its_own] = block_at(freed.address);
  if (bytes) *bytes = block;
  if (block == 0) return false;
  if (!quarantine_or_reuse({freed.address, block, freed.epoch, in_segment_of_its_own})) return false;
  // Beyond the segments that rotate (see allocate_dedicated()), a request of
  // this size may wait for this one: seal now, so that it seldom does.
  const bool wants_seal = in_segment_of_its_own ? quarantined_segments >= kMaximumRotation ||
                                                      quarantined_segment_bytes + dedicated.spare_bytes() >
                                                          rotation_budget(block)
                                                : quarantine_holds_much();
  // (Stored only where it changes: the freeing thread reads it at each free.)
  if (foreign_free_wanted_seal.load(std::memory_order_relaxed) != wants_seal)
    foreign_free_wanted_seal.store(wants_seal, std::memory_order_relaxed);
  return wants_seal;
}

void PoolMemoryManager::Core::take_in_queued_frees() noexcept {
  // Before the first block can merge, once for the batch (its caller found
  // one waiting): an increment at each queued free moved the counter's line,
  // which every lend reads, to the freeing thread and back for each block
  // handed over.
  large_frees_elsewhere.fetch_add(1, std::memory_order_acq_rel);
  Freed freed;
  while (foreign_frees.take(freed)) {
    std::size_t bytes = 0;
    quarantine_foreign_free(freed, &bytes);
    ++(bytes > detail::kLargestCachedSize ? queued_large_frees : queued_small_frees);
  }
}

void PoolMemoryManager::Core::deallocate_spilling(ThreadCache* cache, std::uintptr_t address, int size_class,
                                                  std::uint64_t epoch) noexcept {
  const std::size_t class_bytes = detail::size_class_bytes(size_class);
  std::array<Freed, kMaximumBinCapacity / 2> spilled;
  std::size_t spill_count = 0;
  int spill_class = size_class;
  bool rings_set_aside = false, given_to_others = false;
  if (cache) {
    std::lock_guard cache_lock(cache->lock.owner());
    ThreadCache::Bin& bin = cache->bins[size_class];
    // Full ring: its older half goes to the shared quarantine; full
    // budget: see spill_stalest(). Rings set aside (Note [Rings set
    // aside]), or a class given to others (Note [Classes a thread frees
    // for others]): the block goes alone.
    rings_set_aside = cache->rings_set_aside;
    given_to_others = bin.taker == ThreadCache::Bin::Taker::others;
    if (!rings_set_aside && !given_to_others) {
      if (bin.count == bin.capacity)
        spill_count = cache->take_oldest(size_class, bin.count / 2, spilled.data());
      else if (cache->bytes.load(std::memory_order_relaxed) + class_bytes > cache->budget)
        spill_class = cache->spill_stalest(size_class, epoch, spilled.data(), spill_count);
      if (bin.count < bin.capacity) {
        cache->push_to_ring(size_class, address, epoch);
        address = 0;
      }
    }
  }
  if (spill_count) quarantine_spilled(spilled.data(), spill_count, detail::size_class_bytes(spill_class), false);
  if (address) {  // no cache, or no room in it
    const Freed freed{address, epoch};
    // (Without the seal the quarantine may want: the thread that asks for
    // the class seals once it needs these blocks, as it does for the frees
    // that cannot queue, below. The 1 MiB hand-over on the H200: 130-149 ->
    // 16-21 seals per 1000 blocks, 299 -> 200 ns a block.)
    if (given_to_others && queue_for_the_lock_holder(freed, QueuedSeal::left_to_the_taker)) return;
    // With the rings set aside, every free comes this way, to merge with its
    // neighbours: kept small, as the index's own frees keep it (Note [A
    // quarantine kept small]). Spilled halves of rings do not seal: a pair
    // loop's spills would pay a stream query each.
    quarantine_spilled(&freed, 1, class_bytes, rings_set_aside);
  }
}

void PoolMemoryManager::Core::quarantine_spilled(const Freed* spilled, std::size_t count, std::size_t class_bytes,
                                                 bool kept_small) noexcept {
  if (count == 0) return;
  bool holds_much = false;
  {
    std::lock_guard lock(mutex);
    for (std::size_t i = 0; i < count; ++i)
      quarantine_or_reuse({spilled[i].address, class_bytes, spilled[i].epoch, false});
    holds_much = kept_small && quarantine_holds_much();
  }
  if (holds_much) {
    try {
      advance_epochs();  // (its seal's stream query outside the pool's lock)
    } catch (...) {
    }
  }
}

}  // namespace cuemm
