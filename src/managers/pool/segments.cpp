// pool/segments.cpp: the pool's memory from the driver: shared, small and
// expandable segments grown, spares taken over, free segments given back.
#include "core.hpp"

namespace cuemm {

std::optional<detail::TlsfBlockAllocator::Region> PoolMemoryManager::Core::grow_shared(std::size_t size) {
  if (size > kLargestGrowth) return std::nullopt;  // (its rounding would wrap; no device holds it)
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
  give_back_idle_segments_within_peak(/*small=*/false, segment);
  return add_new_segment(blocks, wanted, segment);
}

std::optional<detail::TlsfBlockAllocator::Region> PoolMemoryManager::Core::add_new_segment(
    detail::TlsfBlockAllocator& index, std::size_t wanted, std::size_t segment) {
  refuse_growth_if_retired();
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
  raise_peak_after_growth();
  return detail::TlsfBlockAllocator::Region{base, segment};
}

bool PoolMemoryManager::Core::grow_small(std::size_t size, Growth growth, std::size_t ring_bytes) {
  constexpr std::size_t wanted = kSegmentGranularity;  // (holds any small request)
  // Bought by a loop's seals: room for 4 of the request, or for as many
  // blocks as the loop's ring holds, so that the ring doubles with each
  // purchase (Note [Small blocks apart]).
  std::size_t segment =
      growth == Growth::bought_by_seals
          ? std::clamp(util::round_up(std::max(4 * size, ring_bytes), kSegmentGranularity), wanted,
                       kLargestBoughtSmallSegment)
          : wanted;
  if (carve_small_segment(segment)) return true;
  give_back_idle_segments_within_peak(/*small=*/true, segment);
  return add_new_segment(small_blocks, wanted, segment).has_value();
}

bool PoolMemoryManager::Core::carve_small_segment(std::size_t segment) {
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

namespace {
// Gives the entirely free regions of `index` back to the driver, but those
// that `kept` takes care of itself (returning true). Nothing leaves the index
// where the driver refuses the context or there is no host memory for the
// list (they stay until the next try). Returns the bytes freed.
template <typename Kept>
std::size_t free_empty_regions(const Context& context, detail::TlsfBlockAllocator& index, std::size_t& driver_frees,
                               Kept kept) noexcept {
  std::optional<ScopedContext> scope;
  std::vector<detail::TlsfBlockAllocator::Region> free;
  try {
    scope.emplace(context);
    free = index.take_free_regions();
  } catch (...) {
    return 0;
  }
  std::size_t released = 0;
  for (const auto& region : free) {
    if (kept(region)) continue;
    CUEMM_CU_RESULT(cuMemFree, region.base);
    ++driver_frees;
    released += region.size;
  }
  return released;
}
}  // namespace

std::size_t PoolMemoryManager::Core::release_free_small_segments() noexcept {
  // Those carved from the initial segment go back to it.
  return free_empty_regions(*context, small_blocks, driver_frees, [&](const detail::TlsfBlockAllocator::Region& region) {
    if (!carved_small_segments.erase(region.base)) return false;
    blocks.deallocate(region.base);
    carved_small_bytes -= region.size;
    return true;
  });
}

std::optional<detail::TlsfBlockAllocator::Region> PoolMemoryManager::Core::move_spare_into(
    detail::TlsfBlockAllocator& index, std::size_t size, std::size_t at_most) {
  const std::optional<detail::DedicatedSegments::Segment> spare =
      dedicated.smallest_spare_of_at_least(index.rounded_size(size));
  if (!spare || spare->size > at_most) return std::nullopt;
  index.add_region(spare->base, spare->size);  // (first: it may throw, with nothing changed)
  dedicated.forget_spare(*spare);
  return detail::TlsfBlockAllocator::Region{spare->base, spare->size};
}

bool PoolMemoryManager::Core::grow_arena(std::size_t size) {
  refuse_growth_if_retired();
  if (size > kLargestGrowth) return false;  // (its rounding would wrap; no device holds it)
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

std::optional<std::uintptr_t> PoolMemoryManager::Core::take_block(std::size_t size) {
  if (!arena) [[likely]]
    return (is_small(size) ? small_blocks : blocks).allocate(size);
  if (assembles_near_peak(0)) {
    // Near the peak, the good fit or nothing: a larger mapped block split
    // here would take the free ends that an assembled block is made of.
    // (Simulated, RMM's workload up to 4 MiB with 128 MiB live, seeds 1-8
    // four times each, with the two rules below: 1.162 (max 1.188) -> 1.126
    // (max 1.141) reserved over live.)
    const std::optional<std::uintptr_t> address = blocks.allocate(size);
    if (!address || arena->committed(*address - arena->base(), blocks.block_size(*address))) return address;
    blocks.deallocate(*address);
    return std::nullopt;
  }
  return take_mapped_block(size);
}

std::optional<std::uintptr_t> PoolMemoryManager::Core::take_mapped_block(std::size_t size) {
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

std::optional<std::uintptr_t> PoolMemoryManager::Core::grow_and_take(std::size_t size, Growth growth,
                                                                      std::size_t ring_bytes) {
  if (!options.expandable) return grow(size, growth, ring_bytes) ? take_block(size) : std::nullopt;
  std::optional<std::uintptr_t> address = blocks.allocate(size);  // the best fit, mapped or not
  if (!address && grow(size)) address = blocks.allocate(size);
  if (!address) return std::nullopt;
  if (options.assemble_blocks) {
    const std::size_t bytes = blocks.block_size(*address);
    const std::size_t page = arena->granularity();
    const std::size_t new_pages = arena->unmapped_pages(*address - arena->base(), bytes);
    // (Blocks of half a page or less are not assembled: their holes lie
    // within a page, and the free ends they would take are what a later
    // request placed whole needs. RMM's workload up to 1 MiB with 512 MiB
    // live, simulated, seeds 1-8: 1.116 either way, its worst seed 1.224
    // with them, 1.143 without; up to 4 MiB 1.160 and 1.164 with 128 MiB.
    // Near the peak is a quarter of it: a 32nd left that workload at 1.148,
    // an 8th at 1.134; the model of docs/pool-measurements.md agrees.)
    if (new_pages && bytes > page / 2 && assembles_near_peak(new_pages * page)) {
      blocks.deallocate(*address);  // (the same best fit comes back below if nothing is assembled)
      if (const auto assembled_block = assemble_block(bytes, new_pages)) return assembled_block;
      address = blocks.allocate(size);
      if (!address) return std::nullopt;
    }
  }
  try {
    if (map_pages_under(*address, blocks.block_size(*address))) return address;
  } catch (...) {
    blocks.deallocate(*address);
    throw;
  }
  blocks.deallocate(*address);
  return std::nullopt;
}

bool PoolMemoryManager::Core::map_pages_under(std::uintptr_t address, std::size_t bytes) {
  const std::size_t offset = address - arena->base();
  if (arena->committed(offset, bytes)) [[likely]]
    return true;
  // Room for the block's whole span of pages, not only those it maps: at
  // the peak that gives a free page or so more back, which later requests
  // may map again, but placed them tighter (simulated, RMM's workload up to
  // 4 MiB with 512 MiB live, seeds 1-8: room for the new pages only made 6%
  // fewer page mappings, and took the worst seed from 1.148 to 1.159-1.170).
  const std::size_t page = arena->granularity();
  if (!make_room_to_map(util::round_up(offset + bytes, page) - offset / page * page)) return false;
  refuse_growth_if_retired();
  ScopedContext scope(*context);
  std::size_t mapped = 0;
  if (!arena->commit(offset, bytes, mapped)) return false;
  driver_allocations += mapped;
  raise_peak_after_growth();
  return true;
}

std::optional<std::uintptr_t> PoolMemoryManager::Core::assemble_block(std::size_t bytes, std::size_t new_pages) {
  const std::size_t page = arena->granularity();
  const std::uintptr_t base = arena->base();
  // A tail: a free block's first bytes to the end of their mapped page; a
  // head: a mapped page's first bytes, the end of a free block. (A model of
  // RMM's workload picked the pair that maps the fewest new pages, then
  // leaves the least of the head: docs/pool-measurements.md.)
  struct End {
    std::uintptr_t address;
    std::size_t length;
  };
  std::vector<End> tails, heads;
  int looks = kAssemblyLooks;
  blocks.for_each_free_block(0, [&](std::uintptr_t begin, std::size_t length) {
    const std::size_t from = begin - base, to = from + length;
    if (from % page && to >= (from / page + 1) * page && arena->committed(from / page * page, 1))
      tails.push_back({begin, (from / page + 1) * page - from});
    if (to % page && from <= to / page * page && arena->committed(to / page * page, 1))
      heads.push_back({base + to / page * page, to % page});
    return --looks > 0;
  });
  const End* tail = nullptr;
  const End* head = nullptr;
  std::size_t fewest = new_pages, least_left = SIZE_MAX;
  auto consider = [&](const End* a_tail, const End* a_head) {
    const std::size_t from_tail = a_tail ? a_tail->length : 0;
    if (from_tail > bytes) return;
    const std::size_t rest = bytes - from_tail, last = rest % page;
    std::size_t pages = rest / page, left = 0;
    if (a_head) {
      if (last == 0 || a_head->length < last) return;
      if (a_tail && a_tail->address / page == a_head->address / page) return;
      left = a_head->length - last;
    } else if (last) {
      ++pages;
    }
    if (pages < fewest || (pages == fewest && (tail || head) && left < least_left))
      tail = a_tail, head = a_head, fewest = pages, least_left = left;
  };
  for (const End& one : tails) consider(&one, nullptr);
  for (const End& one : heads) consider(nullptr, &one);
  for (const End& one : tails)
    for (const End& other : heads) consider(&one, &other);
  if (!tail && !head) return std::nullopt;
  // Its two ends are taken out of the index while it lives (first: making
  // room below may reclaim blocks into the index).
  const std::size_t from_tail = tail ? tail->length : 0;
  const std::size_t head_bytes = head ? (bytes - from_tail) % page : 0;
  if (tail && !blocks.allocate_at(tail->address, tail->length, kAssemblyLooks)) return std::nullopt;
  try {
    if (head && !blocks.allocate_at(head->address, head_bytes, kAssemblyLooks)) {
      if (tail) blocks.deallocate(tail->address);
      return std::nullopt;
    }
  } catch (...) {  // (the index's node for the split: the host out of memory)
    if (tail) blocks.deallocate(tail->address);
    throw;
  }
  auto give_back_ends = [&] {
    if (tail) blocks.deallocate(tail->address);
    if (head) blocks.deallocate(head->address);
  };
  std::optional<cuda::CUdeviceptr> address;
  try {
    // Its own pages pass the peak only once free pages are given back, as a
    // best fit's would (Note [Pages given back]).
    if (!make_room_to_map(fewest * page)) {
      give_back_ends();
      return std::nullopt;
    }
    refuse_growth_if_retired();
    assembled.reserve(assembled.size() + 1);
    ScopedContext scope(*context);
    detail::ExpandableArena::Assembly assembly;
    if (tail) {
      assembly.tail_page = (tail->address - base) / page * page;
      assembly.tail_from = (tail->address - base) % page;
    }
    assembly.own_pages = fewest;
    if (head) assembly.head_page = head->address - base;
    address = arena->assemble(assembly);
  } catch (...) {
    give_back_ends();
    throw;
  }
  if (!address) {
    give_back_ends();
    return std::nullopt;
  }
  const std::size_t own_bytes = bytes - from_tail - head_bytes;
  try {
    assembled.emplace(*address, AssembledBlock{bytes, tail ? tail->address : 0, head ? head->address : 0, own_bytes,
                                               fewest});  // (the buckets reserved above; its node may still fail)
  } catch (...) {
    {
      ScopedContext scope(*context);
      arena->disassemble(*address);
    }
    give_back_ends();
    throw;
  }
  assembled_own_bytes += own_bytes;
  driver_allocations += fewest;
  ++blocks_assembled;
  raise_peak_after_growth();
  return *address;
}

bool PoolMemoryManager::Core::give_back_assembled(std::uintptr_t address) noexcept {
  const auto found = assembled.find(address);
  if (found == assembled.end()) return false;
  const AssembledBlock block = found->second;
  assembled.erase(found);
  {
    ScopedContext scope(*context);
    arena->disassemble(address);
  }
  if (block.tail) blocks.deallocate(block.tail);
  if (block.head) blocks.deallocate(block.head);
  assembled_own_bytes -= block.own_bytes;
  driver_frees += block.own_pages;
  return true;
}

bool PoolMemoryManager::Core::make_room_to_map(std::size_t at_most) {
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
  return true;
}

std::size_t PoolMemoryManager::Core::unmap_free_pages(std::size_t bytes) {
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

bool PoolMemoryManager::Core::grow_initially(std::size_t size) {
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

std::size_t PoolMemoryManager::Core::release_free_segments() {
  return_whole_recurring_regions();
  const auto spares = dedicated.take_spares_over(0);
  free_segments(spares);
  std::size_t released = 0;
  for (const auto& spare : spares) released += spare.size;
  released += release_free_small_segments();
  if (arena) {
    ScopedContext scope(*context);
    return released + shrink_arena();
  }
  return released + release_free_shared_segments();
}

std::size_t PoolMemoryManager::Core::release_free_shared_segments() noexcept {
  return free_empty_regions(*context, blocks, driver_frees, [&](const detail::TlsfBlockAllocator::Region& region) {
    if (initial_segment && region.base == initial_segment->base) initial_segment.reset();
    return false;
  });
}

std::size_t PoolMemoryManager::Core::shrink_arena() {
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

std::uintptr_t PoolMemoryManager::Core::forward(std::size_t size, int size_class, bool ordered, std::uint64_t stream) {
  struct Forwarding {
    Forwarding() noexcept { forwarding = true; }
    ~Forwarding() { forwarding = false; }
  } forwarding_scope;
  for (Core* retired_core = this;;) {
    Core* next = retired_core->successor.load(std::memory_order_acquire);
    if (!next) throw StateError("the pool was destroyed while this request was under way");
    while (Core* newer = next->successor.load(std::memory_order_acquire)) next = newer;
    forwarded_to = next;
    try {
      return ordered ? next->allocate_ordered(size, size_class, stream) : next->allocate(size, size_class);
    } catch (const Retired&) {
      retired_core = next;
    }
  }
}

void PoolMemoryManager::Core::retire() noexcept {
  std::lock_guard lock(mutex);
  retired = true;
  for_each_other_cache(nullptr, [](ThreadCache& cache) {
    for (auto& bin : cache.bins) bin.count = bin.head = bin.frees_since_advance = 0;
    for (auto& bin : cache.ordered) bin.count = 0;
    cache.ordered_large_count = 0;
    cache.ordered_count = 0;
    for (auto& slot : cache.side) slot.count = 0;
    cache.forget_held_large();
    cache.bytes = 0;
    cache.large_bytes = 0;
  });
  epochs.retire();
  if (!context) return;  // the version-probe instance never touched the driver
  try {
    ScopedContext scope(*context);
    CUEMM_CU_RESULT(cuCtxSynchronize);  // blocks in use may still be read by queued work
    if (ordering_event) CUEMM_CU_RESULT(cuEventDestroy, std::exchange(ordering_event, nullptr));
    // (Nothing below allocates: the segments go back where the host is out of memory too.)
    auto free_region = [](const detail::TlsfBlockAllocator::Region& region) {
      CUEMM_CU_RESULT(cuMemFree, region.base);
    };
    blocks.release_all_regions([&](const detail::TlsfBlockAllocator::Region& region) {
      if (!arena) free_region(region);
    });
    if (arena) arena->release();  // (its assembled blocks too)
    assembled.clear();
    assembled_own_bytes = 0;
    recurring.release_all_regions(free_region);
    small_blocks.release_all_regions([&](const detail::TlsfBlockAllocator::Region& region) {
      if (!carved_small_segments.count(region.base)) free_region(region);
    });
    dedicated.release_all(
        [&](const detail::DedicatedSegments::Segment& segment) { free_segment_memory(segment.base); });
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm pool: returning memory failed: %s\n", error.what());
  }
  quarantine.clear();
  quarantine_may_hold.store(false, std::memory_order_relaxed);
  quarantined_bytes = quarantined_segment_bytes = quarantined_segments = 0;
}

}  // namespace cuemm
