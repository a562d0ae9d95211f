// What the adaptors make of stream-ordered calls (StreamOrderedAllocator):
// counted, logged with their stream, tracked and capped as memalloc is, over
// each manager that has them, and refused with a reason where they cannot be.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "support/test_support.hpp"
#include "util/address_map.hpp"
#include "util/hex_address.hpp"

using namespace cuemm;
using cuemm::testing::throws;

namespace {

// The managers with stream-ordered calls, and the driver call that gives
// each its device memory (to fail it).
struct OverPool {
  using Manager = PoolMemoryManager;
  static constexpr const char* kDriverAllocation = "cuMemAlloc";
};
struct OverAsync {
  using Manager = AsyncMemoryManager;
  static constexpr const char* kDriverAllocation = "cuMemAllocFromPoolAsync";
};

template <typename Upstream>
class StreamOrderedAdaptors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (simulation::active()) simulation::clear_faults();
  }
  void TearDown() override {
    if (simulation::active()) simulation::clear_faults();
  }

  std::unique_ptr<BaseMemoryManager> upstream() { return std::make_unique<typename Upstream::Manager>(&context); }
  // Frees the manager under `chain` refused itself (the pool counts them where it checks frees).
  static std::uint64_t upstream_refusals(BaseMemoryManager& chain) {
    return find_adaptor<typename Upstream::Manager>(chain)->statistics().rejected_frees;
  }

  // Writes `bytes` bytes of `value` at `block` on `stream` and reads them
  // back there: whether they all came back.
  static bool keeps(cuda::CUdeviceptr block, std::size_t bytes, unsigned value, cuda::CUstream stream) {
    const auto byte = static_cast<unsigned char>(value);
    CUEMM_CU(cuMemsetD8Async, block, byte, bytes, stream);
    std::vector<unsigned char> back(bytes);
    CUEMM_CU(cuMemcpyDtoHAsync, back.data(), block, bytes, stream);
    CUEMM_CU(cuStreamSynchronize, stream);
    return std::all_of(back.begin(), back.end(), [&](unsigned char got) { return got == byte; });
  }

  Context& context = current_context();
};

using Upstreams = ::testing::Types<OverPool, OverAsync>;
TYPED_TEST_SUITE(StreamOrderedAdaptors, Upstreams);

std::uintptr_t handle_of(cuda::CUstream stream) { return reinterpret_cast<std::uintptr_t>(stream); }

}  // namespace

TYPED_TEST(StreamOrderedAdaptors, TheyAreCountedAsMemallocsAre) {
  StatisticsAdaptor stats(&this->context, this->upstream());
  stats.initialize();
  ASSERT_EQ(stream_ordered_allocator(stats), &stats);
  Stream stream = this->context.create_stream();
  const cuda::CUdeviceptr a = stats.allocate(1000, stream.handle());
  const cuda::CUdeviceptr b = stats.allocate(3 << 20, stream.handle());
  EXPECT_EQ(a % 256, 0u);
  EXPECT_TRUE(this->keeps(b, 3 << 20, 0xa5, stream.handle()));
  auto memory = stats.memalloc(500);  // the two interfaces count together
  {
    const AllocationCounts during = stats.statistics().of(MemoryKind::Device);
    EXPECT_EQ(during.current_count, 3u);
    EXPECT_EQ(during.current_bytes, 1000u + (3 << 20) + 500u);
  }
  stats.deallocate(b, 3 << 20, stream.handle());
  stats.deallocate(a, 1000, stream.handle());
  memory.reset();
  const MemoryStatistics after = stats.statistics();
  const AllocationCounts& device = after.of(MemoryKind::Device);
  EXPECT_EQ(device.current_count, 0u);
  EXPECT_EQ(device.current_bytes, 0u);
  EXPECT_EQ(device.total_count, 3u);
  EXPECT_EQ(device.peak_bytes, 1000u + (3 << 20) + 500u);
  EXPECT_EQ(after.device_size_histogram[9], 1u);   // 1000 in [512, 1024)
  EXPECT_EQ(after.device_size_histogram[21], 1u);  // 3 MiB in [2 MiB, 4 MiB)
  EXPECT_EQ(stats.refused_frees(), 0u);
}

// The seed's Stream column holds the call's stream; the log still reads back.
TYPED_TEST(StreamOrderedAdaptors, TheLogsRowsCarryTheirStream) {
  std::ostringstream out;
  LoggingAdaptor logged(&this->context, this->upstream(), out);
  logged.initialize();
  Stream stream = this->context.create_stream();
  const cuda::CUdeviceptr own = logged.allocate(4096, stream.handle());
  const cuda::CUdeviceptr per_thread = logged.allocate(80, cuda::CU_STREAM_PER_THREAD);
  logged.deallocate(per_thread, 80, cuda::CU_STREAM_PER_THREAD);
  logged.deallocate(own, 4096, stream.handle());
  auto memory = logged.memalloc(256);
  memory.reset();
  logged.flush();

  std::vector<std::string> lines;
  std::stringstream in(out.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u) << out.str();
  const std::string stream_hex = util::hex_address(handle_of(stream.handle()));
  EXPECT_EQ(lines[1].rfind("Alloc,0," + util::hex_address(own) + "," + stream_hex + ",4096,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("Alloc,0," + util::hex_address(per_thread) + ",0x2,80,", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("Free,0," + util::hex_address(per_thread) + ",0x2,80,", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("Free,0," + util::hex_address(own) + "," + stream_hex + ",4096,", 0), 0u) << lines[4];
  EXPECT_NE(lines[5].find(",0,256,"), std::string::npos) << "memalloc's row has no stream: " << lines[5];
  for (const std::string& line : lines) EXPECT_EQ(std::count(line.begin(), line.end(), ','), 11) << line;

  std::istringstream back(out.str());
  const std::vector<LoggedEvent> events = read_memory_log(back, "the log");
  EXPECT_EQ(events.size(), 6u) << "every row reads back";
}

TYPED_TEST(StreamOrderedAdaptors, TrackingListsTheBlocksOutstandingWithTheirStream) {
  std::ostringstream report;
  TrackingAdaptor tracking(&this->context, this->upstream(), &report);
  tracking.initialize();
  const cuda::CUdeviceptr kept = [&] {
    ScopedCallSite site("loader.cpp:40");
    return tracking.allocate(1 << 20, cuda::CU_STREAM_PER_THREAD);
  }();
  const cuda::CUdeviceptr freed = tracking.allocate(1 << 16, cuda::CU_STREAM_PER_THREAD);
  tracking.deallocate(freed, 1 << 16, cuda::CU_STREAM_PER_THREAD);
  const std::vector<AllocationRecord> outstanding = tracking.outstanding();
  ASSERT_EQ(outstanding.size(), 1u);
  EXPECT_EQ(outstanding[0].address, kept);
  EXPECT_EQ(outstanding[0].size, std::size_t{1} << 20);
  EXPECT_EQ(outstanding[0].call_site, "loader.cpp:40");
  ASSERT_TRUE(outstanding[0].stream.has_value());
  EXPECT_EQ(*outstanding[0].stream, handle_of(cuda::CU_STREAM_PER_THREAD));
  EXPECT_NE(tracking.leak_report().find("loader.cpp:40 (stream 0x2)"), std::string::npos) << tracking.leak_report();
  tracking.deallocate(kept, 1 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_TRUE(tracking.outstanding().empty());
}

TYPED_TEST(StreamOrderedAdaptors, TheLimitCapsThemWithMemallocs) {
  LimitingAdaptor limited(&this->context, this->upstream(), 10 << 20);
  limited.initialize();
  auto memory = limited.memalloc(6 << 20);
  EXPECT_TRUE(throws<OutOfMemory>([&] { limited.allocate(5 << 20, cuda::CU_STREAM_PER_THREAD); }, "5.00 MiB",
                                  "and 6.00 MiB", "are in use", "limit is 10.00 MiB"));
  EXPECT_EQ(limited.in_use(), std::size_t{6} << 20) << "a refused request still counts";
  const cuda::CUdeviceptr block = limited.allocate(4 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(limited.in_use(), std::size_t{10} << 20);
  EXPECT_THROW(limited.memalloc(1), OutOfMemory);
  limited.deallocate(block, 4 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(limited.in_use(), std::size_t{6} << 20);
}

// The adaptor knows each block it handed out: a free of another pointer, of
// the wrong size, or a second one, is refused before the upstream sees it,
// and the counts stay right.
TYPED_TEST(StreamOrderedAdaptors, FreesOfNoBlockOrOfTheWrongSizeAreRefusedAndFreeNothing) {
  StatisticsAdaptor stats(&this->context, this->upstream());
  stats.initialize();
  const cuda::CUstream stream = cuda::CU_STREAM_PER_THREAD;
  const cuda::CUdeviceptr block = stats.allocate(1 << 20, stream);
  auto memory = stats.memalloc(1 << 20);
  ::testing::internal::CaptureStderr();
  stats.deallocate(block, 2 << 20, stream);                 // the wrong size
  stats.deallocate(block + 256, 1 << 20, stream);           // no block starts there
  stats.deallocate(memory->device_pointer(), 1 << 20, stream);  // memalloc's: freed by its pointer
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 2u) << "a refused free was counted";
  stats.deallocate(block, 1 << 20, stream);
  stats.deallocate(block, 1 << 20, stream);  // again
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(stats.refused_frees(), 4u) << said;
  EXPECT_NE(said.find("allocated with 1048576 bytes"), std::string::npos) << said;
  EXPECT_NE(said.find(util::hex_address(block + 256)), std::string::npos) << said;
  EXPECT_EQ(this->upstream_refusals(stats), 0u) << "the upstream saw a refused free";
  const AllocationCounts device = stats.statistics().of(MemoryKind::Device);
  EXPECT_EQ(device.current_count, 1u);
  EXPECT_EQ(device.current_bytes, std::size_t{1} << 20);
  EXPECT_TRUE(this->keeps(memory->device_pointer(), 1 << 20, 7, stream)) << "memalloc's block was freed";
}

// A reset gives every block back: the adaptor forgets them, and a later free
// of one is refused (the upstream has it no more) rather than counted twice.
TYPED_TEST(StreamOrderedAdaptors, AResetForgetsTheBlocksAndTheirLaterFreesAreRefused) {
  StatisticsAdaptor stats(&this->context, this->upstream());
  stats.initialize();
  const cuda::CUstream stream = cuda::CU_STREAM_PER_THREAD;
  const cuda::CUdeviceptr first = stats.allocate(1 << 20, stream);
  const cuda::CUdeviceptr second = stats.allocate(3 << 20, stream);
  stats.reset();
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 0u);
  ::testing::internal::CaptureStderr();
  stats.deallocate(first, 1 << 20, stream);
  stats.deallocate(second, 3 << 20, stream);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(stats.refused_frees(), 2u) << said;
  EXPECT_NE(said.find("given back by a reset()"), std::string::npos) << said;
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 0u) << "a release was counted twice";
  EXPECT_EQ(this->upstream_refusals(stats), 0u);
  const cuda::CUdeviceptr after = stats.allocate(2 << 20, stream);
  EXPECT_TRUE(this->keeps(after, 2 << 20, 9, stream));
  stats.deallocate(after, 2 << 20, stream);
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 0u);
  EXPECT_EQ(stats.refused_frees(), 2u);
}

namespace {
void resets_beside_threads_leave_the_counts_right(bool stacked) {
  Context& context = current_context();
  std::unique_ptr<BaseMemoryManager> upstream = std::make_unique<AsyncMemoryManager>(&context);
  if (stacked) upstream = std::make_unique<LimitingAdaptor>(&context, std::move(upstream), std::size_t{1} << 32);
  StatisticsAdaptor stats(&context, std::move(upstream));
  stats.initialize();
  // The resets begin once every thread has made its first step, and the
  // threads go on until kResets have been made, however the machine
  // schedules them.
  constexpr int kThreads = 4, kResets = 30;
  std::atomic<int> started{0}, resets{0};
  std::atomic<bool> done{false};
  ::testing::internal::CaptureStderr();  // (the refused frees' lines)
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      Stream stream = context.create_stream();
      std::mt19937 random(t + 3);
      std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> held;
      for (int step = 0; step < 400 || resets.load() < kResets; ++step) {
        if (held.size() < 8 && random() % 2) {
          const std::size_t size = 256 * (1 + random() % 1024);
          held.emplace_back(stats.allocate(size, stream.handle()), size);
        } else if (!held.empty()) {
          stats.deallocate(held.back().first, held.back().second, stream.handle());
          held.pop_back();
        }
        if (step == 0) started.fetch_add(1);
      }
      for (const auto& [block, size] : held) stats.deallocate(block, size, stream.handle());
      stream.synchronize();
    });
  }
  std::thread resetting([&] {
    while (started.load() < kThreads) std::this_thread::yield();
    while (!done.load()) {
      stats.reset();
      resets.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  resetting.join();
  ::testing::internal::GetCapturedStderr();
  EXPECT_GE(resets.load(), kResets);
  const AllocationCounts device = stats.statistics().of(MemoryKind::Device);
  EXPECT_EQ(device.current_count, 0u) << "a count outlived its block";
  EXPECT_EQ(device.current_bytes, 0u);
  EXPECT_GT(stats.refused_frees(), 0u) << "no reset fell between an allocation and its free";
  const AsyncStatistics bottom = find_adaptor<AsyncMemoryManager>(stats)->statistics();
  EXPECT_EQ(bottom.rejected_frees, 0u) << "a free of a block a reset gave back reached the upstream";
  EXPECT_EQ(bottom.used_bytes, 0u);
  const cuda::CUdeviceptr block = stats.allocate(1 << 20, cuda::CU_STREAM_PER_THREAD);
  stats.deallocate(block, 1 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 0u);
}
}  // namespace

// Resets from one thread while others allocate and free on their streams
// (over the async manager, whose record refuses frees of blocks a reset gave
// back; the pool's raw calls ask that no reset come between): however the
// frees fall against the resets, the counts end at nothing in use.
// Also with a limit under the statistics: each adaptor's call holds the
// one's under it, and the outer reset resets both.
TEST(StreamOrderedAdaptorsOverAsync, ResetsBesideThreadsLeaveTheCountsRight) {
  for (const bool stacked : {false, true}) {
    SCOPED_TRACE(stacked ? "statistics over a limit over the async manager" : "statistics over the async manager");
    resets_beside_threads_leave_the_counts_right(stacked);
  }
}

namespace {
// The async manager, whose reset() waits, once it has begun, for a call that
// another thread makes meanwhile through the adaptor above it (for at most
// `patience`), and notes whether that call came back while it waited.
class ResetThatWaits final : public AsyncMemoryManager {
 public:
  ResetThatWaits(Context* context, std::chrono::milliseconds patience)
      : AsyncMemoryManager(context), patience_(patience) {}
  std::atomic<bool> begun{false}, call_returned{false}, overlapped{false};

 protected:
  void on_reset() override {
    begun = true;
    const auto until = std::chrono::steady_clock::now() + patience_;
    while (!call_returned && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    overlapped = call_returned.load();
    AsyncMemoryManager::on_reset();
  }

 private:
  std::chrono::milliseconds patience_;
};
}  // namespace

// The ordering the test above leaves to chance: an allocation or a free that
// comes while the upstream's reset runs waits for it, so the reset never gives
// back a block counted after it, nor is its free passed on to whatever the
// upstream hands out there next.
TEST(StreamOrderedAdaptorsOverAsync, CallsWaitForTheUpstreamsReset) {
  Context& context = current_context();
  for (const bool allocating : {true, false}) {
    SCOPED_TRACE(allocating ? "an allocation during the reset" : "a free during the reset");
    auto upstream_owned = std::make_unique<ResetThatWaits>(&context, std::chrono::milliseconds(300));
    ResetThatWaits& upstream = *upstream_owned;
    StatisticsAdaptor stats(&context, std::move(upstream_owned));
    stats.initialize();
    Stream stream = context.create_stream();
    const cuda::CUdeviceptr before = stats.allocate(4096, stream.handle());
    cuda::CUdeviceptr during = 0;
    ::testing::internal::CaptureStderr();  // (the refused free's line)
    std::thread caller([&] {
      ScopedContext scope(context);
      while (!upstream.begun) std::this_thread::yield();
      if (allocating)
        during = stats.allocate(8192, stream.handle());
      else
        stats.deallocate(before, 4096, stream.handle());
      upstream.call_returned = true;
    });
    stats.reset();
    caller.join();
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(upstream.overlapped) << "the call came back while the upstream's reset ran";
    EXPECT_EQ(upstream.statistics().rejected_frees, 0u) << "a free reached the upstream after its reset";
    if (allocating) {
      EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 1u);
      stats.deallocate(during, 8192, stream.handle());  // counted after the reset, and still the upstream's
      EXPECT_EQ(stats.refused_frees(), 0u) << said;
      EXPECT_EQ(upstream.statistics().rejected_frees, 0u);
    } else {
      EXPECT_EQ(stats.refused_frees(), 1u) << "the reset gave the block back: its free is refused";
      EXPECT_NE(said.find("given back by a reset()"), std::string::npos) << said;
    }
    EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 0u);
    EXPECT_EQ(upstream.statistics().used_bytes, 0u);
  }
}

// A reset from inside one of the adaptor's own calls (an out-of-memory
// handler of an adaptor under it) would wait for itself: it is refused.
TEST(StreamOrderedAdaptorsOverAsync, AResetFromInsideItsOwnAllocationIsRefused) {
  Context& context = current_context();
  StatisticsAdaptor* outer = nullptr;
  std::string refusal;
  auto handled = std::make_unique<OutOfMemoryHandlerAdaptor>(
      &context, std::make_unique<LimitingAdaptor>(&context, std::make_unique<AsyncMemoryManager>(&context), 1 << 20),
      [&](const OutOfMemory&, int) {
        try {
          outer->reset();
        } catch (const StateError& error) {
          refusal = error.what();
        }
        return false;
      });
  StatisticsAdaptor stats(&context, std::move(handled));
  outer = &stats;
  stats.initialize();
  EXPECT_TRUE(throws<OutOfMemory>([&] { stats.allocate(2 << 20, cuda::CU_STREAM_PER_THREAD); }));
  EXPECT_NE(refusal.find("would wait for itself"), std::string::npos) << refusal;
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 0u);
  const cuda::CUdeviceptr block = stats.allocate(1000, cuda::CU_STREAM_PER_THREAD);  // not left closed
  stats.deallocate(block, 1000, cuda::CU_STREAM_PER_THREAD);
  stats.reset();
}

// Threads on their own streams, each writing and checking its blocks, through
// a limit over statistics: no block loses its contents, and the counts add up.
TYPED_TEST(StreamOrderedAdaptors, ThreadsOnTheirOwnStreamsAddUp) {
  auto stats_owned = std::make_unique<StatisticsAdaptor>(&this->context, this->upstream());
  StatisticsAdaptor* stats = stats_owned.get();
  LimitingAdaptor limited(&this->context, std::move(stats_owned), std::size_t{1} << 30);
  limited.initialize();
  constexpr int kThreads = 8, kSteps = 150;
  std::atomic<int> lost{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(this->context);
      Stream stream = this->context.create_stream();
      std::mt19937 random(t);
      std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> held;
      for (int step = 0; step < kSteps; ++step) {
        if (held.size() < 6 && random() % 3) {
          const std::size_t size = 256 * (1 + random() % 8192);
          const cuda::CUdeviceptr block = limited.allocate(size, stream.handle());
          if (!this->keeps(block, size, static_cast<unsigned>(t * 31 + step), stream.handle())) ++lost;
          held.emplace_back(block, size);
        } else if (!held.empty()) {
          const auto [block, size] = held[random() % held.size()];
          limited.deallocate(block, size, stream.handle());
          held.erase(std::find(held.begin(), held.end(), std::make_pair(block, size)));
        }
      }
      for (const auto& [block, size] : held) limited.deallocate(block, size, stream.handle());
      stream.synchronize();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(limited.in_use(), 0u);
  EXPECT_EQ(limited.refused_frees(), 0u);
  const AllocationCounts device = stats->statistics().of(MemoryKind::Device);
  EXPECT_EQ(device.current_count, 0u);
  EXPECT_EQ(device.current_bytes, 0u);
  EXPECT_GT(device.total_count, std::size_t{kThreads} * 10);
}

TYPED_TEST(StreamOrderedAdaptors, AFailedAllocationIsCountedAndLeavesTheLimitAsItWas) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  auto stats_owned = std::make_unique<StatisticsAdaptor>(&this->context, this->upstream());
  StatisticsAdaptor* stats = stats_owned.get();
  LimitingAdaptor limited(&this->context, std::move(stats_owned), std::size_t{1} << 30);
  limited.initialize();
  simulation::inject_fault(TypeParam::kDriverAllocation, 1, cuda::CUDA_ERROR_UNKNOWN, 4);
  EXPECT_THROW(limited.allocate(8 << 20, cuda::CU_STREAM_PER_THREAD), CudaError);
  simulation::clear_faults();
  EXPECT_EQ(limited.in_use(), 0u);
  EXPECT_EQ(stats->statistics().failed_allocations, 1u);
  EXPECT_EQ(stats->statistics().of(MemoryKind::Device).current_count, 0u);
  const cuda::CUdeviceptr block = limited.allocate(8 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(limited.in_use(), std::size_t{8} << 20);
  limited.deallocate(block, 8 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(limited.in_use(), 0u);
}

TYPED_TEST(StreamOrderedAdaptors, AnOutOfMemoryHandlerRetriesThem) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  int calls = 0;
  OutOfMemoryHandlerAdaptor handled(&this->context, this->upstream(),
                                    [&](const OutOfMemory&, int attempt) {
                                      ++calls;
                                      simulation::clear_faults();  // (memory found elsewhere)
                                      return attempt == 1;
                                    });
  handled.initialize();
  // Out of memory until the handler runs, through the manager's own retries.
  simulation::inject_fault(TypeParam::kDriverAllocation, 1, cuda::CUDA_ERROR_OUT_OF_MEMORY, 1000);
  const cuda::CUdeviceptr block = handled.allocate(4 << 20, cuda::CU_STREAM_PER_THREAD);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(this->keeps(block, 4 << 20, 3, cuda::CU_STREAM_PER_THREAD));
  handled.deallocate(block, 4 << 20, cuda::CU_STREAM_PER_THREAD);
}

// Over a manager without stream-ordered calls an adaptor has none either:
// stream_ordered_allocator() says so, and a call names the manager.
TEST(StreamOrderedAdaptorsOverOthers, TheCallsSayTheManagerHasNone) {
  Context& context = current_context();
  auto stats_owned = std::make_unique<StatisticsAdaptor>(&context, std::make_unique<DefaultMemoryManager>(&context));
  StatisticsAdaptor* stats = stats_owned.get();
  LimitingAdaptor limited(&context, std::move(stats_owned), std::size_t{1} << 30);
  limited.initialize();
  EXPECT_EQ(stream_ordered_allocator(limited), nullptr);
  EXPECT_EQ(stream_ordered_allocator(*stats), nullptr);
  EXPECT_TRUE(throws<NotSupported>([&] { limited.allocate(4096, cuda::CU_STREAM_PER_THREAD); }, "4096 bytes",
                                   "DefaultMemoryManager", "no stream-ordered calls"));
  EXPECT_TRUE(throws<NotSupported>([&] { stats->allocate(4096, cuda::CU_STREAM_PER_THREAD); },
                                   "DefaultMemoryManager", "no stream-ordered calls"));
  EXPECT_EQ(limited.in_use(), 0u);
  EXPECT_EQ(stats->statistics().of(MemoryKind::Device).current_count, 0u);
  EXPECT_TRUE(throws<InvalidArgument>([&] { limited.allocate(0, cuda::CU_STREAM_PER_THREAD); }, "size must be"));

  // And over one that has them, through every layer.
  StatisticsAdaptor over_pool(&context, std::make_unique<PoolMemoryManager>(&context));
  EXPECT_EQ(stream_ordered_allocator(over_pool), &over_pool);
  DefaultMemoryManager plain(&context);
  EXPECT_EQ(stream_ordered_allocator(plain), nullptr);
}

// The adaptor's record (util::AddressMap): through runs of neighbouring and
// scattered addresses, inserts, replacements, takes of present and absent
// ones and a clear, it holds what a standard map holds.
TEST(AddressMap, AgreesWithAStandardMapThroughRandomInsertsAndTakes) {
  util::AddressMap<std::uint64_t> map;
  std::unordered_map<std::uintptr_t, std::uint64_t> expected;
  std::mt19937_64 random(5);
  for (int round = 0; round < 4; ++round) {
    for (int step = 0; step < 60000; ++step) {
      // Neighbours (as a pool hands out) half the time, else anywhere.
      const std::uintptr_t address =
          random() % 2 ? 0x7f0000000000 + 256 * (random() % 2048) : (random() | 1) & 0x7fffffffffff;
      const std::uint64_t value = random();
      switch (random() % 3) {
        case 0:
          map.insert_or_assign(address, value);
          expected[address] = value;
          break;
        default: {
          const std::optional<std::uint64_t> taken = map.take(address);
          const auto it = expected.find(address);
          ASSERT_EQ(taken.has_value(), it != expected.end()) << "step " << step;
          if (taken) {
            ASSERT_EQ(*taken, it->second);
            expected.erase(it);
          }
        }
      }
      ASSERT_EQ(map.size(), expected.size());
    }
    for (const auto& [address, value] : expected) {
      const std::uint64_t* found = map.find(address);
      ASSERT_NE(found, nullptr);
      EXPECT_EQ(*found, value);
    }
    if (round == 2) {
      map.clear();
      expected.clear();
      EXPECT_EQ(map.find(0x7f0000000000), nullptr);
    }
  }
}

// erase_if (a reset's forgetting of earlier generations): whatever the map's
// runs of neighbours and their wrap past the array's end, it takes out
// exactly the values picked, and every other entry is still found.
TEST(AddressMap, EraseIfTakesOutExactlyWhatItPicks) {
  std::mt19937_64 random(11);
  for (int trial = 0; trial < 200; ++trial) {
    util::AddressMap<std::uint64_t> map;
    std::unordered_map<std::uintptr_t, std::uint64_t> expected;
    const int count = 1 + static_cast<int>(random() % 3000);
    for (int i = 0; i < count; ++i) {
      const std::uintptr_t address =
          random() % 2 ? 0x7f0000000000 + 256 * (random() % 4096) : (random() | 1) & 0x7fffffffffff;
      const std::uint64_t generation = random() % 4;
      map.insert_or_assign(address, generation);
      expected[address] = generation;
    }
    const std::uint64_t below = random() % 5;
    map.erase_if([&](std::uint64_t generation) { return generation < below; });
    std::erase_if(expected, [&](const auto& entry) { return entry.second < below; });
    ASSERT_EQ(map.size(), expected.size()) << "trial " << trial;
    for (const auto& [address, generation] : expected) {
      const std::uint64_t* found = map.find(address);
      ASSERT_NE(found, nullptr) << "trial " << trial << ": an entry kept was lost";
      EXPECT_EQ(*found, generation);
    }
  }
}
