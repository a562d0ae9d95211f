// Statistics, memory info, trim, the maximum and initial sizes, and the options
// from the environment.
#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::caught;
using cuemm::testing::Pool;
using cuemm::testing::ScopedVariable;
using cuemm::testing::throws;

// PoolStatistics counts the driver calls that took memory and gave it back
// (what explains a slow workload: large sizes that vary find no spare), on
// either driver, for shared segments, segments of their own and the
// expandable arena alike.
TEST_F(Pool, ItsStatisticsCountTheDriverCallsThatTookAndGaveBackMemory) {
  in_both_layouts(PoolOptions{}, [&](PoolMemoryManager& pool) {
    if (simulation::active()) simulation::reset_call_counts();
    std::mt19937 random(7);
    std::uniform_int_distribution<std::size_t> size(1, 24 << 20);
    std::vector<std::shared_ptr<MemoryPointer>> live;
    for (int i = 0; i < 400; ++i) {
      if (live.size() < 8 || random() % 2) {
        live.push_back(pool.memalloc(size(random)));
      } else {
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(random() % live.size()));
      }
    }
    const PoolStatistics busy = pool.statistics();
    EXPECT_GT(busy.driver_allocations, 2u) << "large blocks of varying sizes found spares every time";
    if (!pool.options().expandable) {
      EXPECT_EQ(busy.driver_allocations - busy.driver_frees, busy.segments) << "one cuMemAlloc a segment";
    }
    live.clear();
    pool.trim();
    const PoolStatistics trimmed = pool.statistics();
    EXPECT_EQ(trimmed.reserved_bytes, 0u);
    EXPECT_EQ(trimmed.driver_allocations, busy.driver_allocations) << "trim took memory";
    EXPECT_EQ(trimmed.driver_frees, trimmed.driver_allocations) << "trim gave back all the pool had taken";
    if (simulation::active()) {
      EXPECT_EQ(trimmed.driver_allocations, simulation::call_count("cuMemAlloc") + simulation::call_count("cuMemCreate"));
      EXPECT_EQ(trimmed.driver_frees, simulation::call_count("cuMemFree") + simulation::call_count("cuMemRelease"));
    }
  });
}

// For programs that open a raw IPC handle and ignore its offset (numba-cuda's
// TestIpcMemory.test_ipc_handle does): every block in a segment of its own.
TEST_F(Pool, WithDedicatedSizeZeroEveryIpcHandleHasOffsetZero) {
  PoolOptions options;
  options.dedicated_size = 0;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (std::size_t size : {80u, 4096u, 100000u, 3u << 20}) {
    blocks.push_back(pool.memalloc(size));
    EXPECT_EQ(pool.get_ipc_handle(blocks.back()).offset(), 0u) << size << " bytes";
  }
  EXPECT_EQ(pool.statistics().segments, 4u);
  const cuda::CUdeviceptr first = blocks.front()->device_pointer();
  blocks.clear();
  auto again = pool.memalloc(80);
  EXPECT_EQ(again->device_pointer(), first) << "the spare segment was not reused";
  {
    ScopedVariable dedicated("CUEMM_POOL_DEDICATED_SIZE", "0");
    EXPECT_EQ(PoolOptions::from_environment().dedicated_size, 0u);
  }
  ScopedVariable unset("CUEMM_POOL_DEDICATED_SIZE", nullptr);
  EXPECT_EQ(PoolOptions::from_environment().dedicated_size, std::size_t{4} << 20);
}

TEST_F(Pool, MemoryInfoCountsThePoolsFreeBytes) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  auto block = pool.memalloc(1 << 20);
  const MemoryInfo driver = context.get_memory_info();  // the context's own manager asks the driver
  const MemoryInfo info = pool.get_memory_info();
  EXPECT_EQ(info.total, driver.total);
  EXPECT_GE(info.free + (1 << 20), driver.free) << "the pool's free space is missing";
}

// Under a maximum, memory info is what the maximum leaves: a program that
// sizes its work by it (Numba's get_memory_info) must not plan for the device.
TEST_F(Pool, MemoryInfoUnderAMaximumIsWhatTheMaximumLeaves) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options;
  options.maximum_size = 64 * kMiB;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  ASSERT_GT(context.get_memory_info().total, 64 * kMiB);
  EXPECT_EQ(pool.get_memory_info().total, 64 * kMiB);
  EXPECT_EQ(pool.get_memory_info().free, 64 * kMiB);
  auto held = pool.memalloc(40 * kMiB);
  const std::size_t free = pool.get_memory_info().free;
  EXPECT_LE(free, 24 * kMiB);
  EXPECT_GE(free, 20 * kMiB) << "the pool's own free bytes within the maximum are missing";
  EXPECT_NO_THROW(pool.memalloc(free / 2));
  held.reset();
  pool.trim();
  EXPECT_EQ(pool.get_memory_info().free, 64 * kMiB);
}

TEST_F(Pool, TrimReturnsEmptySegmentsButNotUnderDeferCleanup) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  pool.memalloc(100 << 20).reset();
  EXPECT_GE(pool.statistics().reserved_bytes, 100u << 20);
  {
    auto guard = pool.defer_cleanup();
    EXPECT_EQ(pool.trim(), 0u);
  }
  EXPECT_GE(pool.trim(), 100u << 20);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
  EXPECT_EQ(pool.statistics().segments, 0u);
}

TEST_F(Pool, TheMaximumSizeIsAnOutOfMemoryNamingIt) {
  PoolOptions options;
  options.maximum_size = 64 << 20;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto held = pool.memalloc(40 << 20);
  const auto error = caught<OutOfMemory>([&] { pool.memalloc(40 << 20); });
  ASSERT_TRUE(error) << "allocated past the maximum";
  EXPECT_NE(std::string(error->what()).find("maximum 64.00 MiB"), std::string::npos) << error->what();
  EXPECT_EQ(error->requested(), std::size_t{40} << 20);
  held.reset();
  EXPECT_NO_THROW(pool.memalloc(40 << 20)) << "the freed block did not come back";
}

// Out of memory with free bytes in the pool says how they lie: a request
// larger than every hole is fragmentation, not a full device.
TEST_F(Pool, OutOfMemoryAtTheMaximumSaysWhereThePoolsFreeBytesLie) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options;
  options.maximum_size = 16 * kMiB;
  options.thread_cache_size = 0;                      // frees go back to the index at once
  options.dedicated_size = std::size_t{1} << 40;      // every block in the shared segments
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.memalloc(2 * kMiB));
  ASSERT_EQ(pool.statistics().reserved_bytes, 16 * kMiB);
  for (int i = 0; i < 8; i += 2) blocks[i].reset();  // four 2 MiB holes between held blocks
  const auto error = caught<OutOfMemory>([&] { pool.memalloc(4 * kMiB); });
  ASSERT_TRUE(error) << "a 4 MiB block fit in 2 MiB holes";
  const std::string what = error->what();
  for (const char* part : {"8.00 MiB (8388608 bytes) in use", "8.00 MiB (8388608 bytes) free in 4 block(s)",
                           "the largest 2.00 MiB", "maximum 16.00 MiB", "the device has "})
    EXPECT_NE(what.find(part), std::string::npos) << "no '" << part << "' in: " << what;
  EXPECT_NO_THROW(pool.memalloc(2 * kMiB)) << "a hole did not serve its size after the failure";
}

// Through every interface and in either layout, with segments of their own
// for large blocks or every block in the shared segments (or the arena),
// sizes whose rounding would wrap past 2^64 are out of memory that names
// them, and nothing is held after.
TEST_F(Pool, SizesNearTwoToThe64AreOutOfMemoryInEveryInterface) {
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  PoolOptions all_shared;
  all_shared.dedicated_size = max;
  for (const PoolOptions& options : {PoolOptions{}, all_shared}) {
    in_both_layouts(options, [&](PoolMemoryManager& pool) {
      for (const std::size_t size : {max, max - 255, max - (std::size_t{2} << 20), std::size_t{1} << 63}) {
        SCOPED_TRACE(size);
        const std::vector<std::function<void()>> calls = {
            [&] { pool.allocate(size); }, [&] { pool.allocate(size, cuda::CU_STREAM_PER_THREAD); },
            [&] { pool.memalloc(size); }};
        for (const auto& call : calls) {
          const auto error = caught<OutOfMemory>(call);
          ASSERT_TRUE(error);
          EXPECT_EQ(error->requested(), size);
        }
      }
      EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
      const cuda::CUdeviceptr block = pool.allocate(4096);
      pool.deallocate(block, 4096);
    });
  }
}

// At its maximum, a pool serves a request from a free block that fits it
// even when the index's good fit would look only at larger blocks (Note
// [Two-level segregated fit]).
TEST_F(Pool, AtItsMaximumAPoolUsesAFreeBlockThatJustFits) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  PoolOptions options;
  options.maximum_size = 4 * kMiB;  // one segment
  options.thread_cache_size = 0;    // every free goes back to the index
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto a = pool.memalloc(2 * kMiB + 576 * kKiB);
  // Keeps a's block from merging with the free rest. A class's block, it
  // comes from the shared segment's free space: the maximum leaves no room
  // for a small segment (Note [Small blocks apart]).
  auto b = pool.memalloc(1 * kMiB);
  EXPECT_EQ(pool.statistics().segments, 1u);
  a.reset();
  EXPECT_NO_THROW(a = pool.memalloc(2 * kMiB + 544 * kKiB)) << "the freed block fits, yet the pool was out of memory";
  EXPECT_EQ(pool.statistics().reserved_bytes, 4 * kMiB);
}

// Growth asks for slack when there is room for it, but needs none: one
// block may take all of a pool's maximum, in either kind of pool.
TEST_F(Pool, OneBlockMayTakeAllOfThePoolsMaximum) {
  PoolOptions options;
  options.maximum_size = std::size_t{4} << 20;
  in_both_layouts(options, [&](PoolMemoryManager& pool) {
    for (const std::size_t size : {std::size_t{3900} << 10, std::size_t{4} << 20}) {
      EXPECT_NO_THROW(pool.memalloc(size)) << size << " bytes";
      EXPECT_EQ(pool.statistics().reserved_bytes, std::size_t{4} << 20);
    }
  });
}

// At its maximum, an expandable pool maps a block's pages beyond its free
// space once the free pages are unmapped (Note [Pages given back]), and
// names the maximum when even that leaves no room.
TEST_F(Pool, AnExpandablePoolAtItsMaximumUnmapsFreePagesForABlockElsewhere) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options = arena_only();
  options.maximum_size = 8 * kMiB;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  auto first = pool.memalloc(4 * kMiB);
  auto second = pool.memalloc(2 * kMiB);
  first.reset();  // a 4 MiB hole that a 6 MiB block does not fit
  std::shared_ptr<MemoryPointer> larger;
  EXPECT_NO_THROW(larger = pool.memalloc(6 * kMiB)) << "the free pages were not given back at the maximum";
  EXPECT_EQ(pool.statistics().reserved_bytes, 8 * kMiB);
  const auto error = caught<OutOfMemory>([&] { pool.memalloc(2 * kMiB); });
  ASSERT_TRUE(error) << "mapped past the maximum";
  EXPECT_NE(std::string(error->what()).find("maximum 8.00 MiB"), std::string::npos) << error->what();
  larger.reset();
  EXPECT_NO_THROW(pool.memalloc(4 * kMiB)) << "the pool did not recover";
}

TEST_F(Pool, AMaximumBelowOneSegmentIsRefusedAtOnce) {
  PoolOptions options;
  options.maximum_size = 1 << 20;
  EXPECT_TRUE(throws<InvalidArgument>([&] { PoolMemoryManager pool(&context, options); },
                                      "the maximum size (1.00 MiB (1048576 bytes)) is less than one segment"));
}

// Assembled blocks are made of the arena's pages: without it the option
// would do nothing, so it is refused rather than ignored.
TEST_F(Pool, AssembledBlocksWithoutTheExpandablePoolAreRefused) {
  PoolOptions options;
  options.assemble_blocks = true;
  EXPECT_TRUE(throws<InvalidArgument>([&] { PoolMemoryManager pool(&context, options); },
                                      "assembled blocks (CUEMM_POOL_ASSEMBLE_BLOCKS=1)"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { options.check(); }, "the pool is not expandable"));
  options.expandable = true;
  EXPECT_NO_THROW(options.check());
}

TEST_F(Pool, AnInitialSizeIsReservedAtInitialize) {
  PoolOptions options;
  options.initial_size = 96 << 20;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  EXPECT_GE(pool.statistics().reserved_bytes, 96u << 20);
  PoolOptions bad;
  bad.initial_size = 4 << 20;
  bad.maximum_size = 2 << 20;
  EXPECT_THROW(PoolMemoryManager(&context, bad), InvalidArgument);
}

// An initial size no device holds, up to one whose rounding to pages would
// wrap past 2^64, fails initialize() as out of memory naming it, in either
// layout, and leaves nothing reserved.
TEST_F(Pool, AnInitialSizeNoDeviceHoldsIsOutOfMemoryAtInitialize) {
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  const std::size_t total = context.get_memory_info().total;
  for (const std::size_t size : {total + (std::size_t{2} << 20), std::size_t{1} << 63, max - 255, max}) {
    for (const bool expandable : {false, true}) {
      SCOPED_TRACE(std::to_string(size) + (expandable ? " expandable" : " segments"));
      PoolOptions options;
      options.initial_size = size;
      options.expandable = expandable;
      PoolMemoryManager pool(&context, options);
      const auto error = caught<OutOfMemory>([&] { pool.initialize(); });
      ASSERT_TRUE(error);
      EXPECT_EQ(error->requested(), size);
      EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
    }
  }
}

// The memory reserved up front serves every size: small segments are carved
// from the initial segment while it has room (Note [Small blocks apart]), and
// go back to it once free, so that trim() returns it whole.
TEST_F(Pool, AnInitialSizeServesSmallBlocksToo) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options;
  options.initial_size = 16 * kMiB;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  ASSERT_EQ(pool.statistics().driver_allocations, 1u);
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.memalloc(300 << 10));  // classes' blocks: 2.6 MiB
  for (int i = 0; i < 2; ++i) blocks.push_back(pool.memalloc(3 * kMiB));
  const PoolStatistics full = pool.statistics();
  EXPECT_EQ(full.driver_allocations, 1u) << "the initial segment had room";
  EXPECT_EQ(full.reserved_bytes, 16 * kMiB);
  EXPECT_EQ(full.segments, 1u);
  EXPECT_EQ(full.in_use_bytes, 8 * detail::size_class_bytes(detail::size_class_of(300 << 10)) + 6 * kMiB);
  std::set<cuda::CUdeviceptr> distinct;
  for (const auto& block : blocks) distinct.insert(block->device_pointer());
  EXPECT_EQ(distinct.size(), blocks.size());
  const MemoryInfo info = pool.get_memory_info();
  EXPECT_GE(info.free, 16 * kMiB - full.in_use_bytes) << "the pool's free bytes are missing";
  blocks.clear();
  EXPECT_EQ(pool.trim(), 16 * kMiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  EXPECT_EQ(pool.statistics().driver_frees, 1u);
  // Grown again, small blocks have segments of their own.
  auto small = pool.memalloc(300 << 10);
  EXPECT_EQ(pool.statistics().reserved_bytes, PoolMemoryManager::kSegmentGranularity);
}

TEST_F(Pool, SizesFromTheEnvironmentAreParsed) {
  {
    ScopedVariable initial("CUEMM_POOL_INITIAL_SIZE", "512M");
    {
      ScopedVariable maximum("CUEMM_POOL_MAXIMUM_SIZE", "2GiB");
      const PoolOptions options = PoolOptions::from_environment();
      EXPECT_EQ(options.initial_size, std::size_t{512} << 20);
      EXPECT_EQ(options.maximum_size, std::size_t{2} << 30);
    }
    ScopedVariable bad("CUEMM_POOL_MAXIMUM_SIZE", "lots");
    EXPECT_TRUE(throws<InvalidArgument>([&] { PoolOptions::from_environment(); }, "CUEMM_POOL_MAXIMUM_SIZE"));
  }
  {
    ScopedVariable unset("CUEMM_POOL_EXPANDABLE", nullptr);
    EXPECT_FALSE(PoolOptions::from_environment().expandable);
  }
  {
    ScopedVariable expandable("CUEMM_POOL_EXPANDABLE", "1");
    EXPECT_TRUE(PoolOptions::from_environment().expandable);
  }
  ScopedVariable bad("CUEMM_POOL_EXPANDABLE", "yes");
  EXPECT_TRUE(throws<InvalidArgument>([&] { PoolOptions::from_environment(); }, "CUEMM_POOL_EXPANDABLE must be 0 or 1",
                                      "'yes'"));
}

TEST_F(Pool, TheBusyOvershootComesFromTheEnvironmentAndIsChecked) {
  {
    ScopedVariable unset("CUEMM_POOL_BUSY_OVERSHOOT", nullptr);
    EXPECT_EQ(PoolOptions::from_environment().busy_overshoot, 0.125);
  }
  for (const auto& [text, value] : {std::pair{"0.25", 0.25}, {"0", 0.0}}) {
    ScopedVariable overshoot("CUEMM_POOL_BUSY_OVERSHOOT", text);
    EXPECT_EQ(PoolOptions::from_environment().busy_overshoot, value) << text;
  }
  for (const char* bad : {"-0.1", "nan", "5", "an eighth", "0.1x"}) {
    ScopedVariable overshoot("CUEMM_POOL_BUSY_OVERSHOOT", bad);
    EXPECT_TRUE(throws<InvalidArgument>([&] { PoolOptions::from_environment(); },
                                        "CUEMM_POOL_BUSY_OVERSHOOT must be a fraction", bad));
  }
  PoolOptions options;
  options.busy_overshoot = -1;
  EXPECT_TRUE(throws<InvalidArgument>([&] { PoolMemoryManager pool(&context, options); }, "busy overshoot"));
}
