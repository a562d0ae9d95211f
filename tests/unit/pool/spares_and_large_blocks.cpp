// Large blocks: segments of their own, their spares, and the shared segments'
// free space at the pool's peak; IPC of blocks inside segments.
#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::Pool;

// Spares and shared segments left empty go back before the pool's footprint
// passes its peak: the peak of a program whose sizes change (a training
// step's activations, then its gradients) is not the sum of its phases.
TEST_F(Pool, SparesAndEmptySegmentsGoBackBeforeTheFootprintPassesItsPeak) {
  PoolMemoryManager pool(&context, with_thread_cache(0));  // (a thread's cache keeps what it frees)
  pool.initialize();
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  auto phase = [&](std::size_t size, int count) {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(pool.memalloc(size));
  };
  phase(8 * kMiB, 6);      // 48 MiB in segments of their own, then spares
  phase(2 * kMiB, 24);     // 48 MiB in shared segments, then free
  phase(16 * kMiB, 3);     // 48 MiB again, in other sizes
  EXPECT_LE(pool.statistics().reserved_bytes, 64 * kMiB)
      << "the pool kept the first phases' memory idle beside the last one's";
}

// Small and shared segments do not peak apart: before one kind grows past
// the pool's peak, the other kind's entirely free segments go back, both ways.
TEST_F(Pool, SegmentsOfOneKindLeftFreeGoBackBeforeTheOtherKindGrowsPastThePeak) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolMemoryManager pool(&context, with_thread_cache(0));  // (a thread's cache keeps what it frees)
  pool.initialize();
  auto phase = [&](std::size_t size, int count) {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(pool.memalloc(size));
  };
  phase(kMiB, 16);  // 16 MiB of small blocks in small segments, then free
  const std::size_t peak = pool.statistics().reserved_bytes;
  ASSERT_GE(peak, 16 * kMiB);
  phase(3 * kMiB / 2, 10);  // 15 MiB in shared segments (not a class's size)
  EXPECT_LE(pool.statistics().reserved_bytes, peak + 2 * kMiB)
      << "the shared segments grew beside the small ones left free";
  const std::size_t shared_peak = pool.statistics().reserved_bytes;
  phase(kMiB, 16);  // and back
  EXPECT_LE(pool.statistics().reserved_bytes, shared_peak + 2 * kMiB)
      << "the small segments grew beside the shared ones left free";
  EXPECT_GT(pool.statistics().driver_frees, 0u);
}

// The shared segments, about to grow past the pool's peak, take over a spare
// segment of its own instead: memory the pool holds anyway, and no driver
// call. The blocks placed in it are ordinary blocks of a shared segment:
// their IPC handles carry their offset, and the segment goes back once empty.
TEST_F(Pool, AtItsPeakASpareSegmentBecomesASharedOneRatherThanThePoolGrow) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolMemoryManager pool(&context, with_thread_cache(0));  // (a thread's cache keeps what it frees)
  pool.initialize();
  auto large = pool.memalloc(6 * kMiB);  // a segment of its own: the pool's peak
  const cuda::CUdeviceptr spare = large->device_pointer();
  large.reset();
  ASSERT_EQ(pool.statistics().reserved_bytes, 6 * kMiB);
  ASSERT_EQ(pool.statistics().driver_allocations, 1u);

  // Shared segments grow by at least 6 MiB for requests of 1.5 MiB.
  auto first = pool.memalloc(3 * kMiB / 2);
  auto second = pool.memalloc(5 * kMiB / 4);  // (not a class's: Note [Small blocks apart])
  EXPECT_EQ(first->device_pointer(), spare) << "not placed in the spare";
  EXPECT_EQ(pool.statistics().reserved_bytes, 6 * kMiB) << "the pool grew beside its spare";
  EXPECT_EQ(pool.statistics().driver_allocations, 1u);
  EXPECT_EQ(pool.statistics().spares_taken_over, 1u);
  EXPECT_EQ(pool.get_ipc_handle(first).offset(), 0u);
  EXPECT_EQ(pool.get_ipc_handle(second).offset(), second->device_pointer() - spare);
  EXPECT_GE(pool.get_ipc_handle(second).offset(), 3 * kMiB / 2);
  const std::vector<std::uint8_t> values(kMiB, 9);
  DeviceArray<std::uint8_t> array(second, values.size());
  array.copy_to_device(values);
  EXPECT_EQ(array.copy_to_host(), values);

  array = DeviceArray<std::uint8_t>();
  first.reset();
  second.reset();
  EXPECT_EQ(pool.trim(), 6 * kMiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
  EXPECT_EQ(pool.statistics().driver_frees, 1u);
}

TEST_F(Pool, ALargeRequestUsesFreeSpaceOfTheSharedSegmentsRatherThanPassThePeak) {
  for (const bool expandable : {false, true}) {
    SCOPED_TRACE(expandable ? "expandable" : "segments");
    uses_free_space_of_the_shared_segments(expandable);
  }
}

void Pool::uses_free_space_of_the_shared_segments(bool expandable) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options;
  options.initial_size = 64 * kMiB;  // one shared segment (or the arena's first 64 MiB)
  options.expandable = expandable;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  // The segment full of 2 MiB blocks; then all but its first and last are
  // freed (into this thread's cache, the rest into the index): 60 MiB free
  // in a segment that cannot go back.
  std::vector<std::shared_ptr<MemoryPointer>> small;
  while (pool.statistics().reserved_bytes == 64 * kMiB && small.size() < 32) small.push_back(pool.memalloc(2 * kMiB));
  ASSERT_EQ(small.size(), 32u) << "the initial segment did not hold 32 blocks of 2 MiB";
  ASSERT_EQ(pool.statistics().reserved_bytes, 64 * kMiB);
  for (std::size_t i = 1; i + 1 < small.size(); ++i) small[i].reset();

  // A request for a segment of its own would take the pool to 72 MiB.
  auto large = pool.memalloc(8 * kMiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, 64 * kMiB) << "the pool grew beside 60 MiB of free space";
  // (An arena block's handle names the arena's pages, not a segment's driver handle.)
  const IpcHandle handle = pool.get_ipc_handle(large);
  if (expandable) {
    EXPECT_FALSE(handle.has_driver_handle()) << "not a block of the arena";
  } else {
    EXPECT_GT(handle.offset(), 0u) << "not a block of the shared segment";
  }
  const std::vector<std::uint8_t> values(8 * kMiB, 5);
  DeviceArray<std::uint8_t> array(large, values.size());
  array.copy_to_device(values);
  EXPECT_EQ(array.copy_to_host(), values);

  // Freed, it goes back to the index rather than stay with the thread,
  // where requests for segments of their own do not look.
  const std::size_t cached = pool.statistics().cached_bytes;
  array = DeviceArray<std::uint8_t>();
  large.reset();
  EXPECT_LT(pool.statistics().cached_bytes, cached + 8 * kMiB) << "the thread kept the block";
  auto again = pool.memalloc(8 * kMiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, 64 * kMiB);
  again.reset();

  // A loop of such requests is another matter: were its blocks from the
  // index, each would go back there at its free, and the loop would seal at
  // every request rather than rotate through blocks it holds.
  pairs(pool, 8 * kMiB, 3000);
  const std::size_t seals = pool.statistics().seals;
  pairs(pool, 8 * kMiB, 2000);
  EXPECT_LE(pool.statistics().seals - seals, 2000u / 4) << "a seal for most requests of the loop";
}

TEST_F(Pool, IpcHandlesOfBlocksCarryTheirOffsetInTheSegment) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  auto first = pool.memalloc(4096);
  auto second = pool.memalloc(8192);
  IpcHandle handle = pool.get_ipc_handle(second);
  EXPECT_EQ(handle.offset(), second->device_pointer() - first->device_pointer());
  EXPECT_EQ(handle.size(), 8192u);
}

TEST_F(Pool, ALargeBlockHasASegmentOfItsOwnWhoseSpareIsReused) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  auto large = pool.memalloc((40 << 20) + 1);
  EXPECT_EQ(pool.statistics().reserved_bytes, std::size_t{42} << 20) << "rounded to the driver's 2 MiB pages";
  EXPECT_EQ(pool.get_ipc_handle(large).offset(), 0u);
  const cuda::CUdeviceptr address = large->device_pointer();
  large.reset();
  auto again = pool.memalloc(39 << 20);  // fits the 42 MiB spare (at most 1/8 over its 40 MiB)
  EXPECT_EQ(again->device_pointer(), address) << "the spare was not reused";
  EXPECT_EQ(pool.statistics().reserved_bytes, std::size_t{42} << 20);
  EXPECT_EQ(pool.statistics().in_use_bytes, std::size_t{42} << 20);
  const std::vector<std::uint8_t> values(39 << 20, 7);
  DeviceArray<std::uint8_t> array(again, values.size());
  array.copy_to_device(values);
  EXPECT_EQ(array.copy_to_host(), values);
}

// Below its peak footprint the pool keeps its spares: a program whose large
// sizes recur (a training step's activations, then a gradient of another
// size) finds them again at the next step rather than calling the driver.
TEST_F(Pool, BelowItsPeakSparesStayForTheSizesThatComeAgain) {
  PoolOptions options;
  options.thread_cache_size = 0;  // (frees go to the spares, not to a thread's held blocks)
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  pool.memalloc(std::size_t{200} << 20).reset();
  pool.trim();  // the peak stays: 200 MiB
  ASSERT_EQ(pool.statistics().reserved_bytes, 0u);
  std::size_t allocations_after_first_step = 0, frees_after_first_step = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<std::shared_ptr<MemoryPointer>> activations;
    for (std::size_t mib : {8, 10, 12, 14}) activations.push_back(pool.memalloc(mib << 20));
    activations.clear();
    pool.memalloc(std::size_t{16} << 20).reset();  // a size of its own, while the others are spares
    if (step == 0) {
      allocations_after_first_step = pool.statistics().driver_allocations;
      frees_after_first_step = pool.statistics().driver_frees;
    }
  }
  EXPECT_EQ(pool.statistics().driver_allocations, allocations_after_first_step)
      << "later steps found no spares of their sizes";
  EXPECT_EQ(pool.statistics().driver_frees, frees_after_first_step);
  EXPECT_LE(pool.statistics().reserved_bytes, std::size_t{200} << 20) << "the spares took the pool past its peak";
}

// A thread keeps the large blocks it frees for its next requests of their
// sizes; at the pool's peak, a request of another size that would otherwise
// take a new segment merges them instead (a training step's layers each free
// a gradient and a scratch block of sizes of their own).
TEST_F(Pool, AtItsPeakAThreadsHeldBlocksMergeForAnotherSize) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  constexpr std::size_t kHeld = std::size_t{3} << 19;  // 1.5 MiB: above the classes, in the index
  std::vector<std::shared_ptr<MemoryPointer>> held;
  for (int i = 0; i < 4; ++i) held.push_back(pool.memalloc(kHeld));
  const PoolStatistics before = pool.statistics();
  held.clear();  // the thread holds them now
  ASSERT_GE(pool.statistics().cached_bytes, 4 * kHeld) << "the thread did not hold its large blocks";
  auto other = pool.memalloc(std::size_t{5} << 19);  // 2.5 MiB: no held block fits it
  const PoolStatistics after = pool.statistics();
  EXPECT_EQ(after.driver_allocations, before.driver_allocations) << "the pool grew while 6 MiB sat held";
  EXPECT_EQ(after.cached_bytes, 0u) << "the thread still holds blocks";
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.in_use_bytes, other->size());
  other.reset();
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
}

// A training step whose phases hold different large sizes: with
// split_spares, the sizes that recur are carved from the other phase's
// spares at the peak, so later steps call the driver no more (without it,
// each phase gives the other's spares back and buys its own again). The
// carved blocks hold their contents, their IPC handles carry their offset,
// and trim gives everything back.
TEST_F(Pool, WithSplitSparesATrainingLoopStopsCallingTheDriver) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options;
  options.split_spares = true;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  // (The second phase's two blocks fit in the first one's segment.)
  const std::vector<std::vector<std::size_t>> phases = {{20 * kMiB + 4352, 6 * kMiB + 256},
                                                        {9 * kMiB + 512, 10 * kMiB + 2816, 7 * kMiB + 1024}};
  std::size_t allocations = 0, frees = 0;
  bool an_offset_seen = false;
  for (int step = 0; step < 8; ++step) {
    if (step == 3) {
      allocations = pool.statistics().driver_allocations;
      frees = pool.statistics().driver_frees;
    }
    for (const auto& sizes : phases) {
      std::vector<std::shared_ptr<MemoryPointer>> live;
      std::vector<std::vector<std::uint8_t>> written;
      for (std::size_t size : sizes) {
        live.push_back(pool.memalloc(size));
        written.emplace_back(size, static_cast<std::uint8_t>(step * 7 + live.size()));
        DeviceArray<std::uint8_t>(live.back(), size).copy_to_device(written.back());
        an_offset_seen = an_offset_seen || pool.get_ipc_handle(live.back()).offset() != 0;
      }
      for (std::size_t i = 0; i < live.size(); ++i)
        EXPECT_EQ(DeviceArray<std::uint8_t>(live[i], sizes[i]).copy_to_host(), written[i]) << "step " << step;
    }
  }
  EXPECT_EQ(pool.statistics().driver_allocations, allocations) << "later steps still bought segments";
  EXPECT_EQ(pool.statistics().driver_frees, frees) << "later steps still gave segments back";
  EXPECT_TRUE(an_offset_seen) << "no block was carved from a spare";
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  const std::size_t reserved = pool.statistics().reserved_bytes;
  EXPECT_EQ(pool.trim(), reserved);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
}

// At its peak, spares go back before the driver is asked for more.
TEST_F(Pool, SparesAreGivenBackBeforeTheDriverIsAskedForMore) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (std::size_t i = 1; i <= 8; ++i) blocks.push_back(pool.memalloc(i * (10 << 20)));
  }
  EXPECT_EQ(pool.statistics().reserved_bytes, std::size_t{360} << 20);
  auto block = pool.memalloc(100 << 20);  // no spare fits: the spares go before a new segment comes
  const PoolStatistics statistics = pool.statistics();
  // (The last frees may still wait for their epoch's event: those are not spares yet.)
  const std::size_t spare_bytes =
      statistics.reserved_bytes - statistics.in_use_bytes - statistics.quarantined_bytes - statistics.cached_bytes;
  EXPECT_LE(spare_bytes, statistics.reserved_bytes / 32) << "spare segments were kept beyond 1/32 of the pool";
  block.reset();
  EXPECT_EQ(pool.trim(), statistics.reserved_bytes) << "trim gives the spares back";
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
}
