// Stream-safe reuse (Note [Stream-safe reuse]): a freed block waits for the GPU
// work queued before its free; seals, graph captures, and growth rather than a
// wait while the GPU is busy.
#include <mutex>
#include <string>

#include "cuemm/managers/detail/replay_clock.hpp"
#include "pool_test.hpp"
#include "support/host_allocation_faults.hpp"

using namespace cuemm;
using cuemm::testing::HeldKernel;
using cuemm::testing::Pool;

TEST_F(Pool, AFreedBlockIsNotReusedWhileQueuedWorkMayStillWriteIt) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  const cuemm::testing::ReuseRace race = cuemm::testing::run_reuse_race(context, pool);
  EXPECT_TRUE(race.b_intact) << "the kernel's late write landed in the reused block";
  EXPECT_NE(race.b, race.a) << "A was handed out again before the kernel finished";
}

// The quarantine-fallback tests' pool, with thread caches of the size given,
// its 4 KiB blocks, each written with nines as it is handed out (a held
// kernel's late write shows in one as other words), and the streams for
// that kernel and the copies.
namespace {
constexpr std::uint64_t kSmallWords = (std::size_t{4} << 10) / sizeof(std::uint32_t);

PoolOptions with_thread_caches_of(std::size_t bytes) {
  PoolOptions options;
  options.thread_cache_size = bytes;
  return options;
}

struct WrittenBlocks {
  WrittenBlocks(Context& context, std::size_t thread_cache_size, int count)
      : pool(&context, with_thread_caches_of(thread_cache_size)),
        kernel_stream(context.create_stream()),
        copy_stream(context.create_stream()) {
    pool.initialize();
    take(count);
  }
  void take(int count) {
    for (int i = 0; i < count; ++i) {
      blocks.push_back(pool.memalloc(kSmallWords * sizeof(std::uint32_t)));
      DeviceArray<std::uint32_t>(blocks.back(), kSmallWords).copy_to_device(nines, copy_stream);
    }
    copy_stream.synchronize();
  }
  long overwritten() const {
    return std::count_if(blocks.begin(), blocks.end(), [&](const auto& block) {
      return DeviceArray<std::uint32_t>(block, kSmallWords).copy_to_host() != nines;
    });
  }

  const std::vector<std::uint32_t> nines = std::vector<std::uint32_t>(kSmallWords, 9u);
  PoolMemoryManager pool;
  const Stream kernel_stream;
  const Stream copy_stream;
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
};
}  // namespace

// A freed block that the quarantine has no host memory to take in (its
// deque grows a chunk only now and then, so every allocation fails here)
// waits for the GPU's work queued before its free, rather than going back
// to the index under that work: the frees of blocks that a held kernel may
// still write return only once it has finished, and the blocks asked for
// and written right after keep what was written (the kernel writes the
// block freed last, which without the thread caches is sure to find the
// quarantine full). Nothing is lost on the way: the pool counts no block
// in use once all are freed. With the thread caches (the spilled halves of
// full rings) and without them (each free goes to the quarantine).
TEST_F(Pool, AFreedBlockWithoutRoomInTheQuarantineWaitsForQueuedWorkBeforeReuse) {
  if (!cuemm::testing::host_allocation_faults_reach_the_library())
    GTEST_SKIP() << "the library keeps a C++ runtime of its own here: the test's operator new cannot fail its "
                    "allocations";
  constexpr int kBlocks = 2048;  // (4x a ring's most: rings fill, and spill)
  for (const std::size_t thread_cache_size : {std::size_t{0}, PoolOptions{}.thread_cache_size}) {
    SCOPED_TRACE("thread caches of " + std::to_string(thread_cache_size) + " bytes");
    WrittenBlocks written(context, thread_cache_size, kBlocks);
    std::uint64_t failures = 0;
    bool kernel_finished_when_freed = false;
    {
      HeldKernel kernel(context, written.kernel_stream, written.blocks.back()->device_pointer(), 7u, kSmallWords);
      kernel.waited_for_by([&] {
        {
          cuemm::testing::EveryHostAllocationFails no_host_memory;
          written.blocks.clear();
          failures = no_host_memory.failures();
        }
        kernel_finished_when_freed = kernel.finished();
        written.take(kBlocks);
      });
    }
    EXPECT_GT(failures, 0u) << "no host allocation was tried: the quarantine never grew";
    EXPECT_TRUE(kernel_finished_when_freed) << "the frees returned with the kernel still running";
    EXPECT_EQ(written.overwritten(), 0) << "the kernel's late write landed in a block handed out again";
    written.blocks.clear();
    EXPECT_EQ(written.pool.statistics().in_use_bytes, 0u) << "a block freed without room in the quarantine was lost";
  }
}

// Where the GPU cannot be waited for either (the driver refuses here; a
// capture would too), such a block stays out of use until the pool's
// reset, counted as in use: never handed out while the kernel may write it.
TEST_F(Pool, AFreedBlockWithoutRoomInTheQuarantineOrAWaitStaysOutOfUseUntilAReset) {
  CUEMM_REQUIRE_SIMULATION("fault injection");  // (refuses the driver's waits)
  if (!cuemm::testing::host_allocation_faults_reach_the_library())
    GTEST_SKIP() << "the library keeps a C++ runtime of its own here: the test's operator new cannot fail its "
                    "allocations";
  constexpr int kBlocks = 256;
  WrittenBlocks written(context, /*thread_cache_size=*/0, kBlocks);  // (each free to the quarantine)
  bool kernel_running_when_freed = false;
  std::size_t in_use_once_freed = 0;
  {
    HeldKernel kernel(context, written.kernel_stream, written.blocks.back()->device_pointer(), 7u, kSmallWords);
    kernel.waited_for_by([&] {
      cuemm::testing::refuse_the_next_seals(4 * kBlocks);
      simulation::inject_fault("cuEventSynchronize", 1, cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 4 * kBlocks);
      {
        cuemm::testing::EveryHostAllocationFails no_host_memory;
        written.blocks.clear();
      }
      simulation::clear_faults();
      kernel_running_when_freed = !kernel.finished();
      in_use_once_freed = written.pool.statistics().in_use_bytes;
      written.take(kBlocks);
    });
  }
  EXPECT_TRUE(kernel_running_when_freed) << "the frees waited for the kernel, though the driver refused";
  EXPECT_GT(in_use_once_freed, 0u) << "no block was kept out of use";
  EXPECT_EQ(written.overwritten(), 0) << "the kernel's late write landed in a block handed out again";
  written.blocks.clear();
  EXPECT_EQ(written.pool.statistics().in_use_bytes, in_use_once_freed)
      << "the blocks kept out came back before a reset";
  written.pool.reset();
  EXPECT_EQ(written.pool.statistics().in_use_bytes, 0u) << "the reset left blocks counted in use";
}

// A block with a segment of its own is sealed at its free, and B may be A
// once the pool has waited for the kernel (waiting costs less than a new
// segment); the legacy stream must read as busy while the kernel runs on
// another stream.
TEST_F(Pool, AFreedLargeBlockIsNotReusedWhileQueuedWorkMayStillWriteIt) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  const cuemm::testing::ReuseRace race = cuemm::testing::run_reuse_race(context, pool, std::uint64_t{4} << 20);
  EXPECT_TRUE(race.b_intact) << "the kernel's late write landed in the reused block";
}

// A large block freed by a thread that did not take it, while another
// thread worked in the pool last, is queued for that thread (Note [Large
// frees from another thread]); it still waits for the work queued before
// its free: at 2 MiB (a block of the shared segments) and at 4 MiB (one
// with a segment of its own).
TEST_F(Pool, ALargeBlockFreedByAnotherThreadIsNotReusedWhileQueuedWorkMayStillWriteIt) {
  for (const std::uint64_t words : {std::uint64_t{1} << 19, std::uint64_t{1} << 20}) {
    SCOPED_TRACE(std::to_string(words * 4) + " bytes");
    PoolMemoryManager pool(&context);
    pool.initialize();
    const cuemm::testing::ReuseRace race =
        cuemm::testing::run_reuse_race(context, pool, words, /*non_blocking=*/false, /*released_by_another_thread=*/true);
    EXPECT_TRUE(race.b_intact) << "the kernel's late write landed in the reused block";
    EXPECT_EQ(pool.statistics().queued_large_frees, 1u) << "A's free did not go through the queue";
  }
}

// Note [Classes a thread frees for others]: once a loader's class is given
// to the thread that frees its blocks, that thread's frees of it go to the
// pool's queue without a seal of their own; such a block still waits for the
// GPU work queued before its free. This thread hands 1 MiB blocks to a
// freeing thread until their class is given to it, then takes every block
// the pool's maximum allows, and hands the freeing thread one of them, A,
// which a held kernel writes: B, asked for meanwhile, can only be A, and
// must wait for the kernel.
TEST_F(Pool, ASmallBlockFreedForOthersIsNotReusedWhileQueuedWorkMayStillWriteIt) {
  constexpr std::size_t kSize = detail::kLargestCachedSize;
  constexpr std::uint64_t kWords = kSize / sizeof(std::uint32_t);
  PoolOptions options;
  options.maximum_size = std::size_t{96} << 20;
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  using Batch = std::vector<std::shared_ptr<MemoryPointer>>;
  cuemm::testing::BatchPipeline<Batch> pipeline;
  std::atomic<std::size_t> batches_freed{0};
  std::thread freer([&] {
    ScopedContext scope(context);
    while (auto batch = pipeline.pop()) {
      batch->clear();
      batches_freed.fetch_add(1);
      batches_freed.notify_all();
    }
  });
  std::size_t batches_handed = 0;
  auto hand_over_and_wait = [&](Batch batch) {
    pipeline.push(std::move(batch));
    ++batches_handed;
    for (std::size_t freed = batches_freed.load(); freed < batches_handed; freed = batches_freed.load())
      batches_freed.wait(freed);
  };
  for (int round = 0; round < 200 && pool.statistics().queued_small_frees == 0; ++round) {
    Batch batch;
    for (int i = 0; i < 16; ++i) batch.push_back(pool.memalloc(kSize));
    hand_over_and_wait(std::move(batch));
  }
  const std::size_t queued_before_a = pool.statistics().queued_small_frees;
  EXPECT_GT(queued_before_a, 0u) << "the class was never given to the freeing thread";

  Batch everything;  // the pool's every block of the size, up to its maximum
  for (;;) {
    try {
      everything.push_back(pool.memalloc(kSize));
    } catch (const OutOfMemory&) {
      break;
    }
  }
  ASSERT_FALSE(everything.empty());
  Stream kernel_stream = context.create_stream();
  Stream copy_stream = context.create_stream();
  const cuda::CUdeviceptr a_address = everything.back()->device_pointer();
  std::shared_ptr<MemoryPointer> b;
  const std::vector<std::uint32_t> nines(kWords, 9u);
  {
    HeldKernel kernel(context, kernel_stream, a_address, 7u, kWords);
    Batch only_a{std::move(everything.back())};
    everything.pop_back();
    hand_over_and_wait(std::move(only_a));
    EXPECT_EQ(pool.statistics().queued_small_frees, queued_before_a + 1) << "A's free did not go through the queue";
    kernel.waited_for_by([&] {
      b = pool.memalloc(kSize);
      DeviceArray<std::uint32_t>(b, kWords).copy_to_device(nines, copy_stream);
      copy_stream.synchronize();
    });
  }
  pipeline.close();
  freer.join();
  EXPECT_EQ(b->device_pointer(), a_address) << "B is not A: the pool had room for another block";
  EXPECT_TRUE(DeviceArray<std::uint32_t>(b, kWords).copy_to_host() == nines)
      << "the kernel's late write landed in the reused block";
}

// Note [Growth while the GPU is busy]: with a kernel queued, giving spares
// back (cuMemFree) or waiting for freed blocks would wait for it, so growth
// past the peak does neither, up to an eighth of the peak; once the GPU is
// idle, the next growth past the peak gives the spares back.
TEST_F(Pool, GrowthPastThePeakDoesNotWaitForTheGpuWhileItIsBusy) {
  // The kernel on a blocking stream, then on a non-blocking one, which the
  // legacy stream reads as idle: the pool reads the whole context where the
  // driver records events for it (CUDA 12.5).
  const bool every_stream = cuemm::testing::context_events_work(context);
  for (const bool non_blocking : {false, true}) {
    if (non_blocking && !every_stream) continue;  // (the legacy stream's reading: idle)
    SCOPED_TRACE(non_blocking ? "a kernel on a non-blocking stream" : "a kernel on a blocking stream");
    growth_past_the_peak_while_busy(context.create_stream(non_blocking));
  }
}

void Pool::growth_past_the_peak_while_busy(const Stream& stream) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  auto at_peak_with_spares = [&](PoolMemoryManager& pool) {
    pool.initialize();
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 16; ++i) blocks.push_back(pool.memalloc(8 * kMiB));
    blocks.clear();  // freed: 128 MiB, the peak
    return pool.statistics();
  };

  PoolMemoryManager pool(&context);
  const PoolStatistics at_peak = at_peak_with_spares(pool);
  ASSERT_EQ(at_peak.reserved_bytes, 128 * kMiB);
  auto target = pool.memalloc(8 * kMiB);
  std::shared_ptr<MemoryPointer> busy;
  {
    HeldKernel kernel(context, stream, target->device_pointer(), 1u, 32);
    // No freed block holds it: 12 MiB past the peak.
    EXPECT_FALSE(kernel.waited_for_by([&] { busy = pool.memalloc(12 * kMiB); })) << "the pool waited for the kernel";
  }
  const PoolStatistics grown = pool.statistics();
  EXPECT_EQ(grown.driver_frees, at_peak.driver_frees) << "a spare went back (cuMemFree) while the kernel ran";
  EXPECT_GE(grown.gpu_waits_avoided, 1u);
  EXPECT_EQ(grown.reserved_bytes, 140 * kMiB);
  // Idle: past the peak again, the spares go back.
  auto idle = pool.memalloc(14 * kMiB);
  const PoolStatistics after = pool.statistics();
  EXPECT_GT(after.driver_frees, at_peak.driver_frees);
  EXPECT_EQ(after.gpu_waits_avoided, grown.gpu_waits_avoided);
  EXPECT_LE(after.reserved_bytes, 128 * kMiB);

  // Past the overshoot allowed, the pool waits and gives back even while the GPU is busy.
  auto expect_it_waits = [&](PoolOptions options, std::size_t request) {
    PoolMemoryManager other(&context, options);
    const PoolStatistics other_peak = at_peak_with_spares(other);
    auto other_target = other.memalloc(8 * kMiB);
    std::shared_ptr<MemoryPointer> waited;
    HeldKernel kernel(context, stream, other_target->device_pointer(), 1u, 32);
    EXPECT_TRUE(kernel.waited_for_by([&] { waited = other.memalloc(request); })) << request;
    EXPECT_GT(other.statistics().driver_frees, other_peak.driver_frees) << request;
    EXPECT_EQ(other.statistics().gpu_waits_avoided, 0u) << request;
    EXPECT_LE(other.statistics().reserved_bytes, 128 * kMiB) << request;
  };
  expect_it_waits(PoolOptions{}, 24 * kMiB);  // past an eighth
  PoolOptions strict;
  strict.busy_overshoot = 0;
  expect_it_waits(strict, 12 * kMiB);
}

// A wait forced while the GPU is busy (past the room of an eighth) doubles
// the room for the next growth, and the GPU read idle at such a decision
// narrows it again.
TEST_F(Pool, TheRoomPastThePeakWidensWhileTheGpuStaysBusy) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  Stream stream = context.create_stream();
  DeviceArray<std::uint32_t> words(32, context);
  PoolMemoryManager pool(&context);
  pool.initialize();
  // Blocks of 8 MiB up to 128 MiB reserved, then freed: the peak, with spares
  // that no larger request fits.
  auto to_the_peak_with_spares = [&] {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    while (pool.statistics().reserved_bytes < 128 * kMiB) blocks.push_back(pool.memalloc(8 * kMiB));
  };
  to_the_peak_with_spares();
  ASSERT_EQ(pool.statistics().reserved_bytes, 128 * kMiB);
  // A request while a kernel is held: whether the pool waited for it (gave
  // spares back or waited for freed blocks) rather than grow beside it.
  auto waits_for = [&](HeldKernel& kernel, std::shared_ptr<MemoryPointer>& block, std::size_t bytes) {
    const PoolStatistics before = pool.statistics();
    const bool waited = kernel.waited_for_by([&] { block = pool.memalloc(bytes); });
    EXPECT_EQ(pool.statistics().gpu_waits_avoided == before.gpu_waits_avoided, waited)
        << bytes / kMiB << " MiB: the pool grew beside the kernel and waited for it too, or did neither";
    return waited;
  };
  std::shared_ptr<MemoryPointer> first, second, third;
  {
    // 24 MiB past the peak is past an eighth: it waits, and the room widens.
    HeldKernel kernel(context, stream, words.device_pointer(), 1u, 32);
    EXPECT_TRUE(waits_for(kernel, first, 24 * kMiB));
  }
  EXPECT_LE(pool.statistics().reserved_bytes, 128 * kMiB);
  {
    // The GPU busy again before the pool decides anything (a decision that
    // found it idle would narrow the room): within a quarter now, the next
    // 24 MiB past the peak grows without a wait.
    HeldKernel kernel(context, stream, words.device_pointer(), 1u, 32);
    to_the_peak_with_spares();
    EXPECT_FALSE(waits_for(kernel, second, 24 * kMiB))
        << "the room did not widen after a wait forced while the GPU was busy";
    EXPECT_EQ(pool.statistics().reserved_bytes, 152 * kMiB);
  }
  // The GPU idle at the next such decision: the room is an eighth again.
  second.reset();
  auto idle = pool.memalloc(32 * kMiB);
  EXPECT_LE(pool.statistics().reserved_bytes, 128 * kMiB);
  idle.reset();
  {
    HeldKernel kernel(context, stream, words.device_pointer(), 1u, 32);
    to_the_peak_with_spares();
    EXPECT_TRUE(waits_for(kernel, third, 24 * kMiB)) << "the room stayed wide after the GPU read idle";
  }
}

// On a non-blocking stream, which the legacy stream does not wait for: where
// the driver records an event for the whole context (CUDA 12.5), seals cover
// its work too, as cuMemFree waits for it.
TEST_F(Pool, AFreedBlockIsNotReusedWhileANonBlockingStreamsWorkMayStillWriteIt) {
  if (!cuemm::testing::context_events_work(context))
    GTEST_SKIP() << "the driver records no event for a whole context (cuCtxRecordEvent, CUDA 12.5): seals cover the "
                    "legacy stream's work only, and a free must follow a non-blocking stream's synchronisation";
  for (const std::uint64_t count : {std::uint64_t{1} << 18, std::uint64_t{4} << 20}) {
    PoolMemoryManager pool(&context);
    pool.initialize();
    const cuemm::testing::ReuseRace race = cuemm::testing::run_reuse_race(context, pool, count, /*non_blocking=*/true);
    EXPECT_TRUE(race.b_intact) << count * 4 << " bytes: the kernel's late write landed in the reused block";
  }
}

// Without cuCtxRecordEvent (a driver before CUDA 12.5; here the simulated one
// refusing it), seals query and record on the legacy stream, and a
// stream-ordered free on a non-blocking stream with work queued makes the
// legacy stream wait for that work (one with nothing queued, no wait: such
// waits kept the legacy stream reading busy, and the pool grew rather than
// reuse); with it, seals record for the context and such a free costs no
// driver call.
TEST_F(Pool, SealsCoverTheLegacyStreamWhereTheDriverCannotRecordForTheContext) {
  CUEMM_REQUIRE_SIMULATION("fault injection and call counters");  // (counts the driver's calls and refuses one)
  ScopedContext scope(context);
  const Stream stream = context.create_stream(/*non_blocking=*/true);
  // (Where this run refuses the call throughout, only the second half applies.)
  const bool available = cuemm::testing::context_events_work(context);
  for (const bool refused : {false, true}) {
    if (!refused && !available) continue;
    SCOPED_TRACE(refused ? "cuCtxRecordEvent refused" : "cuCtxRecordEvent available");
    simulation::reset_call_counts();  // (before the fault: it counts from the calls so far)
    if (refused) simulation::inject_fault("cuCtxRecordEvent", 1, cuda::CUDA_ERROR_NOT_SUPPORTED, ~std::uint64_t{0});
    PoolMemoryManager pool(&context, with_thread_cache(0));
    pool.initialize();
    const cuda::CUdeviceptr idle_block = pool.allocate(1 << 20, stream.handle());
    const cuda::CUdeviceptr busy_block = pool.allocate(1 << 20, stream.handle());
    std::uint64_t waits_before = simulation::call_count("cuStreamWaitEvent");
    pool.deallocate(idle_block, 1 << 20, stream.handle());
    EXPECT_EQ(simulation::call_count("cuStreamWaitEvent") - waits_before, 0u)
        << "the legacy stream made to wait for a stream with nothing queued";
    {
      HeldKernel kernel(context, stream);
      waits_before = simulation::call_count("cuStreamWaitEvent");
      pool.deallocate(busy_block, 1 << 20, stream.handle());
      EXPECT_EQ(simulation::call_count("cuStreamWaitEvent") - waits_before, refused ? 1u : 0u);
    }
    auto other = pool.memalloc(4 << 20);
    other.reset();
    pool.trim();  // seals
    EXPECT_GT(simulation::call_count(refused ? "cuStreamQuery" : "cuCtxRecordEvent"), 0u);
    if (!refused) {
      EXPECT_EQ(simulation::call_count("cuStreamQuery"), 0u);
    }
    simulation::clear_faults();
  }
}

// A seal that can neither record an event nor synchronise (the driver
// refuses both while a graph is being captured, say) leaves its frees unsafe:
// the work queued before them may still run. The next seal covers them, also
// one asked for that closed epoch. (Before, such a seal marked them safe
// without having waited.)
TEST_F(Pool, ASealThatCannotWaitForTheGpuLeavesItsFreesUnsafe) {
  CUEMM_REQUIRE_SIMULATION("fault injection");  // (refuses the driver's calls)
  ScopedContext scope(context);
  detail::ReuseEpochs epochs(&context);
  (void)epochs.covers_every_stream();  // (asked of the driver before the refusals)
  const std::uint64_t freed = epochs.tag();
  cuemm::testing::refuse_the_next_seals(2);
  ::testing::internal::CaptureStderr();
  epochs.seal();
  const std::uint64_t freed_later = epochs.tag();
  epochs.seal();
  const std::string said = ::testing::internal::GetCapturedStderr();
  simulation::clear_faults();
  epochs.poll(true);
  EXPECT_FALSE(epochs.is_safe(freed));
  EXPECT_FALSE(epochs.is_safe(freed_later));
  // Said once, not at every such seal (a captured graph's whole length).
  const std::string why = "cannot record a reuse event";
  ASSERT_NE(said.find(why), std::string::npos) << said;
  EXPECT_EQ(said.find(why, said.find(why) + 1), std::string::npos) << said;
  // As a pool asks for that free again: a new seal, though its epoch is closed.
  epochs.seal_through(freed);
  epochs.poll(true);
  EXPECT_TRUE(epochs.is_safe(freed));
  EXPECT_TRUE(epochs.is_safe(freed_later));
  epochs.retire();
}

// A seal asked for while another thread holds the epochs (here, waiting for
// the GPU) rides on that thread's work: where it covers the epoch asked for,
// no second seal. (A hand-over's allocating thread slept behind the freeing
// thread's seal, then sealed again.) With the epochs free, it seals as seal().
TEST_F(Pool, ASealAskedForWhileAnotherThreadHoldsTheEpochsRidesOnItsWork) {
  CUEMM_REQUIRE_SIMULATION("call counters");  // (sees the other thread wait in the driver)
  ScopedContext scope(context);
  const Stream stream = context.create_stream();
  detail::ReuseEpochs epochs(&context);
  HeldKernel kernel(context, stream);
  const std::uint64_t freed = epochs.tag();
  epochs.seal();
  ASSERT_FALSE(epochs.is_safe(freed)) << "the seal's event completed under a held kernel";
  const std::uint64_t freed_later = epochs.tag();
  const std::uint64_t seals_before = epochs.seals();
  simulation::reset_call_counts();
  std::thread waiter([&] { epochs.poll(/*wait=*/true); });  // (holds the epochs until the kernel ends)
  while (simulation::call_count("cuEventSynchronize") == 0) std::this_thread::yield();
  kernel.waited_for_by([&] { epochs.seal_or_join(freed); }, std::chrono::milliseconds(100));
  waiter.join();
  EXPECT_TRUE(epochs.is_safe(freed));
  EXPECT_EQ(epochs.seals(), seals_before) << "a second seal for an epoch that the other thread's covered";
  EXPECT_FALSE(epochs.is_sealed(freed_later));
  epochs.seal_or_join(freed);
  EXPECT_TRUE(epochs.is_sealed(freed_later)) << "with the epochs free, the open epoch was not sealed";
  epochs.retire();
}

// While a CaptureScope is open, the pool (and its pinned host pool) makes
// none of the calls that end a graph capture (bench/probes/probe_capture.cpp):
// no seal, no wait, no synchronisation, no ordering on the legacy stream. It grows instead, its
// calls under a relaxed capture mode; after the scope the blocks freed in
// it are sealed and reused.
TEST_F(Pool, WhileAGraphIsCapturedThePoolSealsNothingAndWaitsForNothing) {
  CUEMM_REQUIRE_SIMULATION("call counters");  // (counts the driver's calls)
  ScopedContext scope(context);
  PoolMemoryManager pool(&context);
  pool.initialize();
  const Stream stream = context.create_stream(/*non_blocking=*/true);
  // Pairs of small and large sizes, stream-less and on the stream, and a few
  // blocks held: a workload that seals, and more of it each round.
  auto workload = [&](int held) {
    std::vector<std::shared_ptr<MemoryPointer>> kept;
    for (int i = 0; i < 2000; ++i) {
      pool.memalloc(std::size_t{256} << (i % 13)).reset();
      pool.memhostalloc(std::size_t{4096} << (i % 9), false, false, false).reset();  // (the pinned host pool's seals too)
      pool.deallocate(pool.allocate(std::size_t{1} << 20, stream.handle()), std::size_t{1} << 20, stream.handle());
      if (i % 100 == 0) kept.push_back(pool.memalloc(std::size_t{3} << 20));
    }
    for (int i = 0; i < held; ++i) kept.push_back(pool.memalloc(std::size_t{5} << 20));
  };
  workload(0);
  const std::size_t seals_before = pool.statistics().seals;
  simulation::reset_call_counts();
  {
    CaptureScope capture(context);
    workload(16);  // (past the peak: the pool grows)
    for (const char* call : {"cuCtxRecordEvent", "cuStreamQuery", "cuEventRecord", "cuEventSynchronize",
                             "cuCtxSynchronize", "cuStreamSynchronize", "cuStreamWaitEvent"})
      EXPECT_EQ(simulation::call_count(call), 0u) << call << " while a graph is captured";
    EXPECT_GT(simulation::call_count("cuMemAlloc"), 0u);
    EXPECT_GE(simulation::call_count("cuThreadExchangeStreamCaptureMode"), 2 * simulation::call_count("cuMemAlloc"))
        << "a driver allocation without the thread's capture mode relaxed";
    EXPECT_EQ(pool.statistics().seals, seals_before);
  }
  workload(16);  // the scope's frees, sealed now, serve it
  EXPECT_GT(pool.statistics().seals, seals_before);
  simulation::reset_call_counts();
  workload(16);
  EXPECT_EQ(simulation::call_count("cuMemAlloc"), 0u) << "the blocks freed while captured were not reused after";
  EXPECT_EQ(simulation::call_count("cuThreadExchangeStreamCaptureMode"), 0u);
}

// A graph captured in the global mode (which forbids allocations
// and frees to every thread) from kernels that fill blocks of the pool,
// while this thread and another allocate and free beside the kernels, after
// frees that the pool would have sealed for. Announced by a CaptureScope, the
// capture survives and the graph's launch fills the blocks; unannounced, the
// pool ends it (the premise of the scope).
TEST_F(Pool, AGraphCapturedWhileThePoolServesThreadsSurvivesAndRuns) {
  const auto& api = driver::Driver::get().api();
  if (!api.cuStreamBeginCapture || !api.cuGraphInstantiate)
    GTEST_SKIP() << "needs a driver that captures graphs (CUDA 11.4)";
  ScopedContext scope(context);
  PoolMemoryManager pool(&context);
  pool.initialize();
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const Stream stream = context.create_stream(true);
  auto churn = [&](int pairs) {
    for (int i = 0; i < pairs; ++i) {
      pool.memalloc(std::size_t{256} << (i % 13)).reset();
      pool.memalloc(std::size_t{5} << 20).reset();
      pool.memhostalloc(std::size_t{4096} << (i % 9), false, false, false).reset();  // (the pinned host pool)
    }
  };
  constexpr int kBlocks = 24;
  auto words_of = [](int i) { return std::size_t{1} << (10 + i % 12); };
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  // Captures the fills of kBlocks new blocks; returns cuStreamEndCapture's
  // result, and in `refused` what the pool threw (the driver refuses its
  // calls during an unannounced capture), the first message in `why`.
  std::mutex why_mutex;
  std::string why;
  auto refusal = [&](const CudaError& error) {
    std::lock_guard lock(why_mutex);
    if (why.empty()) why = error.what();
  };
  auto capture = [&](cuda::CUgraph& graph, std::atomic<int>& refused) {
    churn(2000);  // frees not yet sealed for
    blocks.clear();
    CUEMM_CU(cuStreamBeginCapture, stream.handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
    std::thread other([&] {
      try {
        ScopedContext other_scope(context);
        // (Not 2000: what is freed during the scope is reused only after it,
        // and 2000 pairs of 5 MiB would take 10 GiB of a simulated device of 16.)
        churn(300);
        std::vector<std::shared_ptr<MemoryPointer>> held;
        for (int i = 0; i < 16; ++i) held.push_back(pool.memalloc(std::size_t{7} << 20));  // (growth)
      } catch (const CudaError& error) {
        refusal(error);
        ++refused;
      }
    });
    try {
      for (int i = 0; i < kBlocks; ++i) {
        blocks.push_back(pool.memalloc(words_of(i) * 4));
        module.function("cuemm_fill_u32")
            .launch({64}, {256}, stream, blocks.back()->device_pointer(), static_cast<std::uint32_t>(i + 1),
                    static_cast<std::uint64_t>(words_of(i)));
        churn(10);
      }
    } catch (const CudaError& error) {
      refusal(error);
      ++refused;
    }
    other.join();
    return CUEMM_CU_RESULT(cuStreamEndCapture, stream.handle(), &graph);
  };

  cuda::CUgraph graph = nullptr;
  std::atomic<int> refused{0};
  const cuda::CUresult unannounced = capture(graph, refused);
  EXPECT_NE(unannounced, cuda::CUDA_SUCCESS) << "a capture survived the pool without a CaptureScope";
  // What the pool's callers were told names the remedy.
  if (refused > 0) {
    EXPECT_NE(why.find("cuemm::CaptureScope"), std::string::npos) << why;
  }
  if (graph) CUEMM_CU(cuGraphDestroy, std::exchange(graph, nullptr));
  refused = 0;
  {
    CaptureScope scope_of_capture(context);
    const cuda::CUresult announced = capture(graph, refused);
    ASSERT_EQ(announced, cuda::CUDA_SUCCESS) << "the pool ended an announced capture (901: invalidated)";
  }
  ASSERT_EQ(refused.load(), 0) << "the driver refused the pool's calls during an announced capture";
  ASSERT_EQ(blocks.size(), std::size_t{kBlocks});
  cuda::CUgraphExec executable = nullptr;
  CUEMM_CU(cuGraphInstantiate, &executable, graph, 0);
  CUEMM_CU(cuGraphLaunch, executable, stream.handle());
  stream.synchronize();
  for (int i = 0; i < kBlocks; ++i) {
    std::vector<std::uint32_t> host(words_of(i));
    CUEMM_CU(cuMemcpyDtoH, host.data(), blocks[i]->device_pointer(), words_of(i) * 4);
    EXPECT_EQ(std::count(host.begin(), host.end(), static_cast<std::uint32_t>(i + 1)),
              static_cast<std::ptrdiff_t>(words_of(i)))
        << "block " << i;
  }
  CUEMM_CU(cuGraphExecDestroy, executable);
  CUEMM_CU(cuGraphDestroy, graph);
  const std::size_t seals = pool.statistics().seals;
  churn(2000);  // and the pool goes on, sealing again
  EXPECT_GT(pool.statistics().seals, seals);
}

// Where the pool must wait for freed blocks, it waits for the oldest epochs
// only until one fits: a block freed behind a short kernel comes back while
// a long kernel queued after it still runs (before, the wait was for all).
TEST_F(Pool, AWaitForFreedBlocksWaitsOnlyForTheEpochsItNeeds) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  PoolOptions options;
  options.thread_cache_size = 0;  // frees go to the quarantine
  options.busy_overshoot = 0;     // at the peak, it waits
  PoolMemoryManager pool(&context, options);
  pool.initialize();
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  Stream short_stream = context.create_stream(), long_stream = context.create_stream();
  // Each kernel fills words of its own: the two run side by side.
  DeviceArray<std::uint32_t> target(64, context);
  // Nine blocks with segments of their own (the peak: 72 MiB); the free that
  // makes eight wait for the GPU seals them (allocate_dedicated()'s rotation).
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 9; ++i) blocks.push_back(pool.memalloc(8 * kMiB));
  std::set<std::uintptr_t> behind_short;
  module.function("cuemm_spin_fill_u32")
      .launch({1}, {32}, short_stream, target.device_pointer(), 1u, std::uint64_t{32}, std::uint64_t{50'000'000});
  for (int i = 0; i < 8; ++i) {
    behind_short.insert(blocks[i]->device_pointer());
    blocks[i].reset();
  }
  HeldKernel long_kernel(context, long_stream, target.device_pointer() + 128, 1u, 32);
  blocks[8].reset();  // behind both
  std::shared_ptr<MemoryPointer> again;
  EXPECT_FALSE(long_kernel.waited_for_by([&] { again = pool.memalloc(8 * kMiB); }))
      << "the pool waited for the held kernel, which the block it took was not behind";
  EXPECT_TRUE(behind_short.count(again->device_pointer()));
  EXPECT_EQ(pool.statistics().reserved_bytes, 72 * kMiB);
}

namespace {

// RMM's workload up to 4 MiB with 128 MiB live (seed 1) through `pool`'s
// memalloc, under a replay clock that starts at `from` and moves `step`
// before each operation: the seals the pool made meanwhile (its blocks' frees
// at the end too) and the most it reserved.
struct PacedRun {
  std::size_t seals = 0, peak_reserved = 0;
};
PacedRun replay_paced(PoolMemoryManager& pool, std::chrono::steady_clock::duration from,
                      std::chrono::nanoseconds step) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  static const auto operations = workload::random_operations(4 * kMiB, 20000, 128 * kMiB, 1);
  std::atomic<std::int64_t> ticks{from.count()};
  detail::replay_clock.store(&ticks);
  const std::size_t seals_before = pool.statistics().seals;
  PacedRun run;
  {
    std::unordered_map<std::uint64_t, std::shared_ptr<MemoryPointer>> live;
    for (const auto& operation : operations) {
      ticks.fetch_add(std::chrono::duration_cast<std::chrono::steady_clock::duration>(step).count());
      if (operation.allocate) live.emplace(operation.id, pool.memalloc(operation.size));
      else live.erase(operation.id);
      run.peak_reserved = std::max(run.peak_reserved, pool.statistics().reserved_bytes);
    }
  }
  run.seals = pool.statistics().seals - seals_before;
  detail::replay_clock.store(nullptr);
  return run;
}

}  // namespace

// The pool's seals go by detail::replay_clock where one is set (the tool's
// --pace): the same operations at the same pace seal at the same points and
// reserve the same peak, and a clock that does not move seals less often
// than one that moves a microsecond an operation (at most one seal every
// kSealInterval, 2 us; simulated driver, whose seals complete at once).
TEST_F(Pool, SealsGoByTheReplayClockWhereOneIsSet) {
  CUEMM_REQUIRE_SIMULATION("seals, which complete as soon as they are made");
  auto run = [&](std::chrono::nanoseconds step) {
    PoolMemoryManager pool(&context);
    pool.initialize();
    return replay_paced(pool, std::chrono::steady_clock::now().time_since_epoch(), step);
  };
  using std::chrono::nanoseconds;
  const PacedRun paced = run(nanoseconds(1000)), again = run(nanoseconds(1000)), frozen = run(nanoseconds(0));
  EXPECT_EQ(paced.seals, again.seals);
  EXPECT_EQ(paced.peak_reserved, again.peak_reserved);
  EXPECT_LT(frozen.seals, paced.seals / 2) << "a clock that stood still did not hold back the pool's seals";
}

// A pool that outlives a replay's clock: its latest seal, made an hour ahead
// of the clock that follows, does not hold its seals back for that hour.
TEST_F(Pool, ASealMadeAheadByAnEarlierClockDoesNotHoldBackTheNextOnes) {
  CUEMM_REQUIRE_SIMULATION("seals, which complete as soon as they are made");
  const auto start = std::chrono::steady_clock::now().time_since_epoch();
  const std::chrono::microseconds step(1);
  PoolMemoryManager fresh(&context);
  fresh.initialize();
  const std::size_t alone = replay_paced(fresh, start, step).seals;
  PoolMemoryManager pool(&context);
  pool.initialize();
  replay_paced(pool, start + std::chrono::hours(1), step);
  const std::size_t after = replay_paced(pool, start, step).seals;
  EXPECT_GT(after, alone / 2) << "the seal made an hour ahead held back the pool's next seals";
}
