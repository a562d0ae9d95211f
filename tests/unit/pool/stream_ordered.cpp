// Stream-ordered allocate/deallocate (Note [Stream-ordered reuse]).
#include "pool_test.hpp"

using namespace cuemm;
using cuemm::testing::Pool;

TEST_F(Pool, AStreamOrderedFreeIsReusedAtOnceOnTheDefaultStreams) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  // A cached class, a block of the shared index and one with a segment of its own.
  for (const std::size_t size : {std::size_t{256}, std::size_t{1} << 20, std::size_t{2} << 20, std::size_t{8} << 20}) {
    const cuda::CUdeviceptr first = pool.allocate(size, cuda::CU_STREAM_PER_THREAD);
    const std::size_t in_use = pool.statistics().in_use_bytes;
    EXPECT_GE(in_use, size);
    pool.deallocate(first, size, cuda::CU_STREAM_PER_THREAD);
    EXPECT_EQ(pool.statistics().in_use_bytes, 0u) << size;
    EXPECT_GE(pool.statistics().cached_bytes, in_use) << size << " bytes: kept by the thread";
    // Either default stream may take it: the driver orders both after the freeing work.
    const cuda::CUdeviceptr again = pool.allocate(size, cuda::CU_STREAM_LEGACY);
    EXPECT_EQ(again, first) << size << " bytes: a stream-ordered free waited for an epoch";
    EXPECT_EQ(pool.statistics().in_use_bytes, in_use) << size;
    pool.deallocate(again, size, cuda::CU_STREAM_LEGACY);
  }
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  EXPECT_GT(pool.trim(), 0u);
  EXPECT_EQ(pool.statistics().reserved_bytes, 0u) << "trim left stream-ordered blocks behind";
}

// (Where the pool would grow past its peak, another thread may take it once
// its epoch is sealed: AnotherThreadTakesAStreamOrderedFreeOnlyAfterItsWork.)
TEST_F(Pool, AnotherThreadDoesNotGetAStreamOrderedFreeBeforeItsEpoch) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  for (const std::size_t size : {std::size_t{4096}, std::size_t{2} << 20, std::size_t{8} << 20}) {
    const cuda::CUdeviceptr mine = pool.allocate(size, cuda::CU_STREAM_PER_THREAD);
    pool.deallocate(mine, size, cuda::CU_STREAM_PER_THREAD);
    const std::size_t seals = pool.statistics().seals;
    cuda::CUdeviceptr theirs = 0;
    std::thread([&] {
      ScopedContext thread_scope(context);
      theirs = pool.allocate(size, cuda::CU_STREAM_PER_THREAD);  // a different per-thread stream
      pool.deallocate(theirs, size, cuda::CU_STREAM_PER_THREAD);
    }).join();
    if (theirs == mine) {
      EXPECT_GT(pool.statistics().seals, seals) << size << " bytes: another thread's stream got the block without a seal";
    }
    const std::size_t seals_before_mine = pool.statistics().seals;
    if (pool.allocate(size) == mine) {
      EXPECT_GT(pool.statistics().seals, seals_before_mine)
          << "the stream-less interface got a stream-ordered free without a seal";
    }
  }
}

// Another thread that takes a stream-ordered free (here at the pool's
// maximum, which the block fills: the freeing thread's kept blocks go back
// rather than the pool fail) gets it only once the work queued before the
// free has run: its own stream's writes, which do not wait for the freeing
// stream, land after the kernel's.
TEST_F(Pool, AnotherThreadTakesAStreamOrderedFreeOnlyAfterItsWork) {
  ScopedContext scope(context);
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const Stream stream = Stream::per_thread_default();
  for (const std::size_t bytes : {std::size_t{2} << 20, std::size_t{8} << 20}) {  // the index; a segment of its own
    SCOPED_TRACE(bytes);
    PoolOptions options;
    options.maximum_size = bytes;
    PoolMemoryManager pool(&context, options);
    pool.initialize();
    const std::uint64_t count = bytes / 4;
    const cuda::CUdeviceptr a = pool.allocate(bytes, stream.handle());
    module.function("cuemm_spin_fill_u32").launch({64}, {256}, stream, a, 7u, count, std::uint64_t{100'000'000});
    pool.deallocate(a, bytes, stream.handle());
    cuda::CUdeviceptr b = 0;
    std::thread([&] {
      ScopedContext thread_scope(context);
      b = pool.allocate(bytes, cuda::CU_STREAM_PER_THREAD);
      const std::vector<std::uint32_t> nines(count, 9u);
      CUEMM_CU(cuMemcpyHtoDAsync, b, nines.data(), bytes, cuda::CU_STREAM_PER_THREAD);
      CUEMM_CU(cuStreamSynchronize, cuda::CU_STREAM_PER_THREAD);
    }).join();
    EXPECT_EQ(b, a) << "the only block of the pool was not reused";
    stream.synchronize();
    std::vector<std::uint32_t> values(count);
    CUEMM_CU(cuMemcpyDtoH, values.data(), b, bytes);
    EXPECT_EQ(values, std::vector<std::uint32_t>(count, 9u)) << "the kernel's late writes landed in the other thread's block";
    pool.deallocate(b, bytes);
  }
}

TEST_F(Pool, WorkOnTheSameStreamRunsAfterTheFreedBlocksWork) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const Stream stream = Stream::per_thread_default();
  const std::uint64_t count = 1 << 18;
  const cuda::CUdeviceptr a = pool.allocate(count * 4, stream.handle());
  module.function("cuemm_spin_fill_u32").launch({64}, {256}, stream, a, 7u, count, std::uint64_t{50'000'000});
  pool.deallocate(a, count * 4, stream.handle());
  const cuda::CUdeviceptr b = pool.allocate(count * 4, stream.handle());
  EXPECT_EQ(b, a);
  module.function("cuemm_fill_u32").launch({64}, {256}, stream, b, 9u, count);
  stream.synchronize();
  std::vector<std::uint32_t> values(count);
  CUEMM_CU(cuMemcpyDtoH, values.data(), b, count * 4);
  EXPECT_EQ(values, std::vector<std::uint32_t>(count, 9u)) << "the first kernel's writes landed after the second's";
  pool.deallocate(b, count * 4, stream.handle());
}

// (The freeing thread ends, so that its frees go back to the pool: it would
// keep them for its next requests on that stream, Note [Same-stream reuse].)
TEST_F(Pool, AFreeOnANonBlockingStreamWaitsForItsWork) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  cuda::CUstream raw_stream = nullptr;
  CUEMM_CU(cuStreamCreate, &raw_stream, cuda::CU_STREAM_NON_BLOCKING);
  const Stream kernel_stream(&context, raw_stream, true);
  const Stream copy_stream = context.create_stream();
  // A block with a segment of its own: the next request of its size waits
  // for the pending epoch rather than take a new segment.
  const std::uint64_t count = 1 << 21;
  cuda::CUdeviceptr a = 0;
  std::thread([&] {
    ScopedContext thread_scope(context);
    a = pool.allocate(count * 4, kernel_stream.handle());
    module.function("cuemm_spin_fill_u32").launch({64}, {256}, kernel_stream, a, 7u, count, std::uint64_t{100'000'000});
    pool.deallocate(a, count * 4, kernel_stream.handle());
  }).join();
  auto b = pool.memalloc(count * 4);
  DeviceArray<std::uint32_t> b_array(b, count);
  const std::vector<std::uint32_t> nines(count, 9u);
  b_array.copy_to_device(nines, copy_stream);
  copy_stream.synchronize();
  kernel_stream.synchronize();
  EXPECT_EQ(b->device_pointer(), a) << "the block was not reused once its work had finished";
  EXPECT_TRUE(b_array.copy_to_host() == nines) << "the kernel's late write landed in the reused block";
}

TEST_F(Pool, AFinishedThreadsStreamOrderedFreesGoBackToThePool) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  std::thread([&] {
    ScopedContext scope(context);
    // (All taken before any is freed: a request that grows the pool first
    // gives back the thread's stream-ordered frees of other sizes.)
    const std::vector<std::size_t> sizes{std::size_t{4096}, std::size_t{3} << 20, std::size_t{16} << 20};
    std::vector<cuda::CUdeviceptr> blocks;
    for (const std::size_t size : sizes) blocks.push_back(pool.allocate(size, cuda::CU_STREAM_PER_THREAD));
    for (std::size_t i = 0; i < sizes.size(); ++i) pool.deallocate(blocks[i], sizes[i], cuda::CU_STREAM_PER_THREAD);
    EXPECT_GE(pool.statistics().cached_bytes, (std::size_t{19} << 20) + 4096);
  }).join();
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  const std::size_t reserved = pool.statistics().reserved_bytes;
  EXPECT_EQ(pool.trim(), reserved);
}

// A stream-ordered request that would take the pool past its peak first
// gives back the blocks the thread keeps from its stream-ordered frees of
// other sizes: here they merge into the free space the request fits.
TEST_F(Pool, AStreamOrderedRequestAtThePeakTakesTheThreadsIdleFreesBeforeTheDriversMemory) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const std::vector<std::size_t> sizes{2 * kMiB, 2 * kMiB + 400 * 1024, 2 * kMiB + 800 * 1024, 3 * kMiB + 200 * 1024};
  std::vector<cuda::CUdeviceptr> blocks;
  for (const std::size_t size : sizes) blocks.push_back(pool.allocate(size, cuda::CU_STREAM_PER_THREAD));
  for (std::size_t i = 0; i < sizes.size(); ++i) pool.deallocate(blocks[i], sizes[i], cuda::CU_STREAM_PER_THREAD);
  const std::size_t reserved = pool.statistics().reserved_bytes;
  ASSERT_GE(pool.statistics().cached_bytes, 10 * kMiB) << "the thread did not keep its stream-ordered frees";
  const cuda::CUdeviceptr large = pool.allocate(7 * kMiB, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(pool.statistics().reserved_bytes, reserved) << pool.statistics().cached_bytes << " bytes still cached";
  pool.deallocate(large, 7 * kMiB, cuda::CU_STREAM_PER_THREAD);
}

TEST_F(Pool, StreamOrderedFreesStayWithinTheThreadsBudget) {
  PoolMemoryManager pool(&context, with_thread_cache(1 << 20));
  pool.initialize();
  ScopedContext scope(context);
  std::vector<cuda::CUdeviceptr> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(pool.allocate(64 << 10, cuda::CU_STREAM_LEGACY));
  for (const auto block : blocks) pool.deallocate(block, 64 << 10, cuda::CU_STREAM_LEGACY);
  EXPECT_LE(pool.statistics().cached_bytes, std::size_t{1} << 20);
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  EXPECT_THROW(pool.allocate(0, cuda::CU_STREAM_LEGACY), InvalidArgument);
}

namespace {
// The end of the two tests below: the 1.5 MiB block `b`, where its thread
// noted a 3 MiB one, freed stream-ordered, counts its own size, and the free
// space left does not overlap a 3 MiB block handed out after it (b's
// address again only where b merged with the free space after it).
void expect_the_stream_ordered_free_of_b_counted_its_size(PoolMemoryManager& pool, cuda::CUdeviceptr b,
                                                          cuda::CUdeviceptr keeper) {
  pool.deallocate(b, 3 << 19, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(pool.statistics().in_use_bytes, (2u << 20) + 256) << "the freed block was counted with its old size";
  const cuda::CUdeviceptr c = pool.allocate(3 << 20, cuda::CU_STREAM_PER_THREAD);
  const cuda::CUdeviceptr d = pool.allocate(3 << 19);
  EXPECT_TRUE(d + (3 << 19) <= c || c + (3 << 20) <= d) << "a 1.5 MiB block was handed out for 3 MiB";
  pool.deallocate(d, 3 << 19);
  pool.deallocate(c, 3 << 20, cuda::CU_STREAM_PER_THREAD);
  pool.deallocate(keeper, (2 << 20) + 1);
}
}  // namespace

TEST_F(Pool, AStreamOrderedFreeLearnsTheSizeOfABlockReusedSinceItsThreadTookIt) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  const cuda::CUdeviceptr keeper = pool.allocate((2 << 20) + 1);  // keeps the segment through trim()
  const cuda::CUdeviceptr a = pool.allocate(3 << 20, cuda::CU_STREAM_PER_THREAD);
  pool.deallocate(a, 3 << 20);  // freed the other way: the thread's note of its size goes stale
  pool.trim();
  const cuda::CUdeviceptr b = pool.allocate(3 << 19);
  ASSERT_EQ(b, a) << "the test needs the smaller block where the freed one was";
  expect_the_stream_ordered_free_of_b_counted_its_size(pool, b, keeper);
}

// The same, where another thread frees the block (its free queued for this
// thread, which took the pool's lock last: Note [Large frees from another
// thread]) and later takes a smaller block at its address: taking the queue
// in made this thread's note of the size stale.
TEST_F(Pool, AStreamOrderedFreeLearnsTheSizeOfABlockAnotherThreadQueuedSinceItsThreadTookIt) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  ScopedContext scope(context);
  const cuda::CUdeviceptr keeper = pool.allocate((2 << 20) + 1);  // keeps the segment through trim()
  std::atomic<int> stage{0};  // 1: the other thread's cache made; 2: `a` taken; 3: `a` freed; 4: trimmed; 5: `b` taken
  cuda::CUdeviceptr a = 0, b = 0;
  auto wait_for = [&](int wanted) {
    while (stage.load() < wanted) std::this_thread::yield();
  };
  std::thread other([&] {
    ScopedContext other_scope(context);
    pool.deallocate(pool.allocate(256), 256);  // (its cache made first: that takes the pool's lock)
    stage = 1;
    wait_for(2);
    pool.deallocate(a, 3 << 20);
    stage = 3;
    wait_for(4);
    b = pool.allocate(3 << 19);
    stage = 5;
  });
  wait_for(1);
  a = pool.allocate(3 << 20, cuda::CU_STREAM_PER_THREAD);  // this thread notes its size, and took the lock last
  stage = 2;
  wait_for(3);
  pool.trim();
  ASSERT_EQ(pool.statistics().queued_large_frees, 1u) << "the test needs the other thread's free queued";
  stage = 4;
  other.join();
  ASSERT_EQ(b, a) << "the test needs the smaller block where the freed one was";
  expect_the_stream_ordered_free_of_b_counted_its_size(pool, b, keeper);
}

// Threads mix stream-ordered and stream-less frees, of their own blocks and of
// other threads', at every size: blocks stay distinct and keep their contents,
// and the bookkeeping adds up at the end.
TEST_F(Pool, StreamOrderedAndStreamLessFreesMixAcrossThreads) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  constexpr int kThreads = 4;
  std::mutex handoff_mutex;
  std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> handoff;  // freed by whichever thread takes them
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      std::uint32_t state = 12345u + t;
      auto next = [&] { return state = state * 1664525u + 1013904223u; };
      struct Block {
        cuda::CUdeviceptr address;
        std::size_t size;
        std::uint32_t tag;
      };
      std::vector<Block> mine;
      for (int i = 0; i < 300; ++i) {
        const std::size_t size = std::size_t{256} << (next() >> 8) % 16;  // 256 B .. 8 MiB
        const bool ordered = next() % 2;
        const cuda::CUdeviceptr block = ordered ? pool.allocate(size, cuda::CU_STREAM_PER_THREAD) : pool.allocate(size);
        const std::uint32_t tag = (static_cast<std::uint32_t>(t) << 24) | static_cast<std::uint32_t>(i);
        CUEMM_CU(cuMemsetD32, block, tag, size / 4);
        mine.push_back({block, size, tag});
        if (mine.size() > 6) {
          const auto [old, old_size, old_tag] = mine.front();
          mine.erase(mine.begin());
          std::uint32_t first = 0, last = 0;
          CUEMM_CU(cuMemcpyDtoH, &first, old, 4);
          CUEMM_CU(cuMemcpyDtoH, &last, old + old_size - 4, 4);
          if (first != old_tag || last != old_tag) ++errors;
          if (next() % 3 == 0) {
            std::lock_guard lock(handoff_mutex);
            handoff.emplace_back(old, old_size);
          } else if (next() % 2) {
            pool.deallocate(old, old_size, cuda::CU_STREAM_PER_THREAD);
          } else {
            pool.deallocate(old, old_size);
          }
        }
        std::pair<cuda::CUdeviceptr, std::size_t> theirs{0, 0};
        {
          std::lock_guard lock(handoff_mutex);
          if (!handoff.empty()) {
            theirs = handoff.back();
            handoff.pop_back();
          }
        }
        if (theirs.first) pool.deallocate(theirs.first, theirs.second, next() % 2 ? cuda::CU_STREAM_PER_THREAD : nullptr);
      }
      for (const Block& block : mine) pool.deallocate(block.address, block.size, cuda::CU_STREAM_LEGACY);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& [block, size] : handoff) pool.deallocate(block, size);
  EXPECT_EQ(errors.load(), 0) << "a block's contents changed while it was in use";
  EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
  const std::size_t reserved = pool.statistics().reserved_bytes;
  EXPECT_EQ(pool.trim(), reserved) << "some block did not come back";
}

// Each driver call the stream-ordered paths make fails once, at its first,
// second or third use: whatever the workload sees, the pool works afterwards
// and gives everything back.
TEST_F(Pool, AnyDriverCallFailingInTheStreamOrderedPathsLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  ScopedContext scope(context);
  cuda::CUstream user_stream = nullptr;
  CUEMM_CU(cuStreamCreate, &user_stream, cuda::CU_STREAM_NON_BLOCKING);
  const Stream owned_stream(&context, user_stream, true);
  const auto baseline = simulation::device_bytes_in_use(0);
  for (const std::string function : {"cuMemAlloc", "cuEventCreate", "cuEventRecord", "cuStreamWaitEvent",
                                     "cuEventQuery", "cuEventSynchronize", "cuStreamGetId", "cuStreamIsCapturing"}) {
    for (std::uint64_t nth = 1; nth <= 3; ++nth) {
      SCOPED_TRACE(function + " failing at call " + std::to_string(nth));
      {
        PoolMemoryManager pool(&context);
        pool.initialize();
        simulation::inject_fault(function, nth, cuda::CUDA_ERROR_UNKNOWN);
        std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> held;
        try {
          for (int i = 0; i < 40; ++i) {
            const std::size_t size = std::size_t{1} << (8 + i % 16);  // 256 B to 8 MiB
            const cuda::CUstream stream = i % 3 == 0 ? user_stream : cuda::CU_STREAM_PER_THREAD;
            held.emplace_back(pool.allocate(size, stream), size);
            if (i % 2 == 0) {
              pool.deallocate(held.front().first, held.front().second, stream);
              held.erase(held.begin());
            }
          }
        } catch (const Error&) {
          // Whatever failed said so with an exception; the checks below matter.
        }
        simulation::clear_faults();
        for (const auto& [block, size] : held) pool.deallocate(block, size, cuda::CU_STREAM_PER_THREAD);
        EXPECT_EQ(pool.statistics().in_use_bytes, 0u);
        const cuda::CUdeviceptr block = pool.allocate(1 << 20, cuda::CU_STREAM_PER_THREAD);
        CUEMM_CU(cuMemsetD32, block, 5u, (1 << 20) / 4);
        std::uint32_t last = 0;
        CUEMM_CU(cuMemcpyDtoH, &last, block + (1 << 20) - 4, 4);
        EXPECT_EQ(last, 5u);
        pool.deallocate(block, 1 << 20, cuda::CU_STREAM_PER_THREAD);
      }
      context.synchronize();
      EXPECT_EQ(simulation::device_bytes_in_use(0), baseline) << "the pool left device memory behind";
    }
  }
}
