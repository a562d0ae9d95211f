// The expandable pool: one range of addresses, mapped page by page.
#include <deque>

#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::HeldKernel;
using cuemm::testing::Pool;
using cuemm::testing::throws;

// The expandable pool on a device without virtual memory management: refused
// at initialize with an error that names the device, the option and what to
// use instead, and again at a request rather than a crash. The pool without
// it serves that device.
TEST_F(Pool, AnExpandablePoolOnADeviceWithoutVirtualMemoryIsRefusedWithAClearError) {
  CUEMM_REQUIRE_SIMULATION("made-up device attributes");
  const int device = context.device().id();
  const cuemm::testing::SimulatedDeviceAttribute lacking(
      device, cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
  PoolOptions options;
  options.expandable = true;
  PoolMemoryManager expandable(&context, options);
  EXPECT_TRUE(throws<CudaError>([&] { expandable.initialize(); }, "device " + std::to_string(device),
                                "no virtual memory management", "CUEMM_POOL_EXPANDABLE=1", "without it"));
  EXPECT_TRUE(throws<CudaError>([&] { expandable.memalloc(1 << 20); }, "no virtual memory management"));
  EXPECT_EQ(expandable.statistics().reserved_bytes, 0u);
  PoolMemoryManager pool(&context);
  pool.initialize();
  EXPECT_NE(pool.memalloc(1 << 20)->device_pointer(), 0u);
}

// Note [Expandable arena]: growth maps memory right after the free end, so a
// block too large for the free end alone spans it and the new memory.
TEST_F(Pool, AnExpandablePoolGrowsItsOneRangeByWhatIsMissing) {
  const PoolOptions options = arena_without_caches();
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto first = pool.memalloc(1536 << 10);
  const std::size_t reserved = pool.statistics().reserved_bytes;
  EXPECT_EQ(reserved, 2u << 20) << "grew by more than one 2 MiB page for 1.5 MiB";
  auto second = pool.memalloc(2 << 20);  // needs the free 0.5 MiB at the end and one more page
  auto values = std::vector<std::uint32_t>((2 << 20) / 4, 7u);
  DeviceArray<std::uint32_t>(second, values.size()).copy_to_device(values);
  EXPECT_EQ(DeviceArray<std::uint32_t>(second, values.size()).copy_to_host(), values);
  EXPECT_EQ(second->device_pointer(), first->device_pointer() + (1536 << 10));
  EXPECT_EQ(pool.statistics().segments, 1u);
  EXPECT_EQ(pool.statistics().reserved_bytes, 4u << 20);
  second.reset();
  EXPECT_EQ(pool.trim(), 2u << 20) << "the free end's whole mapping was not unmapped";
  first.reset();
  EXPECT_EQ(pool.trim(), 2u << 20);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
  auto again = pool.memalloc(4096);  // grows from nothing again
  EXPECT_EQ(pool.statistics().reserved_bytes, 2u << 20);
}

// A free end that begins exactly where a mapping begins goes whole, with the
// mappings under it (the random workload up to 64 MiB with 256 MiB live,
// seed 5, met this at a new peak and failed the allocation).
TEST_F(Pool, AnExpandablePoolGivesBackAFreeEndThatBeginsAtAMapping) {
  PoolOptions options;
  options.expandable = true;
  options.thread_cache_size = 0;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto first = pool.memalloc(2 << 20);   // the first mapping, whole
  auto second = pool.memalloc(2 << 20);  // the second
  second.reset();
  EXPECT_EQ(pool.trim(), 2u << 20);
  EXPECT_EQ(pool.statistics().reserved_bytes, 2u << 20);
  auto again = pool.memalloc(2 << 20);  // the arena grows again from there
  EXPECT_EQ(again->device_pointer(), first->device_pointer() + (2 << 20));
}

// Note [Expandable arena]: the handle of an arena block names the mappings
// under it (here two: the block spans the first mapping's end), each offered
// once as a descriptor. A segment of its own keeps the driver's handle.
TEST_F(Pool, AnExpandablePoolsHandleNamesTheMappingsUnderTheBlock) {
  const PoolOptions options = arena_without_caches();
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto first = pool.memalloc(1536 << 10);
  auto second = pool.memalloc(2 << 20);  // 0.5 MiB of the first mapping, 1.5 MiB of the next
  ASSERT_EQ(second->device_pointer(), first->device_pointer() + (1536 << 10));
  IpcHandle handle = pool.get_ipc_handle(second);
  EXPECT_FALSE(handle.has_driver_handle());
  ASSERT_TRUE(handle.mapped_export());
  const MappedExport& exported = *handle.mapped_export();
  EXPECT_EQ(exported.pid, getpid());
  ASSERT_EQ(exported.pieces.size(), 2u);
  EXPECT_EQ(exported.pieces[0].size, 2u << 20);
  EXPECT_EQ(exported.pieces[1].size, 2u << 20);
  EXPECT_NE(exported.pieces[0].token, exported.pieces[1].token);
  EXPECT_EQ(handle.offset(), 1536u << 10);
  EXPECT_EQ(handle.size(), 2u << 20);

  IpcHandle rebuilt = IpcHandle::from_bytes(handle.to_bytes());
  ASSERT_TRUE(rebuilt.mapped_export());
  EXPECT_EQ(rebuilt.mapped_export()->pid, exported.pid);
  ASSERT_EQ(rebuilt.mapped_export()->pieces.size(), 2u);
  EXPECT_EQ(rebuilt.mapped_export()->pieces[1].token, exported.pieces[1].token);
  EXPECT_EQ(rebuilt.offset(), handle.offset());
  EXPECT_THROW(rebuilt.open(context), StateError);  // this process exported it

  // A view inside the first mapping: one piece, offered once already.
  IpcHandle inner = pool.get_ipc_handle(first->view(4096, 8192));
  ASSERT_TRUE(inner.mapped_export());
  ASSERT_EQ(inner.mapped_export()->pieces.size(), 1u);
  EXPECT_EQ(inner.mapped_export()->pieces[0].token, exported.pieces[0].token);
  EXPECT_EQ(inner.offset(), 4096u);

  auto large = pool.memalloc(options.dedicated_size);  // a segment of its own: the driver's handle
  IpcHandle driver_handle = pool.get_ipc_handle(large);
  EXPECT_TRUE(driver_handle.has_driver_handle());
  EXPECT_EQ(driver_handle.offset(), 0u);
}

// Note [Pages given back]: a block that the free space cannot hold takes
// new pages past the peak only after the free pages are unmapped; pages
// unmapped under the free space are mapped again for a block that lands there.
TEST_F(Pool, AnExpandablePoolUnmapsFreePagesRatherThanPassItsPeak) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  for (const bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "within defer_cleanup()" : "unguarded");
    PoolMemoryManager pool(&context, arena_only());
    pool.initialize();
    auto first = pool.memalloc(8 * kMiB);
    auto second = pool.memalloc(2 * kMiB);
    ASSERT_EQ(pool.statistics().reserved_bytes, 10 * kMiB);
    first.reset();  // 8 MiB of mapped free space before `second`
    const std::size_t frees = pool.statistics().driver_frees;
    std::optional<CleanupGuard> guard;
    if (deferred) guard.emplace(pool.defer_cleanup());
    auto larger = pool.memalloc(10 * kMiB);  // past the end of the range
    if (deferred) {
      // Nothing goes back to the driver while cleanup is deferred.
      EXPECT_EQ(pool.statistics().reserved_bytes, 20 * kMiB);
      EXPECT_EQ(pool.statistics().driver_frees, frees);
      continue;
    }
    EXPECT_EQ(pool.statistics().reserved_bytes, 12 * kMiB) << "the free pages stayed mapped past the peak";
    EXPECT_EQ(pool.statistics().driver_frees, frees + 4);
    const std::vector<std::uint32_t> values(10 * kMiB / 4, 3u);
    DeviceArray<std::uint32_t>(larger, values.size()).copy_to_device(values);
    EXPECT_EQ(DeviceArray<std::uint32_t>(larger, values.size()).copy_to_host(), values);

    // The unmapped hole takes a block again: its pages are mapped for it.
    auto again = pool.memalloc(8 * kMiB);
    EXPECT_EQ(again->device_pointer(), second->device_pointer() - 8 * kMiB);
    EXPECT_EQ(pool.statistics().reserved_bytes, 20 * kMiB);
    const std::vector<std::uint32_t> more(8 * kMiB / 4, 9u);
    DeviceArray<std::uint32_t>(again, more.size()).copy_to_device(more);
    EXPECT_EQ(DeviceArray<std::uint32_t>(again, more.size()).copy_to_host(), more);
    {
      IpcHandle handle = pool.get_ipc_handle(again);  // (which keeps the block while it lives)
      ASSERT_TRUE(handle.mapped_export());
      EXPECT_EQ(handle.mapped_export()->pieces.size(), 4u);
    }

    // trim() unmaps every free page, inside the range as at its end.
    again.reset();
    EXPECT_EQ(pool.trim(), 8 * kMiB);
    EXPECT_EQ(pool.statistics().reserved_bytes, 12 * kMiB);
    // Every mapped byte is in a block now: the pool adds nothing to the
    // driver's free memory (its free addresses are no memory).
    std::size_t driver_free = 0, total = 0;
    CUEMM_CU(cuMemGetInfo, &driver_free, &total);
    EXPECT_EQ(pool.get_memory_info().free, driver_free);
  }
}

// A free block whose pages are mapped serves a request before the best
// fit whose pages are not: no driver call now, and no unmapping later.
TEST_F(Pool, AnExpandablePoolPrefersMappedFreeSpaceToUnmappedPages) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolMemoryManager pool(&context, arena_only());
  pool.initialize();
  auto first = pool.memalloc(8 * kMiB);
  auto second = pool.memalloc(2 * kMiB);
  first.reset();
  auto larger = pool.memalloc(10 * kMiB);  // first's pages are unmapped for it
  ASSERT_EQ(pool.statistics().reserved_bytes, 12 * kMiB);
  const cuda::CUdeviceptr mapped_free = larger->device_pointer();
  larger.reset();  // 10 MiB free and mapped; the 8 MiB hole is the best fit
  const std::size_t mappings = pool.statistics().driver_allocations;
  auto again = pool.memalloc(8 * kMiB);
  EXPECT_EQ(again->device_pointer(), mapped_free);
  EXPECT_EQ(pool.statistics().driver_allocations, mappings) << "mapped pages beside mapped free space";
  EXPECT_EQ(pool.statistics().reserved_bytes, 12 * kMiB);
}

TEST_F(Pool, AnExpandablePoolRefusesToShareWhatItHasNotMapped) {
  PoolOptions options;
  options.expandable = true;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto block = pool.memalloc(4096);
  // The block's start, but 1 GiB long: beyond what the arena has mapped.
  auto beyond = std::make_shared<MemoryPointer>(&context, block->device_pointer(), std::size_t{1} << 30);
  EXPECT_TRUE(
      throws<InvalidArgument>([&] { pool.get_ipc_handle(beyond); }, "is not mapped memory of the pool's arena"));
  // No bytes, just past the mapped end (the arena's first block is at its start).
  auto past_the_end = std::make_shared<MemoryPointer>(
      &context, block->device_pointer() + pool.statistics().reserved_bytes, std::size_t{0});
  EXPECT_THROW(pool.get_ipc_handle(past_the_end), InvalidArgument);
  IpcHandle still = pool.get_ipc_handle(block);  // and the pool still shares
  EXPECT_TRUE(still.mapped_export());
}

// Note [Assembled blocks]: at its peak, a block that no free space holds is
// made of the free end of one mapped page and the free start of another,
// mapped again at addresses of its own, rather than new pages; its pieces go
// back to the free space once it is freed.
TEST_F(Pool, AnAssemblingPoolMakesABlockOfTwoPagesFreeEndsRatherThanPassItsPeak) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolMemoryManager pool(&context, assembling_arena());
  pool.initialize();
  // Eight blocks of 1 MiB over four pages; the second and the fifth freed:
  // [1, 2) MiB is the free end of page 0, [4, 5) the free start of page 2.
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.memalloc(kMiB));
  const cuda::CUdeviceptr base = blocks[0]->device_pointer();
  for (int i = 1; i < 8; ++i) ASSERT_EQ(blocks[i]->device_pointer(), base + i * kMiB);
  for (int i = 0; i < 8; ++i)
    CUEMM_CU(cuMemsetD8, blocks[i]->device_pointer(), static_cast<unsigned char>(i + 1), kMiB);
  blocks[1].reset();
  blocks[4].reset();
  ASSERT_EQ(pool.statistics().reserved_bytes, 8 * kMiB);
  const std::size_t allocations = pool.statistics().driver_allocations;

  auto assembled = pool.memalloc(3 * kMiB / 2);
  EXPECT_EQ(pool.statistics().blocks_assembled, 1u);
  EXPECT_EQ(pool.statistics().reserved_bytes, 8 * kMiB) << "no new page";
  EXPECT_EQ(pool.statistics().driver_allocations, allocations);
  EXPECT_EQ(pool.statistics().in_use_bytes, 6 * kMiB + 3 * kMiB / 2);
  const cuda::CUdeviceptr at = assembled->device_pointer();
  EXPECT_TRUE(at < base || at >= base + 8 * kMiB) << "at addresses of its own";
  EXPECT_EQ(at % (2 * kMiB), kMiB) << "where the free end lies in its page";
  CUEMM_CU(cuMemsetD8, assembled->device_pointer(), 0x77, 3 * kMiB / 2);
  EXPECT_EQ(DeviceArray<std::uint8_t>(assembled, 3 * kMiB / 2).copy_to_host(),
            std::vector<std::uint8_t>(3 * kMiB / 2, 0x77));
  for (const int kept : {0, 2, 3, 5, 6, 7}) {
    EXPECT_EQ(DeviceArray<std::uint8_t>(blocks[kept], kMiB).copy_to_host(),
              std::vector<std::uint8_t>(kMiB, static_cast<std::uint8_t>(kept + 1)))
        << "block " << kept << " beside the pieces";
  }
  // Nothing else is placed on its pieces meanwhile: another block goes elsewhere.
  auto other = pool.memalloc(kMiB / 2);
  EXPECT_TRUE(other->device_pointer() + kMiB / 2 <= base + kMiB || other->device_pointer() >= base + 2 * kMiB)
      << "not on the tail [1, 2) MiB";
  EXPECT_TRUE(other->device_pointer() + kMiB / 2 <= base + 4 * kMiB ||
              other->device_pointer() >= base + 4 * kMiB + kMiB / 2)
      << "not on the head [4, 4.5) MiB";
  other.reset();
  {
    IpcHandle handle = pool.get_ipc_handle(assembled);
    ASSERT_TRUE(handle.mapped_export());
    EXPECT_EQ(handle.mapped_export()->pieces.size(), 2u);
    EXPECT_EQ(handle.offset(), kMiB);
  }

  // Freed, its pieces are free space again: both holes take a block of 1 MiB.
  assembled.reset();
  EXPECT_EQ(pool.trim(), 0u) << "the pages under its pieces hold other blocks";
  auto again = pool.memalloc(kMiB);
  auto and_again = pool.memalloc(kMiB);
  const std::set<cuda::CUdeviceptr> refilled{again->device_pointer(), and_again->device_pointer()};
  EXPECT_EQ(refilled, (std::set<cuda::CUdeviceptr>{base + kMiB, base + 4 * kMiB}));
  EXPECT_EQ(pool.statistics().in_use_bytes, 8 * kMiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, 8 * kMiB);
}

// Near its peak, an assembling pool places a request at its good fit, mapping
// the page that fit needs, where the expandable pool alone takes a larger
// free block whose pages are mapped: that larger hole's free ends are what
// later blocks are assembled from, and it stays whole for a request of its size.
TEST_F(Pool, AnAssemblingPoolNearItsPeakTakesTheGoodFitOverALargerMappedBlock) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  for (const bool assembling : {false, true}) {
    SCOPED_TRACE(assembling ? "assembling" : "expandable only");
    PoolMemoryManager pool(&context, assembling ? assembling_arena() : arena_only());
    pool.initialize();
    // [0, 5.5) [5.5, 8) [8, 9) [9, 12.5) [12.5, 14) MiB: seven pages, the peak.
    auto blocks = lay_out(pool, {11 * kMiB / 2, 5 * kMiB / 2, kMiB, 7 * kMiB / 2, 3 * kMiB / 2});
    const cuda::CUdeviceptr base = blocks[0]->device_pointer();
    ASSERT_EQ(pool.statistics().reserved_bytes, 14 * kMiB);
    blocks[1].reset();  // [5.5, 8): page 3, [6, 8), goes back to the driver
    pool.trim();
    ASSERT_EQ(pool.statistics().reserved_bytes, 12 * kMiB);
    blocks[3].reset();  // [9, 12.5): its pages stay mapped (they hold its neighbours too, and page 5 until a trim)
    CUEMM_CU(cuCtxSynchronize);
    auto placed = pool.memalloc(5 * kMiB / 2);
    if (assembling) {
      EXPECT_EQ(placed->device_pointer(), base + 11 * kMiB / 2) << "the good fit, its page mapped again";
      EXPECT_LE(pool.statistics().reserved_bytes, 14 * kMiB) << "within its peak";
      EXPECT_EQ(pool.statistics().blocks_assembled, 0u) << "no pair of free ends saves that page";
      auto whole = pool.memalloc(7 * kMiB / 2);
      EXPECT_EQ(whole->device_pointer(), base + 9 * kMiB) << "the larger hole stayed whole";
      EXPECT_EQ(pool.statistics().reserved_bytes, 14 * kMiB);
    } else {
      EXPECT_EQ(placed->device_pointer(), base + 9 * kMiB) << "a mapped block: no driver call";
      EXPECT_EQ(pool.statistics().reserved_bytes, 12 * kMiB);
    }
  }
}

// Near its peak the assembling pool takes the good fit or nothing, but where
// it would then wait for the GPU to reuse a freed block, a larger free block
// whose pages are mapped serves rather than the wait.
TEST_F(Pool, AnAssemblingPoolNearItsPeakTakesAMappedBlockRatherThanWaitForTheGpu) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options = assembling_arena();
  options.busy_overshoot = 0;  // at its peak, it would wait for freed blocks rather than grow
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  // [0, 5.5) [5.5, 8) [8, 9) [9, 11.75) [11.75, 14) [14, 17) [17, 18) MiB: nine pages, the peak.
  auto blocks = lay_out(pool, {11 * kMiB / 2, 5 * kMiB / 2, kMiB, 11 * kMiB / 4, 9 * kMiB / 4, 3 * kMiB, kMiB});
  const cuda::CUdeviceptr base = blocks[0]->device_pointer();
  blocks[1].reset();  // page 3, [6, 8), goes back to the driver: [5.5, 8) is the good fit of 2.5 MiB, unmapped
  pool.trim();
  blocks[3].reset();  // [9, 11.75): mapped (its pages hold its neighbours too), free once safe
  pool.trim();
  ASSERT_EQ(pool.statistics().reserved_bytes, 16 * kMiB);
  Stream stream = context.create_stream();  // (blocking: the pool's seals see its work)
  std::shared_ptr<MemoryPointer> placed;
  {
    HeldKernel kernel(context, stream, blocks[6]->device_pointer(), 1u, 32);
    blocks[5].reset();  // 3 MiB waiting for the kernel
    EXPECT_FALSE(kernel.waited_for_by([&] { placed = pool.memalloc(5 * kMiB / 2); }))
        << "the pool waited for the kernel";
  }
  EXPECT_EQ(placed->device_pointer(), base + 9 * kMiB) << "the mapped free block";
  EXPECT_EQ(pool.statistics().reserved_bytes, 16 * kMiB);
}

// Near its peak, before a large request maps pages, the requesting thread's
// safe cached blocks go back to the free space, where they may merge with a
// free neighbour into a block that holds the request.
TEST_F(Pool, AnAssemblingPoolNearItsPeakReturnsTheThreadsCachedBlocksBeforeMappingPages) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options = assembling_arena();
  options.thread_cache_size = PoolOptions{}.thread_cache_size;  // with the thread caches
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  // [0, 1) [1, 2.5) [2.5, 8) MiB: four pages, the peak.
  auto blocks = lay_out(pool, {kMiB, 3 * kMiB / 2, 11 * kMiB / 2});
  const cuda::CUdeviceptr base = blocks[0]->device_pointer();
  ASSERT_EQ(pool.statistics().reserved_bytes, 8 * kMiB);
  blocks[0].reset();  // a block of the size classes: into this thread's cache
  blocks[1].reset();
  CUEMM_CU(cuCtxSynchronize);
  ASSERT_GT(pool.statistics().cached_bytes, 0u);
  auto placed = pool.memalloc(5 * kMiB / 2);  // more than this thread caches
  EXPECT_EQ(placed->device_pointer(), base) << "the cached block and its free neighbour, merged";
  EXPECT_EQ(pool.statistics().reserved_bytes, 8 * kMiB) << "no page mapped";
  EXPECT_EQ(pool.statistics().blocks_assembled, 0u);
}

// Below its peak the pool maps pages for the best fit, as without the option.
TEST_F(Pool, AnAssemblingPoolAssemblesNothingBelowItsPeak) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolMemoryManager pool(&context, assembling_arena());
  pool.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.memalloc(kMiB));
  auto large = pool.memalloc(32 * kMiB);
  large.reset();  // the peak: 40 MiB
  pool.trim();
  blocks[1].reset();
  blocks[4].reset();
  auto placed = pool.memalloc(3 * kMiB / 2);
  EXPECT_EQ(pool.statistics().blocks_assembled, 0u);
  EXPECT_GE(placed->device_pointer(), blocks[0]->device_pointer());
  EXPECT_LT(placed->device_pointer(), blocks[0]->device_pointer() + 64 * kMiB) << "in the arena's range";
}

// Note [Rings set aside]: a thread whose requests keep missing its rings (a
// queue of random sizes freed oldest first) frees past them, so that the
// queue's freed neighbours merge into holes its next blocks fit; the rings
// come back once it has missed them long enough (here, in a loop of one
// size that keeps them again).
TEST_F(Pool, AnExpandablePoolSetsAsideTheRingsOfAThreadWhoseSizesVary) {
  PoolOptions options;
  options.expandable = true;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  const auto queue = workload::queue_operations(std::size_t{1} << 20, 200, 4000, 1);
  std::unordered_map<std::uint64_t, std::shared_ptr<MemoryPointer>> live;
  std::size_t live_bytes = 0, peak_live = 0, peak_reserved = 0, cached_before_the_last_frees = 0;
  for (std::size_t i = 0; i < queue.size(); ++i) {
    const workload::RandomOperation& operation = queue[i];
    if (operation.allocate) {
      live[operation.id] = pool.memalloc(operation.size);
      live_bytes += operation.size;
    } else {
      live.erase(operation.id);
      live_bytes -= operation.size;
    }
    peak_live = std::max(peak_live, live_bytes);
    peak_reserved = std::max(peak_reserved, pool.statistics().reserved_bytes);
    if (i + 200 == queue.size()) cached_before_the_last_frees = pool.statistics().cached_bytes;
  }
  EXPECT_LE(pool.statistics().cached_bytes, cached_before_the_last_frees)
      << "the queue's last 200 frees went into the thread's rings";
  // Simulated and on the H100, 1.04-1.05 (1.12 with the rings kept).
  EXPECT_LE(static_cast<double>(peak_reserved) / peak_live, 1.10)
      << "peak reserved " << peak_reserved << " over peak live " << peak_live;
  // A loop of one size misses the empty rings until they come back, then keeps them.
  for (int i = 0; i < 20000; ++i) pool.memalloc(64 << 10);
  EXPECT_GT(pool.statistics().cached_bytes, 0u) << "the rings did not come back for a loop of one size";
}

// Note [Own segments in the arena]: a block whose own segment would leave
// more than an eighth of it idle in its last 2 MiB page is packed into the
// arena beside its neighbour; one whose segment wastes less (any from 16 MiB
// up), or one of the pool without the arena, gets a segment of its own.
TEST_F(Pool, AnExpandablePoolPacksABlockThatItsOwnSegmentWouldRoundUpByMoreThanAnEighth) {
  constexpr std::size_t kMiB = 1 << 20, kOdd = 4 * kMiB + 256 * 1024;  // its own segment: 6 MiB
  PoolMemoryManager arena(&context, arena_without_caches());
  arena.initialize();
  auto first = arena.memalloc(kMiB);
  auto odd = arena.memalloc(kOdd);
  EXPECT_EQ(odd->device_pointer(), first->device_pointer() + kMiB) << "not packed beside its neighbour";
  EXPECT_EQ(arena.statistics().segments, 1u);
  EXPECT_EQ(arena.statistics().reserved_bytes, 6 * kMiB) << "the pages under 5.25 MiB";
  auto large = arena.memalloc(20 * kMiB + 256 * 1024);  // its own 22 MiB: 1.75 MiB idle, under an eighth
  EXPECT_EQ(arena.statistics().segments, 2u);
  EXPECT_EQ(arena.statistics().reserved_bytes, 28 * kMiB);
  auto round = arena.memalloc(4 * kMiB);  // no idle end
  EXPECT_EQ(arena.statistics().segments, 3u);
  // Every block keeps its bytes.
  for (auto* block : {&first, &odd, &large, &round}) {
    const std::size_t words = (*block)->size() / 4;
    const auto values = std::vector<std::uint32_t>(words, static_cast<std::uint32_t>(words));
    DeviceArray<std::uint32_t>(*block, words).copy_to_device(values);
    EXPECT_EQ(DeviceArray<std::uint32_t>(*block, words).copy_to_host(), values);
  }

  PoolOptions options;
  options.thread_cache_size = 0;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto small = pool.memalloc(kMiB);
  const std::size_t segments = pool.statistics().segments;
  auto own = pool.memalloc(kOdd);
  EXPECT_EQ(pool.statistics().segments, segments + 1) << "the pool without the arena packed it";
}

// Note [A quarantine kept small], with the rings set aside (Note [Rings set
// aside]): a thread whose queue of varied sizes keeps missing its rings
// frees each block alone into the quarantine, which goes back to the index
// once it holds a 64th of the pool, so the freed neighbours merge.
TEST_F(Pool, AThreadWhoseRingsAreSetAsideKeepsTheQuarantineSmall) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  PoolOptions options;
  options.expandable = true;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  std::mt19937 random(3);
  std::uniform_int_distribution<std::size_t> size_of(1, kMiB);
  std::deque<std::pair<cuda::CUdeviceptr, std::size_t>> queue;  // freed oldest first
  std::size_t most_waiting = 0, reserved_then = 0;
  for (int step = 0; step < 6000; ++step) {
    const std::size_t size = size_of(random);
    queue.emplace_back(pool.allocate(size), size);
    if (queue.size() < 200) continue;
    if (step % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(5));  // (seals are due)
    pool.deallocate(queue.front().first, queue.front().second);
    queue.pop_front();
    if (step < 3000) continue;  // the rings set aside by then
    const PoolStatistics statistics = pool.statistics();
    if (statistics.quarantined_bytes > most_waiting) {
      most_waiting = statistics.quarantined_bytes;
      reserved_then = statistics.reserved_bytes;
    }
  }
  EXPECT_LE(most_waiting, reserved_then / 64 + 8 * kMiB)
      << "reserved " << reserved_then << ": an eighth would be " << reserved_then / 8;
  for (const auto& [block, size] : queue) pool.deallocate(block, size);
}
