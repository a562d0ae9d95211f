// pool/held_blocks.cpp: large blocks in the thread caches (Note [Large blocks in
// the thread caches]).
#include "core.hpp"

namespace cuemm {

std::uintptr_t PoolMemoryManager::Core::allocate_large(std::size_t size, ThreadCache& cache) {
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
      // Only a loop buys a block for its rotation: a thread of random sizes
      // whose seals had added up bought at any moment, at the pool's peak
      // too (RMM's workload up to 64 MiB with 256 MiB live, seed 7: a held
      // 58 MiB block not yet safe, and 1.07 -> 1.24 reserved over live).
      if (may_hold_more && cache.held_hits_since_miss >= kHeldHitsOfALoop &&
          cache.held_rental.buys(kSealsWorthASegment)) {
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
      if (cache.held_hits_since_miss < kHeldHitsOfALoop) {
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

std::uintptr_t PoolMemoryManager::Core::take_idle_block(std::size_t size, bool own_segment, ThreadCache& cache) {
  std::unique_lock lock(mutex, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  const std::optional<std::uintptr_t> address =
      own_segment ? dedicated.take_spare(detail::DedicatedSegments::segment_size(size)) : take_block(size);
  if (!address) return 0;
  lend_from_pool(cache, *address);
  return *address;
}

void PoolMemoryManager::Core::hold_large_otherwise(std::uintptr_t address, std::uint64_t epoch, ThreadCache& cache,
                                                   const ThreadCache::OrderedLarge& lent,
                                                   bool strays_from_its_kind) noexcept {
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

}  // namespace cuemm
