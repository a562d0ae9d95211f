// Each thread's cache of the blocks it freed: budgets, spills, flushes.
#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::Pool;

TEST_F(Pool, AFinishedThreadsCachedBlocksGoBackToThePool) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  std::thread([&] {
    ScopedContext scope(context);
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 64; ++i) blocks.push_back(pool.memalloc(4096));
    blocks.push_back(pool.memalloc(8 << 20));  // held by the thread when freed
    blocks.clear();
    EXPECT_GE(pool.statistics().cached_bytes, 64u * 4096u) << "small blocks should be cached by their thread";
  }).join();
  const PoolStatistics after = pool.statistics();
  EXPECT_EQ(after.cached_bytes, 0u);
  EXPECT_EQ(after.in_use_bytes, 0u);
  ASSERT_GT(after.reserved_bytes, 0u);
  EXPECT_EQ(pool.trim(), after.reserved_bytes) << "the finished thread's blocks did not come back to the segments";
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
}

TEST_F(Pool, TrimEmptiesTheThreadCaches) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  // (The large block first: a request for a segment of its own that would
  // take the pool past its peak merges the thread's safe small blocks into
  // the index.)
  pool.memalloc(8 << 20);
  for (int i = 0; i < 100; ++i) pool.memalloc(1000);
  EXPECT_GT(pool.statistics().cached_bytes, std::size_t{8} << 20);
  EXPECT_GT(pool.trim(), 0u);
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u);
}

TEST_F(Pool, ThreadCachesCanBeTurnedOff) {
  PoolMemoryManager pool(&context, with_thread_cache(0));
  pool.initialize();
  auto block = pool.memalloc(1000);
  EXPECT_EQ(pool.statistics().in_use_bytes, 1024u) << "without caches blocks are not rounded to a class";
  block.reset();
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
}

TEST_F(Pool, AThreadCacheStaysWithinItsBudget) {
  PoolMemoryManager pool(&context, with_thread_cache(1 << 20));
  pool.initialize();
  hold_then_release(pool, 200, 64 << 10);
  EXPECT_LE(pool.statistics().cached_bytes, std::size_t{1} << 20);
}

// Over its budget a thread gives up blocks of the size it left behind, not
// the block of the size it now frees: else every later free of that size
// went to the shared quarantine, under the pool's lock.
TEST_F(Pool, AThreadThatMovesOnToAnotherSizeMakesRoomInItsCache) {
  PoolMemoryManager pool(&context, with_thread_cache(4 << 20));
  pool.initialize();
  hold_then_release(pool, 4, 1 << 20);
  ASSERT_EQ(pool.statistics().cached_bytes, std::size_t{4} << 20) << "the budget is full of 1 MiB blocks";
  for (int i = 0; i < 100; ++i) pool.memalloc(256);
  const PoolStatistics statistics = pool.statistics();
  EXPECT_LE(statistics.cached_bytes, std::size_t{3} << 20) << "the 1 MiB blocks kept the whole budget";
  EXPECT_GT(statistics.cached_bytes % (1 << 20), 0u) << "the 256 B blocks are not cached";
}

// Over budget, a free spills the ring of the size the thread freed into
// longest ago, not the ring in use (which, halved, would send the loop of
// that size to the pool's lock again and again).
TEST_F(Pool, OverItsBudgetAThreadSpillsTheSizeItLeftNotTheOneInUse) {
  PoolMemoryManager pool(&context, with_thread_cache(4 << 20));
  pool.initialize();
  hold_then_release(pool, 64, 64 << 10);
  ASSERT_EQ(pool.statistics().cached_bytes, std::size_t{4} << 20) << "the budget is full of 64 KiB blocks";
  hold_then_release(pool, 2, 1 << 20);
  EXPECT_EQ(pool.statistics().cached_bytes, std::size_t{2} << 20)
      << "the 64 KiB blocks of the size left behind stayed, or the 1 MiB ones did not";
  hold_then_release(pool, 4, 1 << 20);
  EXPECT_EQ(pool.statistics().cached_bytes, std::size_t{4} << 20) << "the size in use did not get the whole budget";
}

TEST_F(Pool, OutOfMemoryFlushesTheThreadCachesBeforeFailing) {
  PoolOptions options;
  options.maximum_size = 64 << 20;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  hold_then_release(pool, 48, 1 << 20);  // cached on release
  EXPECT_GT(pool.statistics().cached_bytes, 0u);
  EXPECT_NO_THROW(pool.memalloc(48 << 20)) << "cached blocks were not given back to make room";
}
