// Many threads at once: contents kept, no block handed out twice, each block
// back to its own pool.
#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::Pool;

// Large blocks through the thread caches and across threads: each thread
// loops over a few large sizes and hands some blocks to another thread to
// free (whose cache does not know their size); every block keeps its
// contents while it is out.
TEST_F(Pool, LargeBlocksKeepTheirContentsAcrossThreads) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  std::mutex mutex;
  std::vector<std::shared_ptr<MemoryPointer>> handed_over;
  std::atomic<int> corrupted{0};
  auto word_at = [](cuda::CUdeviceptr address) {
    std::uint32_t word = 0;
    CUEMM_CU(cuMemcpyDtoH, &word, address, sizeof word);
    return word;
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      std::mt19937 random(t);
      for (std::uint32_t step = 0; step < 80; ++step) {
        const std::size_t size = (1 + random() % 3) * (std::size_t{3} << 20) - 4096 * (random() % 3);
        auto memory = pool.memalloc(size);
        const std::uint32_t value = t * 1000 + step;
        CUEMM_CU(cuMemsetD32, memory->device_pointer(), value, size / 4);
        std::this_thread::yield();
        const cuda::CUdeviceptr last = memory->device_pointer() + (size / 4 - 1) * 4;
        if (word_at(memory->device_pointer()) != value || word_at(last) != value) corrupted.fetch_add(1);
        if (random() % 4 == 0) {
          std::lock_guard lock(mutex);
          handed_over.push_back(std::move(memory));
        } else if (random() % 4 == 0) {
          std::lock_guard lock(mutex);
          handed_over.clear();  // this thread frees others' blocks
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  handed_over.clear();
  EXPECT_EQ(corrupted, 0);
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  pool.trim();
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u) << "a block was lost on the way";
}

// Threads that mix every interface (memalloc, the raw pair, the
// stream-ordered pair), sizes of every path (classes, the index, segments of
// their own), frees of each other's blocks, trims and defer_cleanup() guards,
// under each option that changes where blocks come from: no block is ever
// handed out while another overlaps it, and each keeps what was written.
TEST_F(Pool, MixedInterfacesSizesAndTrimsFromManyThreadsNeverHandOutOverlappingBlocks) {
  struct Variant {
    const char* name;
    PoolOptions options;
  };
  std::vector<Variant> variants{{"default", PoolOptions{}}, {"no thread caches", with_thread_cache(0)}};
  variants.push_back({"split spares", PoolOptions{}});
  variants.back().options.split_spares = true;
  variants.push_back({"small blocks shared", PoolOptions{}});
  variants.back().options.small_blocks_apart = false;
  variants.push_back({"expandable", PoolOptions{}});
  variants.back().options.expandable = true;
  variants.push_back({"every block a segment of its own", PoolOptions{}});
  variants.back().options.dedicated_size = 0;
  variants.push_back({"raw frees checked", PoolOptions{}});
  variants.back().options.check_frees = true;
  // Out of memory under way: every thread's requests meet the maximum and
  // its flush of the caches, and go on.
  variants.push_back({"a maximum of 128 MiB, caches of 4 MiB", PoolOptions{}});
  variants.back().options.maximum_size = std::size_t{128} << 20;
  variants.back().options.thread_cache_size = std::size_t{4} << 20;
  variants.push_back({"expandable, a maximum of 128 MiB", PoolOptions{}});
  variants.back().options.expandable = true;
  variants.back().options.maximum_size = std::size_t{128} << 20;
  // Options together, as programs set them: blocks assembled near the peak
  // under a maximum; an initial segment that small and large blocks share
  // with later growth; no room past the peak while the GPU is busy.
  variants.push_back({"expandable, assembled blocks, a maximum of 128 MiB", PoolOptions{}});
  variants.back().options.expandable = true;
  variants.back().options.assemble_blocks = true;
  variants.back().options.maximum_size = std::size_t{128} << 20;
  variants.push_back({"an initial 32 MiB, a maximum of 128 MiB, split spares", PoolOptions{}});
  variants.back().options.initial_size = std::size_t{32} << 20;
  variants.back().options.maximum_size = std::size_t{128} << 20;
  variants.back().options.split_spares = true;
  variants.push_back({"the least memory: expandable, assembled blocks, no thread caches", with_thread_cache(0)});
  variants.back().options.expandable = true;
  variants.back().options.assemble_blocks = true;
  variants.push_back({"expandable, an initial 32 MiB, no overshoot, raw frees checked", PoolOptions{}});
  variants.back().options.expandable = true;
  variants.back().options.initial_size = std::size_t{32} << 20;
  variants.back().options.busy_overshoot = 0;
  variants.back().options.check_frees = true;
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    PoolMemoryManager pool(&context, variant.options);
    pool.initialize();
    enum class Via { memalloc, raw, stream_ordered };
    struct Block {
      Via via;
      cuda::CUdeviceptr address;
      std::size_t size;
      std::uint32_t mark;
      std::shared_ptr<MemoryPointer> memory;  // (memalloc's)
    };
    cuemm::testing::LiveRanges live;
    cuemm::testing::HandedOver<Block> handed_over;
    std::atomic<int> corrupted{0}, out_of_memory{0}, inconsistent{0};
    auto release = [&](Block& block) {
      std::uint32_t words[2] = {};
      CUEMM_CU(cuMemcpyDtoH, &words[0], block.address, 4);
      CUEMM_CU(cuMemcpyDtoH, &words[1], block.address + block.size / 4 * 4 - 4, 4);
      if (words[0] != block.mark || words[1] != block.mark) corrupted.fetch_add(1);
      live.remove(block.address);
      switch (block.via) {
        case Via::memalloc: block.memory.reset(); break;
        case Via::raw: pool.deallocate(block.address, block.size); break;
        case Via::stream_ordered: pool.deallocate(block.address, block.size, cuda::CU_STREAM_PER_THREAD); break;
      }
    };
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        ScopedContext scope(context);
        std::mt19937 random(t + 1);
        std::vector<Block> mine;
        std::optional<CleanupGuard> guard;
        // (Fewer on a GPU, where a trim's segments cost a driver call each way, 0.1 ms or more.)
        const std::uint32_t steps = simulation::active() ? 400 : 150;
        for (std::uint32_t step = 0; step < steps; ++step) {
          const unsigned draw = random() % 100;
          if (draw < 2) {
            pool.trim();
            continue;
          }
          if (draw < 4) {
            guard.reset();
            if (random() % 2) guard.emplace(pool.defer_cleanup());
            continue;
          }
          if (draw < 6) {  // what a monitoring thread reads meanwhile
            const PoolStatistics now = pool.statistics();
            if (now.in_use_bytes + now.quarantined_bytes > now.reserved_bytes) inconsistent.fetch_add(1);
            pool.get_memory_info();
            continue;
          }
          if (mine.size() < 12 && draw < 70) {
            // Classes mostly; then the index (1-4 MiB), then segments of their own (4-20 MiB).
            const unsigned kind = random() % 10;
            const std::size_t size = kind < 7   ? 256 + random() % (1 << 20)
                                     : kind < 9 ? (std::size_t{1} << 20) + random() % (3 << 20)
                                                : (std::size_t{4} << 20) + random() % (16 << 20);
            Block block{static_cast<Via>(random() % 3), 0, size, t * 100000 + step, nullptr};
            try {
              if (block.via == Via::memalloc) {
                block.memory = pool.memalloc(size);
                block.address = block.memory->device_pointer();
              } else if (block.via == Via::raw) {
                block.address = pool.allocate(size);
              } else {
                block.address = pool.allocate(size, cuda::CU_STREAM_PER_THREAD);
              }
            } catch (const OutOfMemory&) {
              out_of_memory.fetch_add(1);
              continue;
            }
            live.add(block.address, size);
            CUEMM_CU(cuMemsetD32, block.address, block.mark, 1);
            CUEMM_CU(cuMemsetD32, block.address + size / 4 * 4 - 4, block.mark, 1);
            mine.push_back(std::move(block));
          } else if (!mine.empty()) {
            Block block = cuemm::testing::take_one(mine, random);
            if (random() % 4 == 0) {  // another thread frees it
              handed_over.leave(std::move(block));
              continue;
            }
            release(block);
          }
          if (random() % 8 == 0) {  // a block another thread left
            if (std::optional<Block> theirs = handed_over.take()) release(*theirs);
          }
        }
        guard.reset();
        for (Block& block : mine) release(block);
      });
    }
    for (auto& thread : threads) thread.join();
    for (Block& block : handed_over.take_all()) release(block);
    EXPECT_EQ(live.overlaps(), 0) << "a block was handed out while another overlapped it";
    EXPECT_EQ(corrupted, 0) << "a block lost what was written to it";
    EXPECT_EQ(inconsistent, 0) << "statistics() read more bytes in use and waiting than reserved";
    if (variant.options.maximum_size) {
      EXPECT_GT(out_of_memory, 0) << "the maximum was never met: the variant tests nothing more";
      EXPECT_LE(pool.statistics().reserved_bytes, variant.options.maximum_size);
    } else {
      EXPECT_EQ(out_of_memory, 0);
    }
    EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
    pool.trim();
    EXPECT_EQ(pool.statistics().reserved_bytes, 0u) << "a trimmed pool with no block out holds memory";
  }
}

// Each thread has a cache in each pool it uses (src/util/thread_slots.hpp):
// threads that take blocks from two pools, one per device where there are two,
// and free each other's, give every block back to the pool it came from.
TEST_F(Pool, ThreadsSharingTwoPoolsGiveEachBlockBackToItsOwnPool) {
  Context& other = Device::count() >= 2 ? Device::get(1).primary_context() : context;
  PoolMemoryManager first(&context);
  PoolMemoryManager second(&other);
  first.initialize();
  second.initialize();
  PoolMemoryManager* pools[] = {&first, &second};
  std::mutex mutex;
  std::vector<std::shared_ptr<MemoryPointer>> handed_over;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(t + 100);
      std::vector<std::shared_ptr<MemoryPointer>> mine;
      for (std::uint32_t step = 0; step < 300; ++step) {
        PoolMemoryManager& pool = *pools[random() % 2];
        ScopedContext scope(pool.context());
        // Mostly sizes that the thread caches keep; now and then one with a segment of its own.
        const std::size_t size = random() % 16 == 0 ? (std::size_t{5} << 20) : 256 * (1 + random() % 1024);
        auto memory = pool.memalloc(size);
        const std::uint32_t value = t * 100000 + step;
        CUEMM_CU(cuMemsetD32, memory->device_pointer(), value, size / 4);
        mine.push_back(std::move(memory));
        if (mine.size() > 8) {  // check and free the oldest, or hand it to another thread
          std::shared_ptr<MemoryPointer> oldest = std::move(mine.front());
          mine.erase(mine.begin());
          std::uint32_t words[2] = {};
          {
            // In the block's own context, whose legacy stream its memset went to (a memset of
            // device memory may return before it ran, and another context's stream is not ordered after it).
            ScopedContext owner(*oldest->context());
            CUEMM_CU(cuMemcpyDtoH, &words[0], oldest->device_pointer(), 4);
            CUEMM_CU(cuMemcpyDtoH, &words[1], oldest->device_pointer() + oldest->size() - 4, 4);
          }
          if (words[0] != words[1] || words[0] / 100000 != t) corrupted.fetch_add(1);
          std::lock_guard lock(mutex);
          if (random() % 2) handed_over.push_back(std::move(oldest));
          if (random() % 8 == 0) handed_over.clear();  // this thread frees others' blocks
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  handed_over.clear();
  EXPECT_EQ(corrupted, 0) << "a block was handed out twice";
  for (PoolMemoryManager* pool : pools) {
    EXPECT_EQ(pool->statistics().in_use_bytes, 0u);
    pool->trim();
    EXPECT_EQ(pool->statistics().reserved_bytes, 0u) << "a block went back to the other pool, or was lost";
  }
}

// segments() while threads allocate and free, and between trims and
// resets: each list is one moment's, taken under the pool's lock, so its
// segments never overlap and none holds more free bytes than it has.
TEST_F(Pool, SegmentsListedWhileThreadsAllocateAreEachOneMoments) {
  in_both_layouts(PoolOptions{}, [&](PoolMemoryManager& pool) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        ScopedContext scope(context);
        std::mt19937 random(t);
        std::vector<std::shared_ptr<MemoryPointer>> held(16);
        while (!stop.load()) {
          const std::size_t size = random() % 2 ? 256 + random() % (512 << 10) : (1 + random() % 12) << 20;
          held[random() % held.size()] = pool.memalloc(size);
        }
      });
    }
    std::size_t lists = 0, segments_seen = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until || lists < 20) {
      if (lists % 7 == 3) pool.trim();
      if (lists % 29 == 11) pool.reset();
      const std::vector<PoolSegment> segments = pool.segments();
      ++lists;
      segments_seen += segments.size();
      for (std::size_t i = 0; i < segments.size(); ++i) {
        const PoolSegment& segment = segments[i];
        ASSERT_LE(segment.free_bytes, segment.size) << to_string(segment.kind);
        ASSERT_LE(segment.largest_free_block, segment.free_bytes) << to_string(segment.kind);
        if (i > 0) {
          ASSERT_GE(segment.address, segments[i - 1].address + segments[i - 1].size) << "segments overlap";
        }
      }
    }
    stop.store(true);
    for (auto& thread : threads) thread.join();
    EXPECT_GT(segments_seen, 0u);
  });
}

// A pipeline: this thread allocates, another frees each block it is handed,
// in batches of 16 with at most two batches waiting (a loader thread feeding
// a compute thread). Neither thread's cache serves the other's blocks, yet
// the pool's footprint stays bounded by the blocks out at once (the batch
// being filled, two waiting, one being freed) and twice as many again
// waiting for the GPU or in the freeing thread's cache; and every block
// comes back. (Simulated: 16 MiB for 256 KiB blocks, 256 MiB for 4 MiB
// ones, what the 64 blocks out at most take. A pool that grew at every
// request its caches missed would pass the bound within 200 batches.)
TEST_F(Pool, APipelineOfBlocksFreedByAnotherThreadKeepsABoundedFootprint) {
  constexpr std::size_t kBatch = 16;
  constexpr int kBatches = 1500;
  constexpr std::size_t kMostOut = 4 * kBatch;
  for (const std::size_t size : {std::size_t{256} << 10, std::size_t{4} << 20}) {
    SCOPED_TRACE("blocks of " + std::to_string(size) + " bytes");
    PoolMemoryManager pool(&context);
    pool.initialize();
    cuemm::testing::BatchPipeline<std::vector<cuda::CUdeviceptr>> pipeline;
    std::thread freer([&] {
      ScopedContext scope(context);
      while (auto batch = pipeline.pop())
        for (const cuda::CUdeviceptr block : *batch) pool.deallocate(block, size);
    });
    std::size_t most_reserved = 0;
    for (int b = 0; b < kBatches; ++b) {
      std::vector<cuda::CUdeviceptr> batch;
      for (std::size_t i = 0; i < kBatch; ++i) batch.push_back(pool.allocate(size));
      pipeline.push(std::move(batch));
      most_reserved = std::max(most_reserved, pool.statistics().reserved_bytes);
    }
    pipeline.close();
    freer.join();
    // Large blocks: the freeing thread queues them for the allocating one
    // (Note [Large frees from another thread]) rather than wait for the lock.
    // Small ones too, once the allocating thread has taken back what the
    // freeing thread's ring kept (Note [Classes a thread frees for others]).
    if (size > detail::kLargestCachedSize) {
      EXPECT_GE(pool.statistics().queued_large_frees, kBatches * kBatch / 2);
      EXPECT_EQ(pool.statistics().queued_small_frees, 0u);
    } else {
      EXPECT_EQ(pool.statistics().queued_large_frees, 0u);
      EXPECT_GE(pool.statistics().queued_small_frees, kBatches * kBatch / 2);
    }
    EXPECT_LE(most_reserved, 3 * kMostOut * size + (std::size_t{8} << 20))
        << "reserved " << most_reserved << " bytes for " << kMostOut << " blocks out at most";
    EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
    pool.trim();
    EXPECT_EQ(pool.statistics().reserved_bytes, 0u) << "a block was lost on the way";
  }
}

// Note [Classes a thread frees for others]: a thread that frees a loader's
// 1 MiB blocks, and asks for none itself, sends them to the pool once the
// loader has taken back what its ring kept, rather than keep them for the
// loader to take back again (a barrier across the process each time); once
// it asks for that size itself, its frees of it keep to its ring again.
TEST_F(Pool, AClassAThreadFreesForOthersGoesToThePoolUntilItAsksForTheClass) {
  constexpr std::size_t kSize = detail::kLargestCachedSize;
  constexpr std::size_t kBatch = 16;
  constexpr int kBatches = 300;
  PoolMemoryManager pool(&context);
  pool.initialize();
  cuemm::testing::BatchPipeline<std::vector<cuda::CUdeviceptr>> pipeline;
  std::size_t queued_before_its_own = 0, queued_after_its_own = 0, cached_after_its_own = 0;
  std::thread freer([&] {
    ScopedContext scope(context);
    while (auto batch = pipeline.pop())
      for (const cuda::CUdeviceptr block : *batch) pool.deallocate(block, kSize);
    queued_before_its_own = pool.statistics().queued_small_frees;
    const cuda::CUdeviceptr own = pool.allocate(kSize);
    pool.deallocate(own, kSize);
    queued_after_its_own = pool.statistics().queued_small_frees;
    cached_after_its_own = pool.statistics().cached_bytes;
  });
  for (int b = 0; b < kBatches; ++b) {
    std::vector<cuda::CUdeviceptr> batch;
    for (std::size_t i = 0; i < kBatch; ++i) batch.push_back(pool.allocate(kSize));
    pipeline.push(std::move(batch));
  }
  pipeline.close();
  freer.join();
  EXPECT_GE(queued_before_its_own, kBatches * kBatch / 2) << "the freeing thread kept the loader's blocks in its ring";
  EXPECT_EQ(queued_after_its_own, queued_before_its_own) << "its free of a size it asked for went past its ring";
  EXPECT_GE(cached_after_its_own, kSize);
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  pool.trim();
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u) << "a block was lost on the way";
}
