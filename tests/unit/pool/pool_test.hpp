// unit/pool/pool_test.hpp: the fixture and helpers of the pool's tests
// (test_pool_memory_manager: one file a topic beside this one).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <future>
#include <limits>
#include <latch>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "cuemm/managers/detail/size_classes.hpp"
#include "cuemm/runtime/capture_scope.hpp"
#include "random_workload.hpp"
#include "support/block_storm.hpp"
#include "support/test_support.hpp"

namespace cuemm::testing {

// An address as the pool's messages print it.
inline std::string hex_of(cuda::CUdeviceptr pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(pointer));
  return text;
}

class Pool : public ::testing::Test {
 protected:
  Context& context = current_context();
  // Blocks of `sizes`, in order, from an expandable pool that has given out
  // nothing yet: each must lie right after the one before, from the arena's
  // start (the layouts that the arena's cases free holes in).
  static std::vector<std::shared_ptr<MemoryPointer>> lay_out(PoolMemoryManager& pool,
                                                             std::initializer_list<std::size_t> sizes) {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (const std::size_t size : sizes) {
      blocks.push_back(pool.memalloc(size));
      if (blocks.size() > 1) {
        const MemoryPointer& before = *blocks[blocks.size() - 2];
        EXPECT_EQ(blocks.back()->device_pointer(), before.device_pointer() + before.size())
            << "block " << blocks.size() - 1 << " is not where the layout needs it";
      }
    }
    return blocks;
  }
  // `count` blocks of `size` held at once, then all released (into the thread's cache).
  static void hold_then_release(PoolMemoryManager& pool, int count, std::size_t size) {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(pool.memalloc(size));
  }
  // `count` allocate+free pairs of `size` bytes through the raw interface.
  static void pairs(PoolMemoryManager& pool, std::size_t size, int count) {
    for (int i = 0; i < count; ++i) pool.deallocate(pool.allocate(size), size);
  }
  // The body of ALargeRequestUsesFreeSpaceOfTheSharedSegmentsRatherThanPassThePeak.
  void uses_free_space_of_the_shared_segments(bool expandable);
  // The body of GrowthPastThePeakDoesNotWaitForTheGpuWhileItIsBusy, its kernels on `stream`.
  void growth_past_the_peak_while_busy(const Stream& stream);
  // Options with each thread's cache limited to `bytes` (0: no caches).
  static PoolOptions with_thread_cache(std::size_t bytes) {
    PoolOptions options;
    options.thread_cache_size = bytes;
    return options;
  }
  // Runs `check(pool, apart)` on a new pool with its small blocks apart
  // (Note [Small blocks apart]), then on one where they share the segments.
  template <class Check>
  void with_small_blocks_apart_and_not(Check check) {
    for (const bool apart : {true, false}) {
      SCOPED_TRACE(apart ? "small blocks apart" : "small blocks shared");
      PoolOptions options;
      options.small_blocks_apart = apart;
      PoolMemoryManager pool(&context, options);
      pool.initialize();
      check(pool, apart);
    }
  }
  // A loop of 64 KiB pairs, once its ring has grown as its seals paid for
  // it, seals once per 128 pairs (simulated driver).
  static void expect_a_grown_ring_loop(PoolMemoryManager& pool) {
    const std::size_t size = std::size_t{64} << 10;
    pairs(pool, size, 200000);
    simulation::reset_call_counts();
    pairs(pool, size, 6400);
    EXPECT_LE(cuemm::testing::seal_calls(), 6400u / 128 + 1)
        << "the pool holds " << pool.statistics().reserved_bytes << " bytes";
  }
  // 192 MiB live in blocks of 3 MiB (returned, to keep), then four large
  // blocks of near sizes allocated and freed together: the calling thread
  // holds them, as a rotation, though it is no loop.
  static std::vector<std::shared_ptr<MemoryPointer>> live_blocks_then_near_sizes_freed(PoolMemoryManager& pool) {
    constexpr std::size_t kMiB = std::size_t{1} << 20;
    std::vector<std::shared_ptr<MemoryPointer>> kept;
    for (int i = 0; i < 64; ++i) kept.push_back(pool.memalloc(3 * kMiB));
    std::vector<std::shared_ptr<MemoryPointer>> near;
    for (std::size_t size : {12 * kMiB, 12 * kMiB + kMiB / 2, 13 * kMiB, 13 * kMiB + kMiB / 3})
      near.push_back(pool.memalloc(size));
    return kept;
  }
  // Runs `check(pool)` on a new pool of `options` with segments, then on one
  // with the expandable arena.
  template <class Check>
  void in_both_layouts(PoolOptions options, Check check) {
    for (const bool expandable : {false, true}) {
      SCOPED_TRACE(expandable ? "expandable" : "segments");
      options.expandable = expandable;
      PoolMemoryManager pool(&context, options);
      pool.initialize();
      check(pool);
    }
  }
  // An expandable pool without thread caches: every block below the
  // dedicated size comes from the arena's index.
  static PoolOptions arena_without_caches() {
    PoolOptions options;
    options.expandable = true;
    options.thread_cache_size = 0;
    return options;
  }
  // The same with every block up to 64 MiB in the arena (no segments of their own).
  static PoolOptions arena_only() {
    PoolOptions options = arena_without_caches();
    options.dedicated_size = std::size_t{64} << 20;
    return options;
  }
  // The same, assembling blocks near its peak (Note [Assembled blocks]).
  static PoolOptions assembling_arena() {
    PoolOptions options = arena_only();
    options.assemble_blocks = true;
    return options;
  }
};

}  // namespace cuemm::testing
