// What the pool's segments and size classes hold, and where a block goes.
#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::Pool;

// Every cached size gets the smallest class that holds it, at most 12.5% over
// it beyond 4 KiB (256-byte steps below), whatever arithmetic computes it.
TEST(SizeClasses, EverySizeGetsTheSmallestClassThatHoldsIt) {
  EXPECT_EQ(detail::size_class_of(0), -1);
  EXPECT_EQ(detail::size_class_of(detail::kLargestCachedSize + 1), -1);
  for (std::size_t size = 1; size <= detail::kLargestCachedSize; ++size) {
    const int size_class = detail::size_class_of(size);
    ASSERT_GE(size_class, 0) << size;
    ASSERT_LT(size_class, detail::kSizeClassCount) << size;
    const std::size_t bytes = detail::size_class_bytes(size_class);
    ASSERT_GE(bytes, size) << size;
    if (size_class > 0) {
      ASSERT_LT(detail::size_class_bytes(size_class - 1), size) << size;
    }
    ASSERT_LE(bytes, size <= detail::kLinearClassLimit ? size + 255 : size + size / 8) << size;
  }
}

TEST_F(Pool, IsABundledManager) {
  const auto names = bundled_memory_managers();
  EXPECT_NE(std::find(names.begin(), names.end(), "pool"), names.end());
}

TEST_F(Pool, SuballocatesFromFewSegments) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  if (simulation::active()) simulation::reset_call_counts();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 1000; ++i) blocks.push_back(pool.memalloc(1000 + i));
  const PoolStatistics statistics = pool.statistics();
  EXPECT_LE(statistics.segments, 2u);
  EXPECT_GE(statistics.in_use_bytes, 1000u * 1000u);
  if (simulation::active()) {
    EXPECT_LE(simulation::call_count("cuMemAlloc"), 2u);
  }
}

// Growth steps follow the requests, so that a small pool of small blocks
// does not reserve a third more than it uses: one 2 MiB page at a time for
// the classes' blocks (Note [Small blocks apart]); for larger ones room for
// 4 of the largest, up to 8 MiB; and with the small blocks in the shared
// segments, room for 4 of theirs too.
TEST_F(Pool, APoolOfSmallBlocksGrowsBySmallSteps) {
  with_small_blocks_apart_and_not([](PoolMemoryManager& pool, bool apart) {
    std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> blocks;
    auto grow_with = [&](std::size_t size) {
      const std::size_t reserved = pool.statistics().reserved_bytes;
      while (pool.statistics().reserved_bytes == reserved) blocks.emplace_back(pool.allocate(size), size);
      return pool.statistics().reserved_bytes - reserved;
    };
    for (int i = 0; i < 40; ++i) blocks.emplace_back(pool.allocate(200 << 10), 200 << 10);
    const PoolStatistics small = pool.statistics();
    EXPECT_LE(small.reserved_bytes, small.in_use_bytes + PoolMemoryManager::kSegmentGranularity)
        << "in use: " << small.in_use_bytes;
    EXPECT_EQ(grow_with(1 << 20), (apart ? std::size_t{2} : std::size_t{4}) << 20) << "requests of 1 MiB";
    EXPECT_EQ(grow_with(3 << 19), std::size_t{6} << 20) << "requests of 1.5 MiB";
    for (const auto& [block, size] : blocks) pool.deallocate(block, size);
  });
}

// The classes' blocks come from segments that hold no larger block (Note
// [Small blocks apart]): a thread's ring keeps what it frees, and among
// larger blocks those kept blocks split the free space that a larger request
// needed. Here three 2 MiB blocks, with 1 MiB of 256 KiB blocks after each
// of the first two, are freed, the small ones into the thread's ring; then a
// request of 3 MiB comes: in the shared segments, it grows the pool.
TEST_F(Pool, BlocksThatAThreadsRingKeepsDoNotSplitTheSpaceOfLargerOnes) {
  with_small_blocks_apart_and_not([](PoolMemoryManager& pool, bool apart) {
    constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
    std::vector<std::shared_ptr<MemoryPointer>> large, small;
    for (int i = 0; i < 3; ++i) {
      large.push_back(pool.memalloc(2 * kMiB));  // (the first grows the shared segments by 8 MiB)
      for (int j = 0; i < 2 && j < 4; ++j) small.push_back(pool.memalloc(256 * kKiB));
    }
    ASSERT_EQ(pool.statistics().driver_allocations, apart ? 2u : 1u);
    const std::size_t reserved = pool.statistics().reserved_bytes;
    large.clear();
    small.clear();
    auto three = pool.memalloc(3 * kMiB);
    if (apart) {
      EXPECT_EQ(pool.statistics().reserved_bytes, reserved) << "the pool grew beside 8 MiB of free large blocks";
    } else {
      // (Documents what sharing costs: the ring's blocks left 2 MiB pieces.)
      EXPECT_GT(pool.statistics().reserved_bytes, reserved);
    }
  });
}

// At the pool's peak, a small block takes a hole of the shared segments that
// is no larger than the largest request they grew for (one that requests
// grown for could not use) rather than a new small segment; a larger free
// block, such as a new segment's free end, stays for larger requests (Note
// [Small blocks apart]). (No thread caches: blocks freed go to the index.)
TEST_F(Pool, AtItsPeakASmallBlockTakesAHoleThatLargerRequestsDoNotFit) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  PoolMemoryManager pool(&context, with_thread_cache(0));
  pool.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> large, small;
  large.push_back(pool.memalloc(2 * kMiB));  // the shared segments grow by room for 4 of them
  for (int i = 0; i < 8; ++i) small.push_back(pool.memalloc(256 * kKiB));  // one small segment, full
  ASSERT_EQ(pool.statistics().driver_allocations, 2u);
  // The shared segment's 6 MiB free end is larger than any request it grew for.
  small.push_back(pool.memalloc(256 * kKiB));
  EXPECT_EQ(pool.statistics().driver_allocations, 3u) << "the small block split the shared segment's free end";
  for (int i = 0; i < 3; ++i) large.push_back(pool.memalloc(2 * kMiB));
  for (int i = 0; i < 7; ++i) small.push_back(pool.memalloc(256 * kKiB));  // the second small segment, full
  const PoolStatistics full = pool.statistics();
  ASSERT_EQ(full.driver_allocations, 3u) << "the large blocks did not fill the shared segment";
  // A 2 MiB hole between blocks in use.
  const cuda::CUdeviceptr hole = large[1]->device_pointer();
  large[1].reset();
  auto in_hole = pool.memalloc(256 * kKiB);
  EXPECT_EQ(pool.statistics().driver_allocations, 3u) << "a new small segment beside a hole that fitted";
  EXPECT_EQ(pool.statistics().reserved_bytes, full.reserved_bytes);
  EXPECT_GE(in_hole->device_pointer(), hole);
  EXPECT_LT(in_hole->device_pointer(), hole + 2 * kMiB);
  // Freed, it merges back: the shared segment holds a 2 MiB block again.
  in_hole.reset();
  auto again = pool.memalloc(2 * kMiB);
  EXPECT_EQ(again->device_pointer(), hole);
  EXPECT_EQ(pool.statistics().driver_allocations, 3u);
}

// segments() lists each driver allocation once, by address, with the free
// space its index holds: together they make up what the pool reserves, and
// their free bytes are what it holds but neither hands out nor keeps aside.
TEST_F(Pool, SegmentsListWhereTheReservedBytesAndTheFreeOnesLie) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  PoolOptions options;
  options.thread_cache_size = 0;  // frees go back to the index (once the GPU is done)
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> small, shared, own;
  for (int i = 0; i < 4; ++i) small.push_back(pool.memalloc(64 * kKiB));
  for (int i = 0; i < 4; ++i) shared.push_back(pool.memalloc(2 * kMiB + 512 * kKiB));
  for (int i = 0; i < 2; ++i) own.push_back(pool.memalloc(8 * kMiB));
  shared[1].reset();  // a hole between held blocks
  // (A free seals at most every few microseconds: this one may seal too.)
  std::this_thread::sleep_for(std::chrono::microseconds(20));
  own[0].reset();  // a spare segment
  small[2].reset();

  const std::vector<PoolSegment> segments = pool.segments();
  const PoolStatistics statistics = pool.statistics();
  ASSERT_EQ(segments.size(), statistics.segments);
  std::size_t reserved = 0, free = 0, free_blocks = 0, spares = 0;
  std::set<PoolSegment::Kind> kinds;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const PoolSegment& segment = segments[i];
    SCOPED_TRACE(std::string(to_string(segment.kind)) + " segment " + std::to_string(i));
    if (i > 0) {
      EXPECT_GE(segment.address, segments[i - 1].address + segments[i - 1].size) << "overlaps the one before";
    }
    EXPECT_EQ(segment.mapped_bytes, segment.size);
    EXPECT_LE(segment.free_bytes, segment.size);
    EXPECT_LE(segment.largest_free_block, segment.free_bytes);
    EXPECT_EQ(segment.free_blocks > 0, segment.free_bytes > 0);
    if (segment.kind == PoolSegment::Kind::own && segment.free_bytes) {
      EXPECT_EQ(segment.free_bytes, segment.size) << "a spare is free as a whole";
      ++spares;
    }
    kinds.insert(segment.kind);
    reserved += segment.size;
    free += segment.free_bytes;
    free_blocks += segment.free_blocks;
  }
  EXPECT_EQ(kinds, (std::set<PoolSegment::Kind>{PoolSegment::Kind::small, PoolSegment::Kind::shared,
                                                 PoolSegment::Kind::own}));
  EXPECT_EQ(spares, 1u);
  EXPECT_EQ(reserved, statistics.reserved_bytes);
  EXPECT_EQ(free_blocks, statistics.free_blocks);
  EXPECT_EQ(free + statistics.in_use_bytes + statistics.quarantined_bytes + statistics.cached_bytes,
            statistics.reserved_bytes)
      << "free " << free << ", in use " << statistics.in_use_bytes << ", waiting " << statistics.quarantined_bytes;
  const auto shared_hole = std::find_if(segments.begin(), segments.end(), [&](const PoolSegment& segment) {
    return segment.kind == PoolSegment::Kind::shared && segment.largest_free_block >= 2 * kMiB + 512 * kKiB;
  });
  EXPECT_NE(shared_hole, segments.end()) << "the freed block's hole is not in a shared segment";
}

// In the expandable pool, one range whose free pages may be unmapped: its
// mapped bytes are what it reserves.
TEST_F(Pool, AnExpandablePoolsSegmentIsItsRangeWithTheBytesMappedUnderIt) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolMemoryManager pool(&context, arena_only());
  pool.initialize();
  auto a = pool.memalloc(6 * kMiB);
  auto b = pool.memalloc(6 * kMiB);
  auto c = pool.memalloc(6 * kMiB);
  b.reset();
  pool.trim();  // unmaps the free pages between a and c
  const std::vector<PoolSegment> segments = pool.segments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].kind, PoolSegment::Kind::arena);
  EXPECT_EQ(segments[0].mapped_bytes, pool.statistics().reserved_bytes);
  EXPECT_LT(segments[0].mapped_bytes, segments[0].size) << "the unmapped pages under b's hole still count";
  EXPECT_GE(segments[0].free_bytes, 6 * kMiB);
  EXPECT_EQ(std::string(to_string(segments[0].kind)), "arena");
}

// Note [A quarantine kept small]: frees that wait for their seal do not merge
// with their neighbours, so they go back to the index once they hold more
// than a 64th of what the pool reserves, rather than an eighth: a queue
// freed oldest first kept about 30 blocks apart before. (Each free comes
// after the seal interval, so that every one may seal; the GPU is idle, but
// a real one may not have finished the latest seal yet: a block more.)
TEST_F(Pool, FreesWaitingForTheGpuAreKeptToASmallShareOfThePool) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  PoolOptions options;
  options.thread_cache_size = 0;  // every free goes through the quarantine
  options.initial_size = 64 * kMiB;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  constexpr std::size_t kBlock = 1536 * kKiB;  // beyond the classes, in the shared segment
  std::vector<cuda::CUdeviceptr> blocks;
  for (int i = 0; i < 32; ++i) blocks.push_back(pool.allocate(kBlock));
  const std::size_t reserved = pool.statistics().reserved_bytes;
  ASSERT_EQ(reserved, 64 * kMiB) << "the blocks fit the initial segment";
  std::size_t most_waiting = 0;
  for (const cuda::CUdeviceptr block : blocks) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    pool.deallocate(block, kBlock);
    most_waiting = std::max(most_waiting, pool.statistics().quarantined_bytes);
  }
  EXPECT_LE(most_waiting, reserved / 64 + 2 * kBlock) << "an eighth would be " << reserved / 8;
  // And what went back merged: the whole segment holds one block again.
  const cuda::CUdeviceptr whole = pool.allocate(48 * kMiB);
  EXPECT_EQ(pool.statistics().reserved_bytes, reserved);
  pool.deallocate(whole, 48 * kMiB);
}
