// The driver layer: errors carry the code, its name and the call.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::caught;
using cuemm::testing::HeldKernel;

TEST(Driver, LoadsOnceAndSaysWhichDriver) {
  const auto& driver = driver::Driver::get();
  EXPECT_TRUE(driver::Driver::is_loaded());
  EXPECT_FALSE(driver.library_path().empty());
  EXPECT_GE(driver.version(), 11000);
  EXPECT_EQ(&driver, &driver::Driver::get());
  EXPECT_NE(driver.api().cuMemAlloc, nullptr);
}

TEST(Driver, ErrorsNameTheCodeAndTheCall) {
  const CudaError error(cuda::CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD");
  EXPECT_STREQ(error.what(), "[CUDA_ERROR_INVALID_VALUE] Call to cuMemcpyHtoD results in CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(error.code(), 1);
  EXPECT_EQ(error.call(), "cuMemcpyHtoD");
  EXPECT_EQ(error_name(12345), "CUDA_ERROR_12345");
  const OutOfMemory oom("cuMemAlloc", 3u << 30);
  EXPECT_STREQ(oom.what(),
               "[CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY "
               "(requested 3.00 GiB (3221225472 bytes))");
}

// A capture's refusal says what cuemm needs (a CaptureScope), beside what the
// driver's code says; other codes get no such words, nor a capture found
// ended (its refusal came earlier, and capture_graph's scope may be open).
TEST(Driver, ACapturesRefusalNamesTheCaptureScope) {
  const CudaError refused(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemAlloc", "requested 2.00 MiB");
  const std::string said = refused.what();
  EXPECT_EQ(said.rfind("[CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED] Call to cuMemAlloc results in "
                       "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (requested 2.00 MiB; ",
                       0),
            0u)
      << said;
  EXPECT_NE(said.find("cuemm::CaptureScope"), std::string::npos) << said;
  const std::string implicit = CudaError(cuda::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "cuStreamQuery").what();
  EXPECT_NE(implicit.find("cuemm::CaptureScope"), std::string::npos) << implicit;
  for (const cuda::CUresult code : {cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuda::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED}) {
    const std::string other = CudaError(code, "cuStreamEndCapture").what();
    EXPECT_EQ(other.find("CaptureScope"), std::string::npos) << other;
  }
}

// What the H100's driver answers for host ranges it cannot page-lock and for
// zero-byte allocations (bench/probes/probe_host_register.cpp); the
// simulated driver must answer the same, so this runs on both.
TEST(Driver, HostRegistrationAndZeroBytesAnswerAsTheH100sDriverDoes) {
  ScopedContext scope(current_context());
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto* mapped = static_cast<char*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(mapped, MAP_FAILED);
  ASSERT_EQ(munmap(mapped + page, page), 0);  // a hole between the first page and the third
  auto* read_only = static_cast<char*>(mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(read_only, MAP_FAILED);
  auto registered = [](void* pointer, std::size_t size, unsigned flags) {
    const cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostRegister, pointer, size, flags);
    if (result == cuda::CUDA_SUCCESS) CUEMM_CU(cuMemHostUnregister, pointer);
    return result;
  };
  EXPECT_EQ(registered(mapped, page, 0), cuda::CUDA_SUCCESS);
  EXPECT_EQ(registered(mapped + 1, 100, 0), cuda::CUDA_SUCCESS) << "an unaligned range within a page";
  EXPECT_EQ(registered(mapped, 3 * page, 0), cuda::CUDA_ERROR_INVALID_VALUE) << "across the hole";
  EXPECT_EQ(registered(mapped, SIZE_MAX, 0), cuda::CUDA_ERROR_INVALID_VALUE) << "a size that wraps";
  EXPECT_EQ(registered(read_only, page, 0), cuda::CUDA_ERROR_INVALID_VALUE) << "read-only, not registered so";
  EXPECT_EQ(registered(read_only, page, cuda::CU_MEMHOSTREGISTER_READ_ONLY), cuda::CUDA_SUCCESS);
  EXPECT_EQ(registered(mapped, 0, 0), cuda::CUDA_ERROR_INVALID_VALUE);
  munmap(mapped, page);
  munmap(mapped + 2 * page, page);
  munmap(read_only, page);

  for (const unsigned flags : {0u, unsigned{cuda::CU_MEMHOSTALLOC_DEVICEMAP}}) {
    int dummy = 0;
    void* host = &dummy;  // (not null before: the call must write null)
    EXPECT_EQ(CUEMM_CU_RESULT(cuMemHostAlloc, &host, 0, flags), cuda::CUDA_SUCCESS);
    EXPECT_EQ(host, nullptr);
    EXPECT_EQ(CUEMM_CU_RESULT(cuMemFreeHost, host), cuda::CUDA_SUCCESS);
  }
  cuda::CUdeviceptr device = 0;
  EXPECT_EQ(CUEMM_CU_RESULT(cuMemAlloc, &device, 0), cuda::CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(CUEMM_CU_RESULT(cuMemAllocManaged, &device, 0, cuda::CU_MEM_ATTACH_GLOBAL), cuda::CUDA_ERROR_INVALID_VALUE);
}

TEST(Driver, AFailingCallThrowsItsResult) {
  CUEMM_REQUIRE_SIMULATION("fault injection and call counters");
  current_context();
  simulation::inject_fault("cuMemAlloc", 1, cuda::CUDA_ERROR_OUT_OF_MEMORY);
  cuda::CUdeviceptr pointer = 0;
  const auto error = caught<OutOfMemory>([&] { CUEMM_CU(cuMemAlloc, &pointer, 64); });
  ASSERT_TRUE(error);
  EXPECT_STREQ(error->what(), "[CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY");
  simulation::inject_fault("cuMemGetInfo", 2, cuda::CUDA_ERROR_INVALID_CONTEXT, 2);
  std::size_t free = 0, total = 0;
  EXPECT_NO_THROW(CUEMM_CU(cuMemGetInfo, &free, &total));
  EXPECT_THROW(CUEMM_CU(cuMemGetInfo, &free, &total), CudaError);
  EXPECT_THROW(CUEMM_CU(cuMemGetInfo, &free, &total), CudaError);
  EXPECT_NO_THROW(CUEMM_CU(cuMemGetInfo, &free, &total));
  EXPECT_THROW(simulation::call_count("cuNoSuchFunction"), InvalidArgument);
}

TEST(Driver, TheSimulationCountsCalls) {
  CUEMM_REQUIRE_SIMULATION("call counters: the simulator is what it tests");
  current_context();
  simulation::reset_call_counts();
  std::size_t free = 0, total = 0;
  for (int i = 0; i < 3; ++i) CUEMM_CU(cuMemGetInfo, &free, &total);
  EXPECT_EQ(simulation::call_count("cuMemGetInfo"), 3u);
  EXPECT_EQ(simulation::call_count("cuMemAlloc"), 0u);
}

// A thread's per-thread default stream ends with the thread, once its work has
// run: kept, every operation on the legacy stream would wait on the streams of
// threads long gone; ended sooner, the legacy stream would not wait for its work.
TEST(Driver, ASimulatedPerThreadStreamEndsWithItsThread) {
  CUEMM_REQUIRE_SIMULATION("per-thread streams: the simulator is what it tests");
  Context& context = current_context();
  ScopedContext scope(context);
  const std::uint64_t streams_before = simulation::live_streams();
  constexpr std::uint64_t kCount = 1024;
  cuda::CUdeviceptr words = 0;
  CUEMM_CU(cuMemAlloc, &words, kCount * 4);
  CUEMM_CU(cuMemsetD32, words, 0u, kCount);
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  std::atomic<std::uint64_t> streams_while_running{0};
  std::thread worker([&] {
    ScopedContext worker_scope(context);
    // Still running when the thread ends.
    module.function("cuemm_spin_fill_u32")
        .launch({1}, {256}, Stream::per_thread_default(), words, 7u, kCount, std::uint64_t{50'000'000});
    streams_while_running = simulation::live_streams();
  });
  while (streams_while_running == 0) std::this_thread::yield();
  EXPECT_EQ(streams_while_running, streams_before + 1);
  while (simulation::live_streams() != streams_before) std::this_thread::yield();
  // Gone from the context: its kernel must have finished, or this copy (on
  // the legacy stream) would not have waited for it.
  std::vector<std::uint32_t> read(kCount);
  CUEMM_CU(cuMemcpyDtoH, read.data(), words, kCount * 4);
  EXPECT_EQ(read, std::vector<std::uint32_t>(kCount, 7u));
  worker.join();
  CUEMM_CU(cuMemFree, words);
}

// The simulated cuMemFree and cuMemFreeHost wait until the device has run
// its queued work, on any stream, as the H100's do, and cuMemAlloc does not
// (bench/probes/probe_free_stall.cpp measures the real driver): the pools'
// rules for a busy GPU are tested on that.
TEST(Driver, SimulatedFreesWaitForQueuedWorkOnAnyStreamAndAllocationsDoNot) {
  CUEMM_REQUIRE_SIMULATION("streams and workers: the simulator is what it tests");
  Context& context = current_context();
  ScopedContext scope(context);
  Stream stream = context.create_stream(/*non_blocking=*/true);
  constexpr std::uint64_t kCount = 32;
  cuda::CUdeviceptr words = 0, device = 0, more = 0;
  void* host = nullptr;
  CUEMM_CU(cuMemAlloc, &words, kCount * 4);
  CUEMM_CU(cuMemAlloc, &device, 1 << 20);
  CUEMM_CU(cuMemHostAlloc, &host, 1 << 20, 0u);
  {
    HeldKernel kernel(context, stream, words, 7u, kCount);
    EXPECT_FALSE(kernel.waited_for_by([&] { CUEMM_CU(cuMemAlloc, &more, 1 << 20); })) << "cuMemAlloc waited for the kernel";
  }
  {
    HeldKernel kernel(context, stream, words, 7u, kCount);
    EXPECT_TRUE(kernel.waited_for_by([&] { CUEMM_CU(cuMemFree, device); })) << "cuMemFree returned with the kernel queued";
  }
  {
    HeldKernel kernel(context, stream, words, 7u, kCount);
    EXPECT_TRUE(kernel.waited_for_by([&] { CUEMM_CU(cuMemFreeHost, host); }))
        << "cuMemFreeHost returned with the kernel queued";
  }
  CUEMM_CU(cuMemFree, more);
  CUEMM_CU(cuMemFree, words);
}

// Async copies with pageable (not page-locked) host memory, behind queued
// work: the source of a host-to-device copy may be reused as soon as the call
// returns, and a device-to-host copy returns only once it is done. CUDA's
// driver does so, and the simulated one must: callers copy from and into
// temporaries (Numba's copy_to_host(stream=...) and copy_to_device(ary, stream)).
TEST(Driver, AsyncCopiesWithPageableHostMemoryAreDoneWithItOnReturn) {
  Context& context = current_context();
  ScopedContext scope(context);
  Stream stream = context.create_stream(/*non_blocking=*/true);
  constexpr std::uint64_t kCount = 1024;
  cuda::CUdeviceptr words = 0;
  CUEMM_CU(cuMemAlloc, &words, kCount * 4);
  std::vector<std::uint32_t> host(kCount, 9u);
  {
    HeldKernel kernel(context, stream);
    // (A driver may wait for the kernel before it stages the source: the
    // kernel is let go then, and the overwrite below comes after the copy.)
    kernel.waited_for_by([&] {
      CUEMM_CU(cuMemcpyHtoDAsync, words, host.data(), kCount * 4, stream.handle());
      std::fill(host.begin(), host.end(), 5u);
    });
  }
  std::vector<std::uint32_t> back(kCount, 0u);
  {
    HeldKernel kernel(context, stream);
    EXPECT_TRUE(kernel.waited_for_by(
        [&] { CUEMM_CU(cuMemcpyDtoHAsync, back.data(), words, kCount * 4, stream.handle()); }))
        << "a copy into pageable memory returned before the work queued ahead of it had run";
  }
  EXPECT_EQ(back, std::vector<std::uint32_t>(kCount, 9u)) << "the copy read its source after the call had returned";
  CUEMM_CU(cuMemFree, words);
}

namespace {
// A kernel's stream, a stream to wait for it, the words they write and the
// event between them: what the tests of a wait for an event share.
struct KernelAndWaiter {
  static constexpr std::uint64_t kCount = 32;
  explicit KernelAndWaiter(Context& context)
      : module(context.load_module(cuemm::testing::test_kernels_ptx())),
        busy(context.create_stream(/*non_blocking=*/true)),
        waiting(context.create_stream(/*non_blocking=*/true)),
        words(kCount, context) {
    CUEMM_CU(cuEventCreate, &event, cuda::CU_EVENT_DISABLE_TIMING);
  }
  ~KernelAndWaiter() { CUEMM_CU_RESULT(cuEventDestroy, event); }
  KernelAndWaiter(const KernelAndWaiter&) = delete;
  KernelAndWaiter& operator=(const KernelAndWaiter&) = delete;

  Module module;
  Stream busy;
  Stream waiting;
  DeviceArray<std::uint32_t> words;
  cuda::CUevent event = nullptr;
};
}  // namespace

// An event recorded for a whole context (cuCtxRecordEvent, CUDA 12.5) waits
// for work on every stream, a non-blocking one too, where the legacy stream
// reads idle: what the pools' seals and their busy rule rely on. The H100's
// driver does so (bench/probes/probe_free_beside.cpp), and the simulated one
// must, with cuEventSynchronize and cuStreamWaitEvent on such an event.
TEST(Driver, AnEventRecordedForTheContextWaitsForWorkOnEveryStream) {
  Context& context = current_context();
  if (!cuemm::testing::context_events_work(context))
    GTEST_SKIP() << "the loaded driver (" << driver::Driver::get().library_path()
                 << ") records no event for a whole context (cuCtxRecordEvent, CUDA 12.5)";
  ScopedContext scope(context);
  KernelAndWaiter streams(context);
  // (Named one by one: the lambdas below capture them, which clang before 16
  // does not allow of a structured binding.)
  Module& module = streams.module;
  Stream& busy = streams.busy;
  Stream& waiting = streams.waiting;
  DeviceArray<std::uint32_t>& words = streams.words;
  cuda::CUevent& event = streams.event;
  constexpr std::uint64_t kCount = KernelAndWaiter::kCount;
  {
    HeldKernel kernel(context, busy, words.device_pointer(), 7u, kCount);
    CUEMM_CU(cuCtxRecordEvent, context.handle(), event);
    EXPECT_EQ(CUEMM_CU_RESULT(cuStreamQuery, cuda::CU_STREAM_LEGACY), cuda::CUDA_SUCCESS)
        << "the legacy stream read busy for a kernel on a non-blocking stream";
    EXPECT_EQ(CUEMM_CU_RESULT(cuEventQuery, event), cuda::CUDA_ERROR_NOT_READY);
    EXPECT_TRUE(kernel.waited_for_by([&] { CUEMM_CU(cuEventSynchronize, event); }))
        << "cuEventSynchronize returned with the kernel queued";
    EXPECT_EQ(CUEMM_CU_RESULT(cuEventQuery, event), cuda::CUDA_SUCCESS);
  }

  // Another stream made to wait for it runs only after the kernel: its fill of
  // 9 lands last. (The fill is looked up first: a driver that loads kernels
  // lazily may wait for the GPU to load it.)
  const Function fill = module.function("cuemm_fill_u32");
  {
    HeldKernel kernel(context, busy, words.device_pointer(), 7u, kCount);
    CUEMM_CU(cuCtxRecordEvent, context.handle(), event);
    CUEMM_CU(cuStreamWaitEvent, waiting.handle(), event, 0u);
    fill.launch({1}, {32}, waiting, words.device_pointer(), 9u, kCount);
    EXPECT_TRUE(kernel.waited_for_by([&] { waiting.synchronize(); }))
        << "the waiting stream ran before the kernel had finished";
  }
  EXPECT_EQ(words.copy_to_host(), std::vector<std::uint32_t>(kCount, 9u));

  // With nothing queued it has completed at once.
  CUEMM_CU(cuCtxRecordEvent, context.handle(), event);
  EXPECT_EQ(CUEMM_CU_RESULT(cuEventQuery, event), cuda::CUDA_SUCCESS);
}

// A stream's wait for an event is for the record made before the wait: the
// event recorded again on another stream, idle, does not end it. (The pool
// orders frees on non-blocking streams before CUDA 12.5 through one event,
// recorded by each freeing thread in turn. The simulated driver once ended
// every wait at the newest record's completion: a free on a stream whose
// kernel still ran was reused under it, 1 run in 12 of
// Pool.ThreadsReuseTheirStreamsFreesAndKeepTheirContents with seals on the
// legacy stream.)
TEST(Driver, AWaitForAnEventIsForItsRecordBeforeTheWait) {
  Context& context = current_context();
  ScopedContext scope(context);
  KernelAndWaiter streams(context);
  Module& module = streams.module;
  Stream& busy = streams.busy;
  Stream& waiting = streams.waiting;
  DeviceArray<std::uint32_t>& words = streams.words;
  cuda::CUevent& event = streams.event;
  constexpr std::uint64_t kCount = KernelAndWaiter::kCount;
  const Function fill = module.function("cuemm_fill_u32");
  Stream idle = context.create_stream(/*non_blocking=*/true);
  {
    HeldKernel kernel(context, busy, words.device_pointer(), 7u, kCount);
    CUEMM_CU(cuEventRecord, event, busy.handle());
    CUEMM_CU(cuStreamWaitEvent, waiting.handle(), event, 0u);
    CUEMM_CU(cuEventRecord, event, idle.handle());
    CUEMM_CU(cuEventSynchronize, event);  // the newer record has completed
    fill.launch({1}, {32}, waiting, words.device_pointer(), 9u, kCount);
    EXPECT_TRUE(kernel.waited_for_by([&] { waiting.synchronize(); }))
        << "the wait ended with the newer record, before the kernel it was made after";
  }
  EXPECT_EQ(words.copy_to_host(), std::vector<std::uint32_t>(kCount, 9u));
}

// Once an event recorded last on a stream has completed, the stream reads
// idle: the event and the stream's own count of its work agree, as on a GPU.
// (The simulated driver once completed the event a moment before the stream
// counted the record done: 1 query in 100 read busy, thousands in 20,000
// under load, and a test that waited for a graph through its event failed.)
TEST(Driver, AStreamWaitedForThroughItsLastEventReadsIdle) {
  Context& context = current_context();
  ScopedContext scope(context);
  const Stream stream = context.create_stream(/*non_blocking=*/true);
  DeviceArray<std::uint8_t> bytes(std::size_t{1} << 16, context);
  cuda::CUevent event = nullptr;
  CUEMM_CU(cuEventCreate, &event, cuda::CU_EVENT_DISABLE_TIMING);
  constexpr int kRounds = 20000;
  int read_busy = 0;
  for (int round = 0; round < kRounds; ++round) {
    CUEMM_CU(cuMemsetD8Async, bytes.device_pointer(), static_cast<unsigned char>(round), bytes.size(), stream.handle());
    CUEMM_CU(cuEventRecord, event, stream.handle());
    CUEMM_CU(cuEventSynchronize, event);
    if (CUEMM_CU_RESULT(cuStreamQuery, stream.handle()) != cuda::CUDA_SUCCESS) ++read_busy;
  }
  EXPECT_EQ(read_busy, 0) << "of " << kRounds << " queries right after the stream's last event completed";
  CUEMM_CU(cuEventDestroy, event);
}

namespace {
cuda::CUmemoryPool make_stream_ordered_pool(const Context& context, std::uint64_t release_threshold) {
  cuda::CUmemPoolProps properties{};
  properties.alloc_type = cuda::CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {cuda::CU_MEM_LOCATION_TYPE_DEVICE, context.device().id()};
  cuda::CUmemoryPool pool = nullptr;
  CUEMM_CU(cuMemPoolCreate, &pool, &properties);
  CUEMM_CU(cuMemPoolSetAttribute, pool, cuda::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &release_threshold);
  return pool;
}

std::uint64_t pool_attribute(cuda::CUmemoryPool pool, int attribute) {
  std::uint64_t value = 0;
  CUEMM_CU(cuMemPoolGetAttribute, pool, attribute, &value);
  return value;
}
std::uint64_t reserved_bytes(cuda::CUmemoryPool pool) {
  return pool_attribute(pool, cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
}
std::uint64_t used_bytes(cuda::CUmemoryPool pool) {
  return pool_attribute(pool, cuda::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
}
}  // namespace

// A stream-ordered free on an idle stream gives the block back to its pool
// at once, as the driver's pool hands it to the stream's next allocation; on
// a stream with work queued, only once that work has run. (Deferred always,
// replays without GPU work read every block freed since the stream's worker
// last ran as still in use.)
TEST(Driver, ASimulatedStreamOrderedFreeWaitsOnlyForQueuedWork) {
  CUEMM_REQUIRE_SIMULATION("streams and workers: the simulator is what it tests");
  Context& context = current_context();
  ScopedContext scope(context);
  const cuda::CUmemoryPool pool = make_stream_ordered_pool(context, UINT64_MAX);
  constexpr std::size_t kBytes = std::size_t{4} << 20;
  cuda::CUdeviceptr block = 0;
  CUEMM_CU(cuMemAllocFromPoolAsync, &block, kBytes, pool, cuda::CUstream{});
  EXPECT_EQ(used_bytes(pool), kBytes);
  CUEMM_CU(cuMemFreeAsync, block, cuda::CUstream{});
  EXPECT_EQ(used_bytes(pool), 0u);

  // Behind a kernel that runs for a while, the free waits for it.
  constexpr std::uint64_t kCount = 1024;
  cuda::CUdeviceptr words = 0;
  CUEMM_CU(cuMemAlloc, &words, kCount * 4);
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  CUEMM_CU(cuMemAllocFromPoolAsync, &block, kBytes, pool, cuda::CUstream{});
  module.function("cuemm_spin_fill_u32").launch({1}, {256}, Stream::legacy_default(), words, 7u, kCount,
                                                std::uint64_t{50'000'000});
  CUEMM_CU(cuMemFreeAsync, block, cuda::CUstream{});
  EXPECT_EQ(used_bytes(pool), kBytes);
  CUEMM_CU(cuStreamSynchronize, cuda::CUstream{});
  EXPECT_EQ(used_bytes(pool), 0u);
  CUEMM_CU(cuMemFree, words);
  CUEMM_CU(cuMemPoolDestroy, pool);
}

namespace {

// What `count` blocks of `size` from cuMemAlloc, held at once, take of the
// device's free memory, and what their frees give back.
struct BlocksCost {
  std::uint64_t taken;
  std::uint64_t given_back;
};
BlocksCost cost_of_blocks(Context& context, int count, std::uint64_t size) {
  const std::uint64_t before = driver_memory_info(context).free;
  std::vector<cuda::CUdeviceptr> blocks(count);
  for (auto& block : blocks) CUEMM_CU(cuMemAlloc, &block, size);
  const std::uint64_t held = driver_memory_info(context).free;
  for (auto block : blocks) CUEMM_CU(cuMemFree, block);
  return {before - held, driver_memory_info(context).free - held};
}

}  // namespace

// The pool's segments of their own count whole 2 MiB pages (DedicatedSegments::
// segment_size) because cuMemAlloc takes them: the driver's free memory drops
// by the rounded size (bench/probes/probe_alloc_granularity.cpp).
TEST(Driver, ACuMemAllocOfMoreThanAPageTakesWholePages) {
  Context& context = current_context();
  ScopedContext scope(context);
  constexpr std::uint64_t kMiB = 1 << 20;
  constexpr int kBlocks = 8;
  for (const auto& [size, taken] : {std::pair{2 * kMiB + 1, 4 * kMiB}, std::pair{4 * kMiB + 200 * 1024, 6 * kMiB},
                                    std::pair{8 * kMiB + 64 * 1024, 10 * kMiB}}) {
    SCOPED_TRACE("blocks of " + std::to_string(size) + " bytes");
    const BlocksCost cost = cost_of_blocks(context, kBlocks, size);
    // (Within a page of it: the driver may take one for its own records.)
    EXPECT_GE(cost.taken, kBlocks * taken);
    EXPECT_LE(cost.taken, kBlocks * taken + 2 * kMiB);
  }
}

// Blocks of at most a page share pages (bench/probes/probe_alloc_granularity.cpp):
// 32 blocks of 64 KiB take one page, not 32 and not a sliver each; 32 of 1 MiB
// take 16. Within a page either way: the blocks may fill one that the driver
// or an earlier block had started.
TEST(Driver, SmallCuMemAllocBlocksSharePages) {
  Context& context = current_context();
  ScopedContext scope(context);
  constexpr std::uint64_t kMiB = 1 << 20, kPage = 2 * kMiB;
  for (const auto& [size, taken] : {std::pair{64 * 1024 * std::uint64_t{1}, kPage}, std::pair{kMiB, 16 * kPage}}) {
    SCOPED_TRACE("blocks of " + std::to_string(size) + " bytes");
    const BlocksCost cost = cost_of_blocks(context, 32, size);
    EXPECT_GE(cost.taken + kPage, taken);
    EXPECT_LE(cost.taken, taken + kPage);
    EXPECT_GE(cost.given_back + kPage, cost.taken) << "freeing every block gave the pages back";
  }
}

// How the simulated driver places them, exactly (Note [cuMemAlloc's shared
// pages]): a page is taken when no free run of the pages there are holds the
// block, given back when its last block goes, and the smallest run that
// holds a block gets it.
TEST(Driver, TheSimulatedDriverPlacesSmallBlocksInTheSmallestRunThatHoldsThem) {
  if (!simulation::active()) GTEST_SKIP() << "exact pages: the real driver's own records share its pages too";
  Context& context = current_context();
  ScopedContext scope(context);
  constexpr std::uint64_t kMiB = 1 << 20, kPage = 2 * kMiB;
  release_unused_memory(context.memory_manager());  // earlier tests' arrays, whose frees the manager defers
  ASSERT_EQ(simulation::live_allocations(simulation::AllocationKind::Device), 0u)
      << "blocks that earlier tests left would take part in the placement";
  const std::uint64_t baseline = simulation::device_bytes_in_use(0);
  const auto pages_taken = [&] { return (simulation::device_bytes_in_use(0) - baseline) / kPage; };
  const auto allocate = [](std::uint64_t size) {
    cuda::CUdeviceptr block = 0;
    CUEMM_CU(cuMemAlloc, &block, size);
    return block;
  };

  const cuda::CUdeviceptr first = allocate(64 * 1024);
  EXPECT_EQ(pages_taken(), 1u);
  const cuda::CUdeviceptr second = allocate(64 * 1024);
  EXPECT_EQ(pages_taken(), 1u) << "the second block shares the first one's page";
  CUEMM_CU(cuMemFree, first);
  EXPECT_EQ(pages_taken(), 1u) << "the page still holds a block";
  CUEMM_CU(cuMemFree, second);
  EXPECT_EQ(pages_taken(), 0u) << "an emptied page goes back";

  // 1.5 MiB and 0.75 MiB do not fit in one page.
  const cuda::CUdeviceptr large = allocate(3 * kMiB / 2);
  const cuda::CUdeviceptr small = allocate(3 * kMiB / 4);
  EXPECT_EQ(pages_taken(), 2u);
  CUEMM_CU(cuMemFree, large);
  CUEMM_CU(cuMemFree, small);

  // Page 1 has 1 MiB free, page 2 half a MiB: half a MiB goes to page 2 (the
  // first page that holds it would be page 1), so that 1 MiB then fits in
  // page 1 with no third page.
  const cuda::CUdeviceptr one = allocate(kMiB);
  const cuda::CUdeviceptr one_and_a_half = allocate(3 * kMiB / 2);
  const cuda::CUdeviceptr half = allocate(kMiB / 2);
  const cuda::CUdeviceptr another_one = allocate(kMiB);
  EXPECT_EQ(pages_taken(), 2u);
  for (const cuda::CUdeviceptr block : {one, one_and_a_half, half, another_one}) CUEMM_CU(cuMemFree, block);
  EXPECT_EQ(pages_taken(), 0u);
}

// What a stream-ordered pool keeps of the memory its blocks free, as the
// H100's driver keeps it (bench/probes/probe_pool_reserve.cpp): reserved
// memory counts against the device; a synchronisation trims it to the
// release threshold, cuMemPoolTrimTo to what it is asked to keep; and an
// allocation elsewhere that would run out without it takes it back. The
// simulated driver must do the same (the async manager's memory info and
// statistics read it), so this runs on both.
TEST(Driver, AStreamOrderedPoolKeepsFreedMemoryUpToItsReleaseThreshold) {
  Context& context = current_context();
  ScopedContext scope(context);
  const cuda::CUstream stream = cuda::CU_STREAM_LEGACY;
  constexpr std::uint64_t kMiB = 1 << 20, kBlock = 256 * kMiB;
  for (const std::uint64_t threshold : {std::uint64_t{0}, 4 * kBlock, std::uint64_t{UINT64_MAX}}) {
    SCOPED_TRACE("release threshold " + std::to_string(threshold));
    const cuda::CUmemoryPool pool = make_stream_ordered_pool(context, threshold);
    cuda::CUdeviceptr blocks[4];
    for (auto& block : blocks) CUEMM_CU(cuMemAllocFromPoolAsync, &block, kBlock, pool, stream);
    CUEMM_CU(cuStreamSynchronize, stream);
    EXPECT_GE(reserved_bytes(pool), 4 * kBlock);
    const std::uint64_t free_with_blocks = driver_memory_info(context).free;
    for (auto& block : blocks) CUEMM_CU(cuMemFreeAsync, block, stream);
    CUEMM_CU(cuStreamSynchronize, stream);
    EXPECT_EQ(used_bytes(pool), 0u);
    if (threshold == 0) {
      EXPECT_EQ(reserved_bytes(pool), 0u) << "a synchronisation gives back what passes the threshold";
      EXPECT_GE(driver_memory_info(context).free, free_with_blocks + 4 * kBlock);
    } else {
      EXPECT_GE(reserved_bytes(pool), 4 * kBlock) << "kept up to the threshold";
      EXPECT_LE(driver_memory_info(context).free, free_with_blocks + kMiB) << "kept memory counts against the device";
      // Kept memory serves the pool's next block without taking more.
      const std::uint64_t reserved = reserved_bytes(pool);
      CUEMM_CU(cuMemAllocFromPoolAsync, &blocks[0], 2 * kBlock, pool, stream);
      EXPECT_EQ(reserved_bytes(pool), reserved);
      CUEMM_CU(cuMemFreeAsync, blocks[0], stream);
      CUEMM_CU(cuStreamSynchronize, stream);
      CUEMM_CU(cuMemPoolTrimTo, pool, kBlock);
      EXPECT_GE(reserved_bytes(pool), kBlock) << "trimmed, it keeps at least what it was asked to keep";
      EXPECT_LT(reserved_bytes(pool), 2 * kBlock);
      CUEMM_CU(cuMemPoolTrimTo, pool, std::size_t{0});
      EXPECT_EQ(reserved_bytes(pool), 0u);
    }
    CUEMM_CU(cuMemPoolDestroy, pool);
  }

  // A cuMemAlloc larger than the device's free memory takes back what a pool keeps.
  const cuda::CUmemoryPool pool = make_stream_ordered_pool(context, UINT64_MAX);
  const std::uint64_t kept = driver_memory_info(context).free / 4 * 3 / (2 * kMiB) * (2 * kMiB);
  cuda::CUdeviceptr block = 0;
  CUEMM_CU(cuMemAllocFromPoolAsync, &block, kept, pool, stream);
  CUEMM_CU(cuMemFreeAsync, block, stream);
  CUEMM_CU(cuStreamSynchronize, stream);
  ASSERT_GE(reserved_bytes(pool), kept);
  const std::uint64_t asked = driver_memory_info(context).free + kept / 2;
  cuda::CUdeviceptr other = 0;
  CUEMM_CU(cuMemAlloc, &other, asked);
  EXPECT_LT(reserved_bytes(pool), kept / 2 + 1) << "the pool gave back what the allocation needed";
  CUEMM_CU(cuMemFree, other);
  CUEMM_CU(cuMemPoolDestroy, pool);
}

// What a capture under way makes of the calls that the pools make, as the
// H100's driver does (bench/probes/probe_capture.cpp, docs/pool-measurements.md)
// and the simulated one must: refused calls end the capture. And captured
// work runs at the graph's launches, not at its capture.
TEST(Driver, ACaptureRefusesAndEndsOnTheCallsTheH100Refuses) {
  const auto& api = driver::Driver::get().api();
  if (!api.cuStreamBeginCapture || !api.cuGraphInstantiate || !api.cuThreadExchangeStreamCaptureMode)
    GTEST_SKIP() << "needs a driver that captures graphs (CUDA 11.4)";
  Context& context = current_context();
  ScopedContext scope(context);
  const Stream non_blocking = context.create_stream(/*non_blocking=*/true);
  const Stream blocking = context.create_stream(/*non_blocking=*/false);
  cuda::CUevent event = nullptr;
  CUEMM_CU(cuEventCreate, &event, cuda::CU_EVENT_DISABLE_TIMING);
  CUEMM_CU(cuEventRecord, event, non_blocking.handle());
  non_blocking.synchronize();
  std::vector<cuda::CUdeviceptr> allocated;
  const auto allocate = [&] {
    cuda::CUdeviceptr block = 0;
    const cuda::CUresult result = CUEMM_CU_RESULT(cuMemAlloc, &block, std::size_t{2} << 20);
    if (result == cuda::CUDA_SUCCESS) allocated.push_back(block);
    return result;
  };
  struct Outcome {
    bool call_succeeded;
    bool capture_survived;
  };
  // `call` between the begin and the end of a capture on `stream` in `mode`,
  // from this thread or another, with the caller's own mode relaxed or not.
  enum class Caller { capturing_thread, another_thread, relaxed_capturing_thread };
  const auto during = [&](const Stream& stream, int mode, const std::function<cuda::CUresult()>& call,
                          Caller caller = Caller::capturing_thread) {
    CUEMM_CU(cuStreamBeginCapture, stream.handle(), mode);
    cuda::CUresult result = cuda::CUDA_SUCCESS;
    if (caller == Caller::another_thread) {
      std::thread([&] {
        ScopedContext other_scope(context);
        result = call();
      }).join();
    } else if (caller == Caller::relaxed_capturing_thread) {
      int previous = cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
      CUEMM_CU(cuThreadExchangeStreamCaptureMode, &previous);
      result = call();
      CUEMM_CU(cuThreadExchangeStreamCaptureMode, &previous);
    } else {
      result = call();
    }
    cuda::CUgraph graph = nullptr;
    const cuda::CUresult ended = CUEMM_CU_RESULT(cuStreamEndCapture, stream.handle(), &graph);
    if (graph) CUEMM_CU(cuGraphDestroy, graph);
    return Outcome{result == cuda::CUDA_SUCCESS, ended == cuda::CUDA_SUCCESS};
  };
  constexpr int kGlobal = cuda::CU_STREAM_CAPTURE_MODE_GLOBAL;
  constexpr int kThreadLocal = cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  constexpr int kRelaxed = cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
  auto expect = [](Outcome outcome, bool succeeds, bool survives, const char* what) {
    EXPECT_EQ(outcome.call_succeeded, succeeds) << what;
    EXPECT_EQ(outcome.capture_survived, survives) << what;
  };
  expect(during(non_blocking, kGlobal, allocate), false, false, "cuMemAlloc in a global capture");
  expect(during(non_blocking, kGlobal, allocate, Caller::another_thread), false, false,
         "cuMemAlloc from another thread in a global capture");
  expect(during(non_blocking, kThreadLocal, allocate, Caller::another_thread), true, true,
         "cuMemAlloc from another thread in a thread-local capture");
  expect(during(non_blocking, kThreadLocal, allocate), false, false, "cuMemAlloc in a thread-local capture");
  expect(during(non_blocking, kRelaxed, allocate), true, true, "cuMemAlloc in a relaxed capture");
  expect(during(non_blocking, kGlobal, allocate, Caller::relaxed_capturing_thread), true, true,
         "cuMemAlloc relaxed in a global capture");
  const auto query_event = [&] { return CUEMM_CU_RESULT(cuEventQuery, event); };
  expect(during(non_blocking, kGlobal, query_event), false, false, "cuEventQuery in a global capture");
  expect(during(non_blocking, kGlobal, query_event, Caller::relaxed_capturing_thread), true, true,
         "cuEventQuery relaxed in a global capture");
  const auto record_for_context = [&] { return CUEMM_CU_RESULT(cuCtxRecordEvent, context.handle(), event); };
  if (api.cuCtxRecordEvent) {
    expect(during(non_blocking, kRelaxed, record_for_context, Caller::relaxed_capturing_thread), false, false,
           "cuCtxRecordEvent in a relaxed capture");
  }
  const auto record_on_legacy = [&] { return CUEMM_CU_RESULT(cuEventRecord, event, cuda::CU_STREAM_LEGACY); };
  expect(during(non_blocking, kGlobal, record_on_legacy), true, true,
         "cuEventRecord on the legacy stream beside a non-blocking stream's capture");
  expect(during(blocking, kRelaxed, record_on_legacy, Caller::relaxed_capturing_thread), false, false,
         "cuEventRecord on the legacy stream beside a blocking stream's capture");
  // Whether the legacy stream is capturing: beside a blocking stream's
  // capture the error its work would meet, and the capture goes on.
  if (api.cuStreamIsCapturing) {
    cuda::CUresult answer = cuda::CUDA_SUCCESS;
    int legacy_status = -1;
    const auto ask_legacy = [&] {
      answer = CUEMM_CU_RESULT(cuStreamIsCapturing, cuda::CU_STREAM_LEGACY, &legacy_status);
      return answer;
    };
    expect(during(blocking, kGlobal, ask_legacy), false, true,
           "cuStreamIsCapturing of the legacy stream beside a blocking stream's capture");
    EXPECT_EQ(answer, cuda::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    expect(during(non_blocking, kGlobal, ask_legacy), true, true,
           "cuStreamIsCapturing of the legacy stream beside a non-blocking stream's capture");
    EXPECT_EQ(legacy_status, cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  }
  for (const cuda::CUdeviceptr block : allocated) CUEMM_CU(cuMemFree, block);

  // A fill captured, then launched twice: nothing at the capture.
  constexpr std::uint64_t kCount = 64;
  DeviceArray<std::uint32_t> words(kCount, context);
  CUEMM_CU(cuMemsetD32, words.device_pointer(), 0u, kCount);
  const Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const Function add = module.function("cuemm_add_u32");
  cuda::CUgraph graph = nullptr;
  CUEMM_CU(cuStreamBeginCapture, non_blocking.handle(), kGlobal);
  add.launch({1}, {64}, non_blocking, words.device_pointer(), 5u, kCount);
  CUEMM_CU(cuStreamEndCapture, non_blocking.handle(), &graph);
  EXPECT_EQ(words.copy_to_host(), std::vector<std::uint32_t>(kCount, 0u)) << "the capture ran the kernel";
  cuda::CUgraphExec executable = nullptr;
  CUEMM_CU(cuGraphInstantiate, &executable, graph, 0);
  for (int launch = 0; launch < 2; ++launch) CUEMM_CU(cuGraphLaunch, executable, non_blocking.handle());
  non_blocking.synchronize();
  EXPECT_EQ(words.copy_to_host(), std::vector<std::uint32_t>(kCount, 10u)) << "two launches did not add twice";
  CUEMM_CU(cuGraphExecDestroy, executable);
  CUEMM_CU(cuGraphDestroy, graph);
  CUEMM_CU(cuEventDestroy, event);
}

// A capture that forks to a second stream through an event and joins it back
// through another, as multi-stream graphs are captured, held to what the H100
// does (bench/probes/probe_capture_fork.cpp): the second stream belongs to the
// capture from its wait on; work captured there must be joined back before the
// capture ends, and the capture ends only on its first stream; an event
// recorded in it is no event to query; a wait there for an event from before
// the capture crosses its boundary. Each of those mistakes ends the capture.
// And the graph runs both streams' work in order.
TEST(Driver, ACaptureForksToAStreamThatWaitsForItsEventAndEndsOnceJoined) {
  const auto& api = driver::Driver::get().api();
  if (!api.cuStreamBeginCapture || !api.cuGraphInstantiate || !api.cuStreamIsCapturing)
    GTEST_SKIP() << "needs a driver that captures graphs (CUDA 11.4)";
  Context& context = current_context();
  ScopedContext scope(context);
  const Stream origin = context.create_stream(/*non_blocking=*/true);
  const Stream side = context.create_stream(/*non_blocking=*/true);
  cuda::CUevent fork = nullptr, join = nullptr, before = nullptr;
  for (cuda::CUevent* event : {&fork, &join, &before}) CUEMM_CU(cuEventCreate, event, cuda::CU_EVENT_DISABLE_TIMING);
  CUEMM_CU(cuEventRecord, before, side.handle());
  side.synchronize();
  const auto status = [](const Stream& stream) {
    int value = -1;
    CUEMM_CU(cuStreamIsCapturing, stream.handle(), &value);
    return value;
  };
  const auto relaxed = [](const std::function<cuda::CUresult()>& call) {
    int mode = cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
    CUEMM_CU(cuThreadExchangeStreamCaptureMode, &mode);
    const cuda::CUresult result = call();
    CUEMM_CU(cuThreadExchangeStreamCaptureMode, &mode);
    return result;
  };
  constexpr std::uint64_t kCount = 256;
  DeviceArray<std::uint32_t> first(kCount, context), second(kCount, context), copied(kCount, context);
  for (const auto* words : {&first, &second, &copied}) CUEMM_CU(cuMemsetD32, words->device_pointer(), 0u, kCount);
  const Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const Function add = module.function("cuemm_add_u32");
  const Function fill = module.function("cuemm_fill_u32");
  const auto work_on_side = [&] { fill.launch({1}, {256}, side, second.device_pointer(), 7u, kCount); };
  const auto join_back = [&] {
    EXPECT_EQ(CUEMM_CU_RESULT(cuEventRecord, join, side.handle()), cuda::CUDA_SUCCESS);
    EXPECT_EQ(CUEMM_CU_RESULT(cuStreamWaitEvent, origin.handle(), join, 0), cuda::CUDA_SUCCESS);
  };
  // A capture on `origin` forked to `side`, then `body`; the result of its end
  // on `origin`, both streams no longer capturing after it, and its graph.
  cuda::CUgraph graph = nullptr;
  const auto capture_forked = [&](const std::function<void()>& body) {
    CUEMM_CU(cuStreamBeginCapture, origin.handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
    add.launch({1}, {256}, origin, first.device_pointer(), 3u, kCount);
    CUEMM_CU(cuEventRecord, fork, origin.handle());
    EXPECT_EQ(status(side), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
    CUEMM_CU(cuStreamWaitEvent, side.handle(), fork, 0);
    EXPECT_EQ(status(side), cuda::CU_STREAM_CAPTURE_STATUS_ACTIVE) << "waiting for a captured event did not fork";
    body();
    const cuda::CUresult ended = CUEMM_CU_RESULT(cuStreamEndCapture, origin.handle(), &graph);
    EXPECT_EQ(status(origin), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT_EQ(status(side), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
    if (ended != cuda::CUDA_SUCCESS) {
      EXPECT_EQ(graph, nullptr);
    }
    if (ended == cuda::CUDA_SUCCESS && graph) CUEMM_CU(cuGraphDestroy, graph);
    return ended;
  };
  EXPECT_EQ(capture_forked([] {}), cuda::CUDA_SUCCESS) << "a fork that captured nothing needs no join";
  EXPECT_EQ(capture_forked(work_on_side), cuda::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  EXPECT_EQ(capture_forked([&] {
              work_on_side();
              join_back();
              work_on_side();
            }),
            cuda::CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
      << "work after the join";
  EXPECT_EQ(capture_forked([&] {
              work_on_side();
              cuda::CUgraph none = nullptr;
              EXPECT_EQ(CUEMM_CU_RESULT(cuStreamEndCapture, side.handle(), &none),
                        cuda::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
              EXPECT_EQ(status(origin), cuda::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
            }),
            cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
      << "an end on the forked stream";
  EXPECT_EQ(capture_forked([&] {
              EXPECT_EQ(relaxed([&] { return CUEMM_CU_RESULT(cuEventQuery, fork); }), cuda::CUDA_ERROR_CAPTURED_EVENT);
            }),
            cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
      << "a query of a captured event";
  EXPECT_EQ(capture_forked([&] {
              EXPECT_EQ(CUEMM_CU_RESULT(cuStreamWaitEvent, origin.handle(), before, 0),
                        cuda::CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
            }),
            cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
      << "a wait for an event from before the capture";

  // Joined back: the copy after the join sees the side's fill.
  CUEMM_CU(cuStreamBeginCapture, origin.handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
  add.launch({1}, {256}, origin, first.device_pointer(), 3u, kCount);
  CUEMM_CU(cuEventRecord, fork, origin.handle());
  CUEMM_CU(cuStreamWaitEvent, side.handle(), fork, 0);
  work_on_side();
  join_back();
  CUEMM_CU(cuMemcpyDtoDAsync, copied.device_pointer(), second.device_pointer(), kCount * 4, origin.handle());
  ASSERT_EQ(CUEMM_CU_RESULT(cuStreamEndCapture, origin.handle(), &graph), cuda::CUDA_SUCCESS);
  EXPECT_EQ(status(side), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  origin.synchronize();
  EXPECT_EQ(first.copy_to_host(), std::vector<std::uint32_t>(kCount, 0u)) << "the capture ran its work";
  EXPECT_EQ(copied.copy_to_host(), std::vector<std::uint32_t>(kCount, 0u)) << "the capture ran its work";
  cuda::CUgraphExec executable = nullptr;
  CUEMM_CU(cuGraphInstantiate, &executable, graph, 0);
  for (int launch = 0; launch < 2; ++launch) CUEMM_CU(cuGraphLaunch, executable, origin.handle());
  origin.synchronize();
  EXPECT_EQ(first.copy_to_host(), std::vector<std::uint32_t>(kCount, 6u)) << "the first stream's work";
  EXPECT_EQ(copied.copy_to_host(), std::vector<std::uint32_t>(kCount, 7u))
      << "the copy after the join did not see the second stream's fill";
  CUEMM_CU(cuGraphExecDestroy, executable);
  CUEMM_CU(cuGraphDestroy, graph);
  for (cuda::CUevent event : {fork, join, before}) CUEMM_CU(cuEventDestroy, event);
}
