// pool/stream_ordered.cpp: stream-ordered requests and frees that a thread
// reuses at once (Note [Stream-ordered reuse], Note [Same-stream reuse]).
#include "core.hpp"

namespace cuemm {

std::uint64_t PoolMemoryManager::Core::same_stream_tag(cuda::CUstream stream) const noexcept {
  if (!epochs.covers_every_stream()) return 0;
  try {
    unsigned long long id = 0;
    int capture = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
    if (CUEMM_CU_RESULT(cuStreamGetId, stream, &id) != cuda::CUDA_SUCCESS || id >= detail::kOtherStream - 1) return 0;
    if (CUEMM_CU_RESULT(cuStreamIsCapturing, stream, &capture) != cuda::CUDA_SUCCESS ||
        capture != cuda::CU_STREAM_CAPTURE_STATUS_NONE)
      return 0;
    return id + 1;
  } catch (const std::exception&) {
    return 0;  // (no driver)
  }
}

bool PoolMemoryManager::Core::refuses_without_asking(cuda::CUstream stream) noexcept {
  ThreadCache* cache = last_cache_of_this_thread();
  if (!cache) return false;
  std::lock_guard cache_lock(cache->lock.owner());
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  if (cache->ordered_handle == handle || cache->ordered_count == 0) return false;
  if (cache->ordered_misses + 1 >= kOrderedStreamPatience) return false;  // (this miss hands the bins on: ask)
  if (cache->has_side_handle(handle) || side_slot_to_claim(*cache)) return false;  // (a side stream's, or may be)
  ++cache->ordered_misses;
  ++cache->side_serial;  // (a free on the program's streams: side streams unused age)
  return true;
}

detail::ThreadCache::SideStream* PoolMemoryManager::Core::side_slot_to_claim(ThreadCache& cache) noexcept {
  ThreadCache::SideStream* oldest = nullptr;
  for (auto& slot : cache.side) {
    if (slot.stream == detail::kNoStream) return &slot;
    if (!oldest || slot.last_use < oldest->last_use) oldest = &slot;
  }
  return cache.side_serial - oldest->last_use >= kOrderedStreamPatience ? oldest : nullptr;
}

std::optional<detail::ThreadCache::OrderedLarge> PoolMemoryManager::Core::large_block_freed_here(
    std::uintptr_t address, ThreadCache& cache) noexcept {
  {
    std::lock_guard cache_lock(cache.lock.owner());
    if (auto lent = cache.take_lent(address, large_frees_elsewhere.load(std::memory_order_acquire))) return lent;
  }
  std::lock_guard lock(mutex);
  return large_block_in_records(address);
}

std::optional<detail::ThreadCache::OrderedLarge> PoolMemoryManager::Core::large_block_in_records(
    std::uintptr_t address) noexcept {
  large_frees_elsewhere.fetch_add(1, std::memory_order_acq_rel);
  const auto [block, in_segment_of_its_own] = block_at(address);
  if (block == 0) return std::nullopt;
  return ThreadCache::OrderedLarge{address, block, in_segment_of_its_own};
}

bool PoolMemoryManager::Core::keep_on_side(ThreadCache& cache, std::uint64_t stream, std::uintptr_t handle,
                                           std::uintptr_t address, int size_class) noexcept {
  using SideStream = ThreadCache::SideStream;
  using SideBlock = ThreadCache::SideBlock;
  const std::uint64_t epoch = epochs.tag();  // (for blocks sent on: their work was queued before this call)
  // The slot: the stream's, or one to take (only this thread takes slots,
  // so what is found here stays the stream's; others only empty them).
  {
    std::unique_lock cache_lock(cache.lock.owner());
    SideStream* slot = cache.side_stream(stream);
    if (!slot) {
      slot = side_slot_to_claim(cache);
      if (!slot) return false;
      if (slot->count) {  // a stream gone quiet: its blocks to the quarantine (the pool's lock first)
        cache_lock.unlock();
        std::lock_guard lock(mutex);
        cache_lock.lock();
        for (std::uint32_t i = slot->count; i-- > 0;) {
          const SideBlock block = cache.remove_side(*slot, i);
          quarantine_or_reuse({block.address, block.bytes, epoch, block.dedicated});
        }
      }
      slot->stream = stream;
      slot->handle = handle;
    }
    cache.used(*slot);
  }
  SideBlock block{address, 0, size_class, false};
  if (size_class >= 0) {
    block.bytes = detail::size_class_bytes(size_class);
  } else {
    const auto large = large_block_freed_here(address, cache);
    if (!large) return true;  // (no block starts there: as deallocate_ordered_large())
    block.bytes = large->bytes;
    block.dedicated = large->dedicated;
  }
  // Room: a full slot sends its oldest block on, and one that holds as many
  // large blocks as the ordered bins may its oldest large one; a small
  // block past the cache's budget is not kept.
  std::optional<SideBlock> sent;
  bool kept = false;
  {
    std::lock_guard cache_lock(cache.lock.owner());
    if (SideStream* slot = cache.side_stream(stream)) {
      if (size_class < 0) {
        std::uint32_t large = 0, oldest_large = slot->count;
        for (std::uint32_t i = 0; i < slot->count; ++i) {
          if (slot->blocks[i].size_class >= 0) continue;
          if (large++ == 0) oldest_large = i;
        }
        if (large >= kOrderedLargeCapacity) sent = cache.remove_side(*slot, oldest_large);
      }
      if (!sent && slot->count == detail::kSideStreamDepth) sent = cache.remove_side(*slot, 0);
      if (size_class < 0 || cache.bytes.load(std::memory_order_relaxed) + block.bytes <= cache.budget) {
        cache.push_side(*slot, block);
        kept = true;
      }
    }
  }
  if (sent || !kept) {
    std::lock_guard lock(mutex);
    if (sent) quarantine_or_reuse({sent->address, sent->bytes, epoch, sent->dedicated});
    if (!kept) quarantine_or_reuse({block.address, block.bytes, epoch, block.dedicated});
  }
  return true;
}

bool PoolMemoryManager::Core::keep_frees_of(ThreadCache& cache, std::uint64_t stream, std::uintptr_t handle) noexcept {
  {
    std::lock_guard cache_lock(cache.lock.owner());
    if (claim_ordered_bins(cache, stream, handle)) return true;
    if (cache.ordered_count == 0) return false;  // (empty bins not claimed: the stream has a side slot)
    if (++cache.ordered_misses < kOrderedStreamPatience) return false;
  }
  // The stream the bins hold has gone quiet (or away): its blocks wait for
  // their epoch in the quarantine, as any other free's.
  std::lock_guard lock(mutex);
  std::lock_guard cache_lock(cache.lock.owner());
  const std::uint64_t epoch = epochs.tag();
  quarantine_ordered_bins(cache, -1, epoch);
  quarantine_ordered_large(cache, epoch);
  return claim_ordered_bins(cache, stream, handle);
}

std::uintptr_t PoolMemoryManager::Core::allocate_ordered_otherwise_here(std::size_t size, int size_class,
                                                                        std::uint64_t stream) {
  ThreadCache* own = caches_enabled() ? cache_of_this_thread() : nullptr;
  if (!own) return allocate(size, size_class);
  ThreadCache& cache = *own;
  const RequestingStream requesting(cache, stream);
  // (The index and the segments of their own give the thread's other
  // stream-ordered frees back before they grow: give_back_ordered_blocks().)
  // (A side stream of the same tag as the bins' is one they held before: look there too.)
  if (size_class >= 0) {
    {
      std::lock_guard cache_lock(cache.lock.owner());
      if (cache.ordered_stream == stream) {
        if (const std::uintptr_t address = cache.take_ordered(size_class)) {
          cache.ordered_misses = 0;
          return address;
        }
      }
      if (ThreadCache::SideStream* side = cache.side_stream(stream)) {
        cache.used(*side);
        if (const auto block = cache.take_side(*side, size_class, 0, false)) return block->address;
      }
    }
    return allocate(size, size_class);
  }
  const bool own_segment = wants_own_segment(size);
  const std::size_t needed = large_block_bytes(size, own_segment);
  {
    std::lock_guard cache_lock(cache.lock.owner());
    if (cache.ordered_stream == stream) {
      if (auto found = cache.take_ordered_large(needed, own_segment)) {
        cache.ordered_misses = 0;
        cache.lend(*found, large_frees_elsewhere.load(std::memory_order_acquire));
        return found->address;
      }
    }
    if (ThreadCache::SideStream* side = cache.side_stream(stream)) {
      cache.used(*side);
      if (const auto block = cache.take_side(*side, -1, needed, own_segment)) {
        cache.lend({block->address, block->bytes, block->dedicated}, large_frees_elsewhere.load(std::memory_order_acquire));
        return block->address;
      }
    }
  }
  // The oldest block the thread holds from its frees without a stream, once
  // safe, serves any stream; else, at the peak, the kept blocks would go
  // back before it was looked at.
  if (const std::uintptr_t address = take_oldest_held_if_safe(size, cache)) return address;
  std::lock_guard lock(mutex);
  if (passes_peak(needed)) give_back_ordered_blocks(cache, -1);
  const std::uintptr_t address = allocate_beyond_classes(size, &cache);
  lend_from_pool(cache, address);
  return address;
}

bool PoolMemoryManager::Core::give_back_ordered_blocks(ThreadCache& own, int kept) {
  const std::uint64_t epoch = epochs.tag();
  bool moved = false;
  {
    std::lock_guard cache_lock(own.lock.owner());
    if (own.gives_back(own.ordered_stream, own.bins_in_turn())) {
      moved |= quarantine_ordered_bins(own, kept, epoch);
      moved |= quarantine_ordered_large(own, epoch);
    }
    moved |= quarantine_side_streams(own, epoch, true);
  }
  for_each_other_cache_holding(&own, holds_large_blocks, [&](ThreadCache& other) {
    moved |= quarantine_ordered_large(other, epoch);
    moved |= quarantine_side_streams(other, epoch);
  });
  if (moved) {
    seal();
    reclaim(false);
  }
  return moved;
}

void PoolMemoryManager::Core::deallocate_ordered_spilling(ThreadCache& cache, std::uintptr_t address,
                                                          int size_class) noexcept {
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
  quarantine_spilled(spilled.data(), spill_count, detail::size_class_bytes(spill_class), false);
  if (address) {
    const Freed freed{address, epochs.tag()};
    quarantine_spilled(&freed, 1, class_bytes, false);
  }
}

void PoolMemoryManager::Core::deallocate_ordered_large(std::uintptr_t address, ThreadCache& cache) noexcept {
  {
    std::lock_guard cache_lock(cache.lock.owner());
    const auto lent = cache.take_lent(address, large_frees_elsewhere.load(std::memory_order_acquire));
    if (lent && cache.ordered_large_count < kOrderedLargeCapacity) [[likely]] {
      cache.push_ordered_large(*lent);
      return;
    }
  }
  std::lock_guard lock(mutex);
  const auto large = large_block_in_records(address);
  if (!large) return;
  std::lock_guard cache_lock(cache.lock.owner());
  try {
    if (cache.ordered_large_count == kOrderedLargeCapacity) {
      const ThreadCache::OrderedLarge& oldest = cache.ordered_large[0];
      quarantine_block(oldest.address, oldest.bytes, epochs.tag(), oldest.dedicated);
      cache.remove_ordered_large(0);
    }
  } catch (...) {
    // No room to defer the oldest: it is still the thread's; this one waits for its epoch instead.
    quarantine_or_reuse({address, large->bytes, epochs.tag(), large->dedicated});
    return;
  }
  cache.push_ordered_large(*large);
}

void PoolMemoryManager::Core::order_after(cuda::CUstream stream) noexcept {
  // Seals that record for the whole context cover the stream's work already.
  // (Not while a graph is captured, where the legacy stream may not wait:
  // with seals on the legacy stream, such a free is then not ordered after
  // its stream's work.)
  if (epochs.covers_every_stream() || context->capturing()) return;
  try {
    ScopedContext scope(*context);
    // A stream with nothing queued has no work to order after. (Waits queued
    // for idle streams kept the legacy stream reading busy, and the pool,
    // taking that for GPU work, grew rather than reuse: Note [Growth while
    // the GPU is busy].)
    if (CUEMM_CU_RESULT(cuStreamQuery, stream) == cuda::CUDA_SUCCESS) return;
    std::lock_guard lock(mutex);  // one event: record and wait together
    if (!ordering_event) CUEMM_CU(cuEventCreate, &ordering_event, cuda::CU_EVENT_DISABLE_TIMING);
    CUEMM_CU(cuEventRecord, ordering_event, stream);
    CUEMM_CU(cuStreamWaitEvent, cuda::CU_STREAM_LEGACY, ordering_event, 0);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm pool: cannot order a free on stream %p (%s); synchronising instead\n",
                 static_cast<void*>(stream), error.what());
    if (CUEMM_CU_RESULT(cuStreamSynchronize, stream) != cuda::CUDA_SUCCESS) CUEMM_CU_RESULT(cuCtxSynchronize);
  }
}

}  // namespace cuemm
