// pool/quarantine.cpp: freed blocks waiting for the GPU (Note [Stream-safe
// reuse]) in the quarantine, and their ways back: from it, and from the
// thread caches.
#include "core.hpp"

namespace cuemm {

void PoolMemoryManager::Core::quarantine_block(std::uintptr_t address, std::size_t size, std::uint64_t epoch,
                                               bool in_segment_of_its_own) {
  quarantine.push_back({address, size, epoch, in_segment_of_its_own});
  quarantine_may_hold.store(true, std::memory_order_relaxed);
  quarantined_bytes += size;
  newest_quarantined_epoch = std::max(newest_quarantined_epoch, epoch);
  if (in_segment_of_its_own) {
    quarantined_segment_bytes += size;
    ++quarantined_segments;
  }
}

auto PoolMemoryManager::Core::block_at(std::uintptr_t address) const -> BlockAt {
  if (!assembled.empty()) {
    if (const auto block = assembled.find(address); block != assembled.end()) return {block->second.bytes, false};
  }
  if (const std::size_t segment = dedicated.size_of(address)) return {segment, true};
  if (recurring.allocated_blocks()) {
    if (const std::size_t bytes = recurring.block_size(address)) return {bytes, false};
  }
  if (small_blocks.allocated_blocks()) {
    if (const std::size_t bytes = small_blocks.block_size(address)) return {bytes, false};
  }
  return {blocks.block_size(address), false};
}

bool PoolMemoryManager::Core::quarantine_or_reuse(const Quarantined& block) noexcept {
  try {
    quarantine_block(block.address, block.size, block.epoch, block.dedicated);
    return true;
  } catch (...) {
  }
  // No room in the quarantine: the GPU's work queued before the free runs
  // out first, so that the block is not handed out under it. Where that
  // cannot be waited for (a capture, a driver error) the block stays out
  // of use, counted as in use, until the pool's reset.
  if (epochs.wait_until_safe(block.epoch)) {
    try {
      reuse(block);
    } catch (...) {
    }
  }
  return false;
}

void PoolMemoryManager::Core::reuse(const Quarantined& block) {
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

void PoolMemoryManager::Core::return_whole_recurring_regions() noexcept {
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

std::size_t PoolMemoryManager::Core::reclaim_quarantine() {
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

void PoolMemoryManager::Core::quarantine_ring_blocks(ThreadCache& cache, int kept, std::uint64_t epoch) noexcept {
  std::array<Freed, kMaximumBinCapacity> taken;
  for (int c = 0; c < detail::kSizeClassCount; ++c) {
    if (c == kept) continue;
    while (const std::size_t n = cache.take_oldest(c, kMaximumBinCapacity, taken.data()))
      for (std::size_t i = 0; i < n; ++i)
        quarantine_or_reuse({taken[i].address, detail::size_class_bytes(c), taken[i].epoch, false});
  }
  quarantine_ordered_bins(cache, kept, epoch);
  quarantine_side_streams(cache, epoch);
}

bool PoolMemoryManager::Core::quarantine_ordered_bins(ThreadCache& cache, int kept, std::uint64_t epoch) noexcept {
  bool any = false;
  std::array<Freed, kMaximumBinCapacity> taken;
  for (int c = 0; c < detail::kSizeClassCount; ++c) {
    if (c == kept) continue;
    while (const std::size_t n = cache.take_oldest_ordered(c, kMaximumBinCapacity, epoch, taken.data())) {
      for (std::size_t i = 0; i < n; ++i)
        quarantine_or_reuse({taken[i].address, detail::size_class_bytes(c), epoch, false});
      any = true;
    }
  }
  return any;
}

void PoolMemoryManager::Core::return_safe_cached_blocks(ThreadCache& cache, std::size_t request, int kept_class) {
  std::lock_guard cache_lock(cache.lock.owner());
  std::array<Freed, kMaximumBinCapacity> taken;
  for (int c = 0; c < detail::kSizeClassCount; ++c) {
    if (c == kept_class) continue;
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

bool PoolMemoryManager::Core::quarantine_side_streams(ThreadCache& cache, std::uint64_t epoch,
                                                     bool as_the_request_gives_back) noexcept {
  bool any = false;
  for (auto& slot : cache.side) {
    if (as_the_request_gives_back && !cache.gives_back(slot.stream, cache.in_turn(slot))) continue;
    any |= slot.count > 0;
    while (slot.count) {
      const ThreadCache::SideBlock block = cache.remove_side(slot, slot.count - 1);
      quarantine_or_reuse({block.address, block.bytes, epoch, block.dedicated});
    }
  }
  return any;
}

}  // namespace cuemm
