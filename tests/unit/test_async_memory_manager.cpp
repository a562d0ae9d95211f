// The stream-ordered pool manager: its own driver pool, ordered reuse, the
// release threshold, and a clear refusal of IPC.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::HeldKernel;
using cuemm::testing::ScopedVariable;
using cuemm::testing::throws;

namespace {
class Async : public ::testing::Test {
 protected:
  Context& context = current_context();
};
}  // namespace

TEST_F(Async, IsABundledManager) {
  const auto names = bundled_memory_managers();
  EXPECT_NE(std::find(names.begin(), names.end(), "async"), names.end());
}

TEST_F(Async, AllocatesFromItsOwnPool) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  if (simulation::active()) simulation::reset_call_counts();
  {
    auto a = manager.memalloc(1 << 20);
    auto b = manager.memalloc(3 << 20);
    EXPECT_GE(manager.statistics().used_bytes, 4u << 20);
    if (simulation::active()) {
      EXPECT_EQ(simulation::call_count("cuMemAllocFromPoolAsync"), 2u);
      EXPECT_EQ(simulation::call_count("cuMemAlloc"), 0u);
    }
  }
  context.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
}

// The driver says only that it ran out; the error says what the manager's
// pool holds and has in use, and what the device has free.
TEST_F(Async, OutOfMemorySaysWhatItsPoolHoldsAndWhatTheDeviceHasFree) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  auto held = manager.memalloc(std::size_t{3} << 20);
  const std::size_t too_much = context.get_memory_info().total + (std::size_t{1} << 30);
  const AsyncStatistics before = manager.statistics();  // (the driver's pool may round what it counts)
  ASSERT_GE(before.used_bytes, std::size_t{3} << 20);
  EXPECT_TRUE(throws<OutOfMemory>([&] { manager.memalloc(too_much); }, "cuMemAllocFromPoolAsync",
                                  describe_bytes(too_much), "the stream-ordered pool holds ",
                                  describe_bytes(before.used_bytes) + " in use", "the device has "));
  EXPECT_NO_THROW(manager.memalloc(std::size_t{1} << 20)) << "the manager did not recover";
}

// A pool query that fails: statistics() says which, and an out-of-memory
// error stays an OutOfMemory that leaves the pool's figures out.
TEST_F(Async, AFailingPoolQueryIsNamedByStatisticsAndLeftOutOfAnOutOfMemoryError) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  AsyncMemoryManager manager(&context);
  manager.initialize();
  auto held = manager.memalloc(std::size_t{1} << 20);
  simulation::inject_fault("cuMemPoolGetAttribute", 1, cuda::CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(throws<CudaError>([&] { manager.statistics(); }, "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT"));
  simulation::clear_faults();
  const std::size_t too_much = context.get_memory_info().total + (std::size_t{1} << 30);
  simulation::inject_fault("cuMemPoolGetAttribute", 1, cuda::CUDA_ERROR_INVALID_VALUE);
  try {
    manager.memalloc(too_much);
    ADD_FAILURE() << "a request larger than the device was served";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(describe_bytes(too_much)), std::string::npos) << message;
    EXPECT_EQ(message.find("the stream-ordered pool holds"), std::string::npos) << message;
    EXPECT_NE(message.find("the device has "), std::string::npos) << message;
  }
  simulation::clear_faults();
  EXPECT_GE(manager.statistics().used_bytes, std::size_t{1} << 20) << "the manager did not recover";
}

TEST_F(Async, AFreedBlockIsNotReusedWhileQueuedWorkMayStillWriteIt) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  EXPECT_TRUE(cuemm::testing::run_reuse_race(context, manager).b_intact)
      << "the kernel's late write landed in the reused block";
}

TEST_F(Async, IpcFromAPoolNotCreatedExportableIsRefusedWithAClearError) {
  AsyncOptions options;
  options.exportable = false;
  AsyncMemoryManager manager(&context, options);
  manager.initialize();
  auto memory = manager.memalloc(4096);
  EXPECT_TRUE(throws<NotSupported>([&] { manager.get_ipc_handle(memory); }, "not created exportable",
                                   "CUEMM_ASYNC_EXPORTABLE=1"));
}

// A device without stream-ordered memory pools (older GPUs, some virtual
// GPUs): refused at initialize with an error that names the device and what
// to use instead, and again at a request rather than a crash.
TEST_F(Async, ADeviceWithoutMemoryPoolsIsRefusedWithAClearError) {
  CUEMM_REQUIRE_SIMULATION("made-up device attributes");
  const int device = context.device().id();
  const cuemm::testing::SimulatedDeviceAttribute lacking(device, cuda::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0);
  AsyncMemoryManager manager(&context);
  EXPECT_TRUE(throws<CudaError>([&] { manager.initialize(); }, "device " + std::to_string(device),
                                "no stream-ordered memory pools", "CUEMM_MEMORY_MANAGER=pool"));
  EXPECT_TRUE(throws<CudaError>([&] { manager.memalloc(4096); }, "no stream-ordered memory pools"));
}

// (Opening in another process: test_ipc.)
TEST_F(Async, AnExportablePoolsHandleCarriesItsExportAndSurvivesSerialisation) {
  AsyncOptions options;
  options.exportable = true;
  AsyncMemoryManager manager(&context, options);
  manager.initialize();
  auto memory = manager.memalloc(8192);
  IpcHandle handle = manager.get_ipc_handle(memory->view(4096));
  ASSERT_TRUE(handle.pool_export());
  EXPECT_EQ(handle.offset(), 4096u);
  EXPECT_EQ(handle.size(), 4096u);
  IpcHandle copy = IpcHandle::from_hex(handle.to_hex());
  ASSERT_TRUE(copy.pool_export());
  EXPECT_EQ(copy.pool_export()->pid, handle.pool_export()->pid);
  EXPECT_EQ(copy.pool_export()->token, handle.pool_export()->token);
  EXPECT_EQ(std::memcmp(copy.pool_export()->data.reserved, handle.pool_export()->data.reserved, 64), 0);
  EXPECT_THROW(copy.open(context), StateError) << "this process exported it";
  EXPECT_TRUE(throws<InvalidArgument>([&] { manager.get_ipc_handle(context.memalloc(256)); },
                                      "is not within a block of this manager's stream-ordered pool"));
}

// The record of live blocks is kept in shards by address: a view's block is
// found among many neighbours (its offset is from that block's start).
TEST_F(Async, AViewsHandleIsOfItsOwnBlockAmongMany) {
  AsyncOptions options;
  options.exportable = true;
  AsyncMemoryManager manager(&context, options);
  manager.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(manager.memalloc(8192));
  const auto expect_each_found = [&] {
    for (const auto& block : blocks) {
      const IpcHandle handle = manager.get_ipc_handle(block->view(4096, 5120));
      EXPECT_EQ(handle.offset(), 4096u) << "the handle of a view of the block at " << block->device_pointer();
      EXPECT_EQ(handle.size(), 1024u);
    }
  };
  expect_each_found();
  for (std::size_t i = 0; i < blocks.size(); i += 2) blocks[i].reset();  // (every other one released)
  std::erase(blocks, nullptr);
  expect_each_found();
}

TEST_F(Async, AFailedExportLeavesTheManagerAbleToExportLater) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  AsyncOptions options;
  options.exportable = true;
  AsyncMemoryManager manager(&context, options);
  manager.initialize();
  auto memory = manager.memalloc(4096);
  for (const char* call : {"cuMemPoolExportToShareableHandle", "cuMemPoolExportPointer"}) {
    simulation::inject_fault(call, 1, cuda::CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_THROW(manager.get_ipc_handle(memory), CudaError) << call;
    simulation::clear_faults();
  }
  IpcHandle handle = manager.get_ipc_handle(memory);
  ASSERT_TRUE(handle.pool_export());
  EXPECT_NE(handle.pool_export()->token, 0u);
}

TEST_F(Async, TheExportableOptionComesFromTheEnvironment) {
  {
    ScopedVariable exportable("CUEMM_ASYNC_EXPORTABLE", "1");
    EXPECT_TRUE(AsyncOptions::from_environment().exportable);
  }
  {
    ScopedVariable bad("CUEMM_ASYNC_EXPORTABLE", "yes");
    EXPECT_THROW(AsyncOptions::from_environment(), InvalidArgument);
  }
  ScopedVariable unset("CUEMM_ASYNC_EXPORTABLE", nullptr);
  EXPECT_FALSE(AsyncOptions::from_environment().exportable);
}

// As for the pool: one switch turns both managers' pinned host pools off.
TEST_F(Async, ThePinnedHostPoolsSwitchComesFromTheEnvironment) {
  {
    ScopedVariable unset("CUEMM_PINNED_HOST_POOL", nullptr);
    EXPECT_TRUE(AsyncOptions::from_environment().pinned_host_pool);
  }
  {
    ScopedVariable bad("CUEMM_PINNED_HOST_POOL", "no");
    EXPECT_TRUE(throws<InvalidArgument>([] { AsyncOptions::from_environment(); }, "CUEMM_PINNED_HOST_POOL"));
  }
  ScopedVariable off("CUEMM_PINNED_HOST_POOL", "0");
  EXPECT_FALSE(AsyncOptions::from_environment().pinned_host_pool);
  if (!simulation::active()) return;  // (what follows counts the simulated driver's calls)
  // 64 pinned blocks one after the other: without the pool, a driver
  // allocation each; with it, a rotation of a few reused (test_pinned_host_pool.cpp).
  const auto driver_allocations_for_64_blocks = [&](const AsyncOptions& options) {
    AsyncMemoryManager manager(&context, options);
    manager.initialize();
    const auto before = simulation::call_count("cuMemHostAlloc");
    for (int i = 0; i < 64; ++i) manager.memhostalloc(4096, false, false, false).reset();
    return simulation::call_count("cuMemHostAlloc") - before;
  };
  EXPECT_EQ(driver_allocations_for_64_blocks(AsyncOptions::from_environment()), 64u);
  EXPECT_LE(driver_allocations_for_64_blocks(AsyncOptions{}), 16u);
}

// A freed block's memory stays in the driver's pool (its release threshold
// is the most by default): the device's free memory does not get it back,
// but the manager's memory info counts it as free, since the pool hands it
// out again.
TEST_F(Async, MemoryInfoCountsThePoolsUnusedBytes) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  constexpr std::size_t kBlock = std::size_t{64} << 20;
  { auto block = manager.memalloc(kBlock); }
  context.synchronize();
  const AsyncStatistics statistics = manager.statistics();
  ASSERT_EQ(statistics.used_bytes, 0u);
  const MemoryInfo device = driver_memory_info(context);
  const MemoryInfo info = manager.get_memory_info();
  EXPECT_EQ(info.total, device.total);
  EXPECT_EQ(info.free - device.free, statistics.reserved_bytes);
  EXPECT_LE(info.free, info.total);
  EXPECT_GE(statistics.reserved_bytes, kBlock) << "the release threshold is at its maximum";
}

// The threshold reaches the driver's pool, and trim() gives back the rest.
TEST_F(Async, TheReleaseThresholdAndTrimGiveMemoryBack) {
  constexpr std::size_t kBlock = std::size_t{64} << 20;
  AsyncOptions keeps_nothing;
  keeps_nothing.release_threshold = 0;
  AsyncMemoryManager frugal(&context, keeps_nothing);
  frugal.initialize();
  { auto block = frugal.memalloc(kBlock); }
  context.synchronize();
  EXPECT_EQ(frugal.statistics().reserved_bytes, 0u) << "a synchronisation gives back what passes the threshold";

  AsyncMemoryManager keeper(&context);
  EXPECT_EQ(keeper.trim(), 0u) << "before its pool exists";
  keeper.initialize();
  auto held = keeper.memalloc(kBlock);
  { auto block = keeper.memalloc(kBlock); }
  const std::uint64_t free_before = driver_memory_info(context).free;
  const std::uint64_t given_back = keeper.trim();
  EXPECT_GE(given_back, kBlock) << "the freed block's memory, once its free has run";
  EXPECT_GE(driver_memory_info(context).free, free_before + given_back);
  EXPECT_GE(keeper.statistics().reserved_bytes, kBlock) << "the live block's memory stays";
  EXPECT_EQ(keeper.statistics().used_bytes, kBlock);
}

// trim() from one thread while four others allocate, write, read back and
// free: no block loses its contents, and every byte comes back.
TEST_F(Async, TrimWhileOtherThreadsAllocateKeepsEveryBlock) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  std::atomic<int> corrupted{0}, running{4};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      for (std::uint32_t step = 0; step < 200; ++step) {
        const std::size_t count = (1 + (step * 7 + t) % 64) * 1024;
        std::vector<std::uint32_t> values(count, t << 16 | step), back(count);
        auto block = manager.memalloc(count * 4);
        CUEMM_CU(cuMemcpyHtoD, block->device_pointer(), values.data(), count * 4);
        CUEMM_CU(cuMemcpyDtoH, back.data(), block->device_pointer(), count * 4);
        if (back != values) corrupted.fetch_add(1);
      }
      running.fetch_sub(1);
    });
  }
  std::uint64_t trims = 0;
  while (running.load() > 0) {
    manager.trim();
    ++trims;
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupted, 0);
  EXPECT_GT(trims, 0u);
  manager.trim();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
  EXPECT_EQ(manager.statistics().reserved_bytes, 0u) << "trim() left memory in the pool";
}

TEST_F(Async, TheReleaseThresholdComesFromTheEnvironment) {
  {
    ScopedVariable threshold("CUEMM_ASYNC_RELEASE_THRESHOLD", "256M");
    EXPECT_EQ(AsyncOptions::from_environment().release_threshold, std::uint64_t{256} << 20);
  }
  {
    ScopedVariable bad("CUEMM_ASYNC_RELEASE_THRESHOLD", "plenty");
    EXPECT_THROW(AsyncOptions::from_environment(), InvalidArgument);
  }
  ScopedVariable unset("CUEMM_ASYNC_RELEASE_THRESHOLD", nullptr);
  EXPECT_EQ(AsyncOptions::from_environment().release_threshold, UINT64_MAX);
}

// allocate(size, stream) and deallocate(pointer, size, stream): blocks on a
// stream of the caller's, whose contents survive, and which the driver's pool
// takes back.
TEST_F(Async, StreamOrderedBlocksAreAlignedDistinctAndKeepTheirContents) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  ScopedContext scope(context);
  Stream stream = context.create_stream();
  std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> blocks;
  for (const std::size_t size : {std::size_t{1}, std::size_t{300}, std::size_t{64} << 10, std::size_t{3} << 20}) {
    const cuda::CUdeviceptr block = manager.allocate(size, stream.handle());
    EXPECT_EQ(block % 256, 0u) << size;
    for (const auto& [other, other_size] : blocks)
      EXPECT_TRUE(block + size <= other || other + other_size <= block) << size << " bytes overlap another block";
    blocks.emplace_back(block, size);
  }
  std::uint32_t value = 1;
  std::vector<std::vector<std::uint8_t>> sent;  // (until the copies have run)
  for (const auto& [block, size] : blocks) {
    sent.emplace_back(size, static_cast<std::uint8_t>(value++));
    CUEMM_CU(cuMemcpyHtoDAsync, block, sent.back().data(), size, stream.handle());
  }
  stream.synchronize();
  EXPECT_GE(manager.statistics().used_bytes, (std::size_t{3} << 20) + (std::size_t{64} << 10));
  value = 1;
  for (const auto& [block, size] : blocks) {
    std::vector<std::uint8_t> back(size);
    CUEMM_CU(cuMemcpyDtoH, back.data(), block, size);
    EXPECT_EQ(back, std::vector<std::uint8_t>(size, static_cast<std::uint8_t>(value++))) << size << " bytes";
    manager.deallocate(block, size, stream.handle());
  }
  stream.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
  EXPECT_EQ(manager.statistics().rejected_frees, 0u);
  EXPECT_TRUE(throws<InvalidArgument>([&] { manager.allocate(0, stream.handle()); }, "allocate"));
}

// A block freed on a stream whose held kernel still writes it is not given
// to work on another stream before that kernel has finished.
TEST_F(Async, AStreamOrderedFreeIsNotReusedElsewhereWhileItsStreamsWorkMayStillWriteIt) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  ScopedContext scope(context);
  Stream kernel_stream = context.create_stream();
  Stream other_stream = context.create_stream(/*non_blocking=*/true);
  const std::uint64_t count = 1 << 18;
  const cuda::CUdeviceptr a = manager.allocate(count * 4, kernel_stream.handle());
  cuda::CUdeviceptr b = 0;
  const std::vector<std::uint32_t> nines(count, 9u);
  {
    HeldKernel kernel(context, kernel_stream, a, 7u, count);
    manager.deallocate(a, count * 4, kernel_stream.handle());
    kernel.waited_for_by([&] {
      b = manager.allocate(count * 4, other_stream.handle());
      CUEMM_CU(cuMemcpyHtoDAsync, b, nines.data(), count * 4, other_stream.handle());
      other_stream.synchronize();
    });
  }
  std::vector<std::uint32_t> back(count);
  CUEMM_CU(cuMemcpyDtoH, back.data(), b, count * 4);
  EXPECT_EQ(back, nines) << "the kernel's late write landed in a block handed to another stream";
  manager.deallocate(b, count * 4, other_stream.handle());
}

// A free that no live block of allocate()'s matches frees nothing: it is
// counted, and the blocks it did not match stay the caller's.
TEST_F(Async, AStreamOrderedFreeThatMatchesNoLiveBlockFreesNothing) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  ScopedContext scope(context);
  const cuda::CUstream stream = cuda::CU_STREAM_PER_THREAD;
  const cuda::CUdeviceptr block = manager.allocate(1 << 20, stream);
  auto owned = manager.memalloc(1 << 20);
  manager.deallocate(block + 256, 1 << 20, stream);              // not a block's start
  manager.deallocate(block, 4096, stream);                       // not its size
  manager.deallocate(owned->device_pointer(), 1 << 20, stream);  // memalloc's
  EXPECT_EQ(manager.statistics().rejected_frees, 3u);
  context.synchronize();
  EXPECT_GE(manager.statistics().used_bytes, std::size_t{2} << 20) << "a refused free freed a block";
  manager.deallocate(block, 1 << 20, stream);
  manager.deallocate(block, 1 << 20, stream);  // a second free
  EXPECT_EQ(manager.statistics().rejected_frees, 4u);
  owned.reset();
  context.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
}

// reset() gives allocate()'s blocks back with the rest: the pool it destroys
// has nothing out, and a later free of such a block is refused, not sent to
// the new pool.
TEST_F(Async, ResetGivesBackStreamOrderedBlocksAndRefusesTheirLaterFree) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  ScopedContext scope(context);
  const cuda::CUdeviceptr block = manager.allocate(2 << 20, cuda::CU_STREAM_PER_THREAD);
  manager.reset();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
  const cuda::CUdeviceptr next = manager.allocate(1 << 20, cuda::CU_STREAM_PER_THREAD);
  if (next != block) manager.deallocate(block, 2 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(manager.statistics().rejected_frees, next != block ? 1u : 0u);
  manager.deallocate(next, 1 << 20, cuda::CU_STREAM_PER_THREAD);
  context.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
}

// The driver's refusal leaves the manager as it was: a failed allocation
// records nothing, and a failed free keeps its block live for a later one.
TEST_F(Async, AFailingDriverCallInTheStreamOrderedPathsLeavesTheRecordRight) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  AsyncMemoryManager manager(&context);
  manager.initialize();
  ScopedContext scope(context);
  const cuda::CUstream stream = cuda::CU_STREAM_PER_THREAD;
  simulation::inject_fault("cuMemAllocFromPoolAsync", 1, cuda::CUDA_ERROR_OUT_OF_MEMORY, 2);  // (and its retry)
  EXPECT_TRUE(throws<OutOfMemory>([&] { manager.allocate(1 << 20, stream); }, "cuMemAllocFromPoolAsync"));
  simulation::clear_faults();
  context.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
  const cuda::CUdeviceptr block = manager.allocate(1 << 20, stream);
  simulation::inject_fault("cuMemFreeAsync", 1, cuda::CUDA_ERROR_INVALID_VALUE);
  manager.deallocate(block, 1 << 20, stream);
  simulation::clear_faults();
  EXPECT_EQ(manager.statistics().rejected_frees, 1u);
  manager.deallocate(block, 1 << 20, stream);
  EXPECT_EQ(manager.statistics().rejected_frees, 1u) << "the block whose free failed was no longer recorded";
  context.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
}

// Threads on streams of their own (blocking and not), with trim() beside them:
// every block keeps its contents until its free.
TEST_F(Async, ThreadsOnTheirOwnStreamsKeepTheirBlocksContents) {
  AsyncMemoryManager manager(&context);
  manager.initialize();
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      Stream stream = context.create_stream(t % 2 == 1);
      for (std::uint32_t step = 0; step < 150; ++step) {
        const std::size_t count = (1 + (step * 13 + t) % 96) * 512;
        std::vector<std::uint32_t> values(count, t << 16 | step), back(count);
        const cuda::CUdeviceptr block = manager.allocate(count * 4, stream.handle());
        CUEMM_CU(cuMemcpyHtoDAsync, block, values.data(), count * 4, stream.handle());
        CUEMM_CU(cuMemcpyDtoHAsync, back.data(), block, count * 4, stream.handle());
        manager.deallocate(block, count * 4, stream.handle());
        stream.synchronize();
        if (back != values) corrupted.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 20; ++i) manager.trim();
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupted, 0);
  EXPECT_EQ(manager.statistics().rejected_frees, 0u);
  context.synchronize();
  EXPECT_EQ(manager.statistics().used_bytes, 0u);
}

// Under a capture, allocate() and deallocate() on the recording stream become
// the graph's allocation and free (the driver's graph memory nodes): every
// launch computes its output, and no free is refused.
TEST_F(Async, StreamOrderedBlocksAllocatedAndFreedInACaptureServeEveryLaunch) {
  if (simulation::active())
    GTEST_SKIP() << "the simulated driver does not capture stream-ordered allocations (graph memory nodes)";
  AsyncMemoryManager manager(&context);
  manager.initialize();
  ScopedContext scope(context);
  Stream stream = context.create_stream();
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const Function fill = module.function("cuemm_fill_u32");
  const std::uint64_t words = 1 << 16;
  auto output = context.memalloc(words * 4);
  Graph graph = capture_graph(stream, [&](const Stream& recording) {
    const cuda::CUdeviceptr scratch = manager.allocate(words * 4, recording.handle());
    fill.launch({64}, {256}, recording, scratch, 0xA5u, words);
    CUEMM_CU(cuMemcpyDtoDAsync, output->device_pointer(), scratch, words * 4, recording.handle());
    manager.deallocate(scratch, words * 4, recording.handle());
  });
  EXPECT_EQ(manager.statistics().rejected_frees, 0u);
  for (int launch = 0; launch < 2; ++launch) {
    CUEMM_CU(cuMemsetD32, output->device_pointer(), 0u, words);
    graph.launch(stream);
    stream.synchronize();
    std::vector<std::uint32_t> back(words);
    CUEMM_CU(cuMemcpyDtoH, back.data(), output->device_pointer(), words * 4);
    EXPECT_EQ(back, std::vector<std::uint32_t>(words, 0xA5u)) << "launch " << launch;
  }
}
