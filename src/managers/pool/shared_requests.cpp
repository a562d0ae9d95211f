// pool/shared_requests.cpp: requests served under the pool's lock: from the index
// (a good fit among the shared segments' free blocks) and from segments of their own.
#include "core.hpp"

namespace cuemm {

std::uintptr_t PoolMemoryManager::Core::allocate_from_index(std::size_t size, ThreadCache* own, bool in_a_loop) {
  if (auto address = take_block(size)) [[likely]]
    return *address;
  growing_while_busy = room_forced_a_wait = false;  // (decided for this request only)
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
    if (auto address = grow_and_take(size, Growth::bought_by_seals, own ? own->bytes_in_ring(size) : 0)) {
      index_rental.bought();
      return *address;
    }
  }
  seal_for_quarantine();
  index_rental.rent();
  reclaim(false);
  if (auto address = take_block(size)) return *address;
  // Enough freed memory is waiting for the GPU: wait for it rather than grow.
  // (The threads' caches are left alone here: emptying them whenever the
  // index runs dry makes busy threads thrash; measured, 16 threads at 64 KiB
  // went from 16 ns to 1.1 us a pair.)
  if (quarantined_bytes >= size && !grows_rather_than_waits(std::max(size, kMinimumGrowth))) {
    // Near its peak the assembling pool takes the good fit or nothing
    // (take_block()): rather than wait for the GPU, a larger free block
    // whose pages are mapped serves, as without the option.
    if (arena && assembles_near_peak(0)) {
      if (auto address = take_mapped_block(size)) return *address;
    }
    seal();
    if (auto address = wait_for_freed([&] { return take_block(size); })) return *address;
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
    // A loop keeps its own ring: the seal above may have made its oldest
    // block safe, and handing that ring back to the index emptied it at
    // every such request until the loop's seals bought a segment, each pair
    // then through the index (1 MiB pairs in that warm-up 2-3x faster now,
    // simulated; docs/pool-measurements.md, "Why the 1 MiB pair from
    // Python reads twice the 256-byte one"). Its other classes still go
    // back: what they hold would otherwise keep the loop from buying.
    const int own_class = in_a_loop ? detail::size_class_of(size) : -1;
    return_safe_cached_blocks(*own, size, own_class);
    if (own_class >= 0) {
      std::lock_guard cache_lock(own->lock.owner());
      if (const std::uintptr_t address = own->take_oldest_if_safe(own_class, epochs)) return address;
    }
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
  // Near the peak, where blocks may be assembled, the caller's own safe
  // cached blocks go back before a request above the classes maps pages:
  // merged with their neighbours they may hold it, or give assembly free
  // ends. (RMM's workload up to 4 MiB with 128 MiB live: 1.134 -> 1.126
  // mean, seeds over 1.15 3/32 -> 0/32; not for the classes' requests,
  // whose loops then thrashed: up to 1 MiB 1.116 -> 1.132.)
  if (own && size > detail::kLargestCachedSize && assembles_near_peak(size) && bytes_cached_by(*own)) {
    return_safe_cached_blocks(*own, size);
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

std::optional<std::uintptr_t> PoolMemoryManager::Core::new_dedicated_segment(std::size_t segment) {
  refuse_growth_if_retired();
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
  raise_peak_after_growth();
  return base;
}

std::uintptr_t PoolMemoryManager::Core::allocate_dedicated(std::size_t size, bool in_a_loop, ThreadCache* own) {
  const std::size_t segment = detail::DedicatedSegments::segment_size(size);
  if (segment == 0) throw OutOfMemory("PoolMemoryManager::allocate", size, "no device has that much memory");
  const bool recurs = options.split_spares && saw_large_size(size);
  if (auto base = dedicated.take_spare(segment)) return *base;
  growing_while_busy = room_forced_a_wait = false;  // (decided for this request only)
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
    if (!grows_rather_than_waits(segment))  // (cuMemFree would wait for the GPU)
      free_segments(dedicated.take_spares_over(budget - quarantined_segment_bytes - segment));
    give_back_spares_within_peak(segment);
    if (auto base = new_dedicated_segment(segment)) {
      segment_rental.bought();
      return *base;
    }
  }
  seal_for_quarantine();
  segment_rental.rent();
  reclaim(false);
  if (auto base = dedicated.take_spare(segment)) return *base;
  if (quarantined_bytes >= segment && !grows_rather_than_waits(segment)) {
    if (auto base = wait_for_freed([&] { return dedicated.take_spare(segment); })) return *base;
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
    } else if (dedicated.spare_bytes() == 0 || !grows_rather_than_waits(segment)) {
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

bool PoolMemoryManager::Core::saw_large_size(std::size_t size) noexcept {
  constexpr std::size_t kRemembered = 4096;
  if (large_sizes_seen.size() >= kRemembered) large_sizes_seen.clear();
  try {
    return !large_sizes_seen.insert(size).second;
  } catch (...) {
    return false;  // (no host memory to remember it)
  }
}

}  // namespace cuemm
