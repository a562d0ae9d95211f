// CaptureScope's GraphMemory, once for each bundled manager and the adaptors
// (CUEMM_MEMORY_MANAGER, set by tests/CMakeLists.txt): a graph's launches
// write the addresses its capture saw, so what the capturing thread allocated
// during the scope serves nobody else while the graph may still run, freed or
// not; other threads' allocations are not held.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuemm/cuemm.hpp"
#include "support/test_support.hpp"

namespace cuemm {
namespace {

const char* manager_name() {
  const char* name = std::getenv("CUEMM_MEMORY_MANAGER");
  return name ? name : "default";
}

bool overlap(const MemoryPointer& a, std::uintptr_t start, std::size_t size) {
  return a.handle() < start + size && start < a.handle() + a.size();
}

std::vector<std::uint8_t> read_back(const std::shared_ptr<MemoryPointer>& memory) {
  return DeviceArray<std::uint8_t>(memory, memory->size()).copy_to_host();
}

struct Freed {
  std::uintptr_t address;
  std::size_t size;
  unsigned char pattern;
};

// Blocks of a few sizes, each filled with its own byte, half of them let go.
std::vector<Freed> allocate_and_drop(Context& context, std::vector<std::shared_ptr<MemoryPointer>>& held) {
  std::vector<Freed> freed;
  for (int i = 0; i < 24; ++i) {
    const std::size_t size = std::size_t{256} << (i % 14);  // 256 B to 2 MiB
    auto block = context.memalloc(size);
    const auto pattern = static_cast<unsigned char>(0x40 + i);
    block->memset(pattern);
    if (i % 2) {
      freed.push_back({block->handle(), size, pattern});
    } else {
      held.push_back(std::move(block));
    }
  }
  return freed;
}

// Allocations of the same sizes as those let go, many of each: a manager
// that had the freed blocks back would hand them out here.
std::vector<std::shared_ptr<MemoryPointer>> churn(Context& context, const std::vector<Freed>& like) {
  std::vector<std::shared_ptr<MemoryPointer>> taken;
  for (int round = 0; round < 24; ++round) {
    for (const Freed& freed : like) {
      auto block = context.memalloc(freed.size);
      block->memset(0xEE);
      if (round % 3 == 0) taken.push_back(std::move(block));  // (the rest go back at once)
    }
  }
  return taken;
}

TEST(CaptureScope, WhatItsThreadFreedServesNobodyWhileItsMemoryIsHeld) {
  Context& context = current_context();
  SCOPED_TRACE(manager_name());
  std::vector<std::shared_ptr<MemoryPointer>> held;
  std::vector<Freed> freed;
  std::shared_ptr<GraphMemory> memory;
  {
    CaptureScope capture(context);
    freed = allocate_and_drop(context, held);
    auto pinned = context.memhostalloc(4096);  // host memory that captured copies may use
    memory = capture.memory();
    EXPECT_EQ(memory->blocks(), 25u);
    EXPECT_EQ(memory->blocks_freed_by_the_program(), freed.size());
    pinned.reset();
    EXPECT_EQ(memory->blocks_freed_by_the_program(), freed.size() + 1);
  }
  // Closed: nothing more is kept, whatever this thread allocates.
  const auto taken = churn(context, freed);
  EXPECT_EQ(memory->blocks(), 25u);
  for (const Freed& block : freed) {
    for (const auto& other : taken)
      ASSERT_FALSE(overlap(*other, block.address, block.size))
          << "a block freed during the capture (" << block.size << " bytes) served another while its GraphMemory was held";
  }
  // Every block's bytes are the ones written during the scope, those let go too.
  for (std::size_t k = 0; k < held.size(); ++k) {
    const auto bytes = read_back(held[k]);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x40 + 2 * k), static_cast<std::ptrdiff_t>(bytes.size()));
  }
  {
    ScopedContext scope(context);
    for (const Freed& block : freed) {
      std::vector<std::uint8_t> bytes(block.size);
      CUEMM_CU(cuMemcpyDtoH, bytes.data(), block.address, block.size);
      EXPECT_EQ(std::count(bytes.begin(), bytes.end(), block.pattern), static_cast<std::ptrdiff_t>(block.size))
          << "a block freed during the capture (" << block.size << " bytes) was written by another's owner";
    }
  }
  std::size_t expected_bytes = 4096;
  for (const auto& block : held) expected_bytes += block->size();
  for (const Freed& block : freed) expected_bytes += block.size;
  EXPECT_EQ(memory->bytes(), expected_bytes);
  memory.reset();  // the freed blocks go back to their manager
  held.clear();
  context.memory_manager().get_memory_info();  // (still consistent)
}

// The premise, with a pool: without the GraphMemory held, the blocks freed
// during the capture are the pool's again, free for a later request (which
// a launch of the graph would then write into); held, they stay in use.
TEST(CaptureScope, APoolHasBackWhatNoGraphMemoryKeeps) {
  Context& context = current_context();
  auto* pool = dynamic_cast<PoolMemoryManager*>(&context.memory_manager());
  if (!pool) GTEST_SKIP() << "the context's manager is not a pool itself (run with CUEMM_MEMORY_MANAGER=pool)";
  std::size_t freed_bytes = 0;
  // The pool's bytes in use while the blocks that the scope's thread kept
  // hold, after a scope whose memory is taken or not.
  auto in_use_after_a_scope = [&](bool take_its_memory) {
    std::vector<std::shared_ptr<MemoryPointer>> held;
    std::shared_ptr<GraphMemory> memory;
    const std::size_t before = pool->statistics().in_use_bytes;
    {
      CaptureScope capture(context);
      freed_bytes = 0;
      for (const Freed& block : allocate_and_drop(context, held)) freed_bytes += block.size;
      if (take_its_memory) memory = capture.memory();
    }
    return pool->statistics().in_use_bytes - before;
  };
  const std::size_t not_taken = in_use_after_a_scope(false);
  const std::size_t taken = in_use_after_a_scope(true);
  EXPECT_GE(taken, not_taken + freed_bytes)
      << "the blocks freed during a scope whose memory nobody took are not the pool's again";
}

TEST(CaptureScope, OtherThreadsAllocationsAreNotKept) {
  Context& context = current_context();
  SCOPED_TRACE(manager_name());
  CaptureScope capture(context);
  auto mine = context.memalloc(1 << 16);
  std::thread other([&] {
    ScopedContext scope(context);
    for (int i = 0; i < 100; ++i) context.memalloc(std::size_t{256} << (i % 12)).reset();
  });
  other.join();
  EXPECT_EQ(capture.memory()->blocks(), 1u);
  EXPECT_EQ(capture.memory()->bytes(), std::size_t{1} << 16);
}

// A thread that records into the same capture joins its scope with a
// Member: its blocks are kept too, the ones it let go serve nobody while the
// memory is held (no stream-less request of the scope's thread, nor of its
// own: nothing orders their work), and their bytes stay as it left them.
TEST(CaptureScope, AMemberThreadsBlocksAreKeptAndServeNoStreamLessRequest) {
  Context& context = current_context();
  SCOPED_TRACE(manager_name());
  std::vector<Freed> by_member;
  std::shared_ptr<GraphMemory> memory;
  {
    CaptureScope capture(context, CaptureScope::Reuse::in_capture_order);
    EXPECT_EQ(CaptureScope::of_this_thread(context), &capture);
    std::thread member_thread([&] {
      EXPECT_EQ(CaptureScope::of_this_thread(context), nullptr) << "another thread's scope read as its own";
      const CaptureScope::Member member(capture);
      ScopedContext current(context);
      for (int i = 0; i < 12; ++i) {  // each size twice: the second request may not take the first block
        auto block = context.memalloc(std::size_t{4096} << (i / 2));
        const auto pattern = static_cast<unsigned char>(0x30 + i);
        block->memset(pattern);
        by_member.push_back({block->handle(), block->size(), pattern});
      }
    });
    member_thread.join();
    std::thread([&] {
      ScopedContext current(context);
      context.memalloc(4096).reset();  // no member: its own
    }).join();
    memory = capture.memory();
    EXPECT_EQ(memory->blocks(), by_member.size());
    for (const Freed& block : by_member) {
      auto mine = context.memalloc(block.size);  // (let go at once: ordered, so the next one of its size may take it)
      ASSERT_FALSE(overlap(*mine, block.address, block.size))
          << "a member thread's block (" << block.size << " bytes) served the scope's thread";
    }
    EXPECT_EQ(memory->blocks(), by_member.size() + 6) << "the scope's thread's own blocks are kept and reused";
  }
  for (std::size_t i = 0; i < by_member.size(); i += 2)
    EXPECT_NE(by_member[i].address, by_member[i + 1].address) << "a member's request took the block it let go";
  const auto taken = churn(context, by_member);
  for (const Freed& block : by_member)
    for (const auto& other : taken)
      ASSERT_FALSE(overlap(*other, block.address, block.size))
          << "a member thread's block (" << block.size << " bytes) served another while its GraphMemory was held";
  ScopedContext current(context);
  for (const Freed& block : by_member) {
    std::vector<std::uint8_t> bytes(block.size);
    CUEMM_CU(cuMemcpyDtoH, bytes.data(), block.address, block.size);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), block.pattern), static_cast<std::ptrdiff_t>(block.size));
  }
}

// A Member that outlives its scope: the thread's allocations are its own
// again, and the Member ends without harm.
TEST(CaptureScope, AMemberThatOutlivesItsScopeKeepsNothingMore) {
  Context& context = current_context();
  std::optional<CaptureScope> capture(std::in_place, context);
  const auto memory = capture->memory();
  std::promise<void> joined, closed;
  std::thread member_thread([&] {
    const CaptureScope::Member member(*capture);
    ScopedContext current(context);
    context.memalloc(512).reset();
    joined.set_value();
    closed.get_future().wait();
    context.memalloc(1024).reset();
  });
  joined.get_future().wait();
  capture.reset();
  closed.set_value();
  member_thread.join();
  EXPECT_EQ(memory->blocks(), 1u);
  EXPECT_EQ(memory->bytes(), 512u);
}

TEST(CaptureScope, TheInnermostScopeOfTheThreadKeeps) {
  Context& context = current_context();
  CaptureScope outer(context);
  context.memalloc(512).reset();
  {
    CaptureScope inner(context);
    context.memalloc(1024).reset();
    context.memalloc(2048).reset();
    EXPECT_EQ(inner.memory()->blocks(), 2u);
  }
  context.memalloc(4096).reset();
  EXPECT_EQ(outer.memory()->blocks(), 2u);
  EXPECT_EQ(outer.memory()->bytes(), 512u + 4096u);
}

// Reusing: a block let go serves the thread's next request that it holds
// without wasting more than half; one still held, a smaller one or a host
// block does not, nor does any after the scope.
TEST(CaptureScope, InCaptureOrderABlockLetGoServesTheThreadsLaterRequests) {
  Context& context = current_context();
  SCOPED_TRACE(manager_name());
  std::shared_ptr<GraphMemory> memory;
  std::uintptr_t first_address = 0, held_address = 0;
  {
    CaptureScope capture(context, CaptureScope::Reuse::in_capture_order);
    memory = capture.memory();
    auto first = context.memalloc(64 << 10);
    first_address = first->device_pointer();
    first.reset();
    auto again = context.memalloc(40 << 10);  // within twice: a view of the first
    EXPECT_EQ(again->device_pointer(), first_address);
    EXPECT_EQ(again->size(), std::size_t{40} << 10);
    auto beside = context.memalloc(40 << 10);  // the first is taken
    EXPECT_NE(beside->device_pointer(), first_address);
    held_address = beside->device_pointer();
    again.reset();
    auto small = context.memalloc(16 << 10);  // would waste more than half of it
    EXPECT_NE(small->device_pointer(), first_address);
    auto pinned = context.memhostalloc(64 << 10);  // (host blocks are not reused)
    pinned.reset();
    auto other_thread_block = std::async(std::launch::async, [&] {
      ScopedContext scope(context);
      return context.memalloc(64 << 10)->device_pointer();  // (not the scope's thread: a manager's block)
    }).get();
    (void)other_thread_block;
    auto third = context.memalloc(64 << 10);
    EXPECT_EQ(third->device_pointer(), first_address);
    EXPECT_EQ(memory->reuses(), 2u);
    EXPECT_EQ(memory->blocks(), 4u);  // first, beside, small, pinned
  }
  auto after = context.memalloc(64 << 10);  // the scope is closed: the manager's
  EXPECT_NE(after->device_pointer(), first_address);
  EXPECT_NE(after->device_pointer(), held_address);
  EXPECT_EQ(memory->reuses(), 2u);
}

// Several threads capturing at once, each in a scope of its own that
// reuses: each keeps only what its thread allocated, and no block serves two
// of them.
TEST(CaptureScope, ScopesOfSeveralThreadsKeepEachTheirOwn) {
  Context& context = current_context();
  SCOPED_TRACE(manager_name());
  constexpr int kThreads = 4;
  std::vector<std::shared_ptr<GraphMemory>> memories(kThreads);
  std::vector<std::vector<std::pair<std::uintptr_t, std::size_t>>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      CaptureScope capture(context, CaptureScope::Reuse::in_capture_order);
      std::vector<std::shared_ptr<MemoryPointer>> held;
      for (int i = 0; i < 300; ++i) {
        auto block = context.memalloc(std::size_t{256} << ((i * 7 + t) % 12));
        seen[t].push_back({block->device_pointer(), block->size()});
        if (i % 3 == 0) held.push_back(std::move(block));
      }
      memories[t] = capture.memory();
      EXPECT_EQ(memories[t]->reuses() + memories[t]->blocks(), 300u);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int a = 0; a < kThreads; ++a)
    for (int b = a + 1; b < kThreads; ++b)
      for (const auto& [address, size] : seen[a])
        for (const auto& [other, other_size] : seen[b])
          ASSERT_FALSE(address < other + other_size && other < address + size)
              << "threads " << a << " and " << b << " were given the same memory while both scopes kept it";
  for (int t = 0; t < kThreads; ++t) EXPECT_GT(memories[t]->reuses(), 0u);
}

// A second capture that shares the first's memory takes the blocks that the
// first let go (the graphs launched one after the other), not those still held.
TEST(CaptureScope, ASecondCaptureReusesTheBlocksOfTheMemoryItShares) {
  Context& context = current_context();
  std::shared_ptr<GraphMemory> memory;
  std::uintptr_t scratch = 0, output = 0;
  std::shared_ptr<MemoryPointer> kept_output;
  {
    CaptureScope first(context, CaptureScope::Reuse::in_capture_order);
    kept_output = context.memalloc(1 << 20);
    output = kept_output->device_pointer();
    scratch = context.memalloc(1 << 20)->device_pointer();  // (let go at once)
    memory = first.memory();
  }
  {
    CaptureScope second(context, CaptureScope::Reuse::in_capture_order, memory);
    auto block = context.memalloc(1 << 20);
    EXPECT_EQ(block->device_pointer(), scratch);
    EXPECT_NE(context.memalloc(1 << 20)->device_pointer(), output);
    EXPECT_EQ(second.memory(), memory);
  }
  EXPECT_EQ(memory->blocks(), 3u);  // the output, the scratch block, the second capture's new one
  EXPECT_EQ(memory->reuses(), 1u);
  // Only the same context's memory may be shared.
  if (Device::count() > 1) {
    Context& other = Device::get(1).primary_context();
    EXPECT_TRUE(cuemm::testing::throws<InvalidArgument>(
        [&] { CaptureScope wrong(other, CaptureScope::Reuse::in_capture_order, memory); }, "another context"));
  }
}

// Runs `test` on a new pool, without and then with the record of frees
// (PoolOptions::check_frees), which takes the raw interface's other path.
template <typename Test>
void with_and_without_the_record_of_frees(Context& context, Test&& test) {
  for (const bool check_frees : {false, true}) {
    SCOPED_TRACE(check_frees ? "with the record of frees" : "without the record");
    PoolOptions options;
    options.check_frees = check_frees;
    PoolMemoryManager pool(&context, options);
    pool.initialize();
    test(pool);
  }
}

// The pool's raw interface (allocate and deallocate, with a stream and
// without) has no pointer objects: its blocks from a capturing thread are
// kept all the same, a raw free only lets go of them, and they come back to
// the pool once the memory goes; with the record of frees too.
TEST(CaptureScope, ThePoolsRawBlocksAreKeptToo) {
  Context& context = current_context();
  ScopedContext scope(context);
  const Stream stream = context.create_stream(/*non_blocking=*/true);
  with_and_without_the_record_of_frees(context, [&](PoolMemoryManager& pool) {
    std::vector<Freed> freed;
    std::shared_ptr<GraphMemory> memory;
    {
      CaptureScope capture(context);
      for (int i = 0; i < 12; ++i) {  // (each larger than those let go before: none is reused)
        const std::size_t size = std::size_t{256} << i;
        const bool on_stream = i % 2;
        const cuda::CUdeviceptr block = on_stream ? pool.allocate(size, stream.handle()) : pool.allocate(size);
        const auto pattern = static_cast<unsigned char>(0x60 + i);
        CUEMM_CU(cuMemsetD8, block, pattern, size);
        on_stream ? pool.deallocate(block, size, stream.handle()) : pool.deallocate(block, size);
        freed.push_back({block, size, pattern});
      }
      std::thread other([&] {  // (not the scope's thread: not kept)
        ScopedContext other_scope(context);
        pool.deallocate(pool.allocate(4096), 4096);
      });
      other.join();
      memory = capture.memory();
      EXPECT_EQ(memory->blocks(), 12u);
      EXPECT_EQ(memory->blocks_freed_by_the_program(), 12u);
      EXPECT_EQ(memory->reuses(), 0u);
    }
    auto churn_raw = [&] {
      std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> taken;
      for (int round = 0; round < 16; ++round)
        for (const Freed& block : freed) {
          const cuda::CUdeviceptr other = pool.allocate(block.size);
          CUEMM_CU(cuMemsetD8, other, 0xEE, block.size);
          taken.push_back({other, block.size});
        }
      for (const auto& [other, size] : taken) pool.deallocate(other, size);
      return taken;
    };
    for (const auto& [other, size] : churn_raw())
      for (const Freed& block : freed)
        ASSERT_FALSE(other < block.address + block.size && block.address < other + size)
            << "a raw block freed during the capture served another while its GraphMemory was held";
    for (const Freed& block : freed) {
      std::vector<std::uint8_t> bytes(block.size);
      CUEMM_CU(cuMemcpyDtoH, bytes.data(), block.address, block.size);
      EXPECT_EQ(std::count(bytes.begin(), bytes.end(), block.pattern), static_cast<std::ptrdiff_t>(block.size));
    }
    memory.reset();  // the pool has them back
    pool.trim();     // (sealed: no wait for the GPU stands between them and the next requests)
    std::size_t reused = 0;
    for (const auto& [other, size] : churn_raw())
      for (const Freed& block : freed) reused += other == block.address;
    EXPECT_GT(reused, 0u) << "the blocks never came back to the pool";
    EXPECT_EQ(pool.statistics().rejected_frees, 0u);
  });
}

// A stream-ordered raw free during the capture lets the thread's later
// requests on the same stream take the block again, as stream order makes
// safe (the graph's work on that stream runs in capture order); requests on
// another stream, stream-less ones, other threads' and those that would
// waste more than half of it do not, nor does a block let go without a stream.
TEST(CaptureScope, ThePoolsRawBlocksLetGoOnAStreamServeItsLaterRequests) {
  constexpr std::size_t kKiB = 1024;
  Context& context = current_context();
  ScopedContext scope(context);
  const Stream first = context.create_stream(/*non_blocking=*/true);
  const Stream second = context.create_stream(/*non_blocking=*/true);
  with_and_without_the_record_of_frees(context, [&](PoolMemoryManager& pool) {
    std::shared_ptr<GraphMemory> memory;
    cuda::CUdeviceptr a = 0;
    {
      CaptureScope capture(context);
      a = pool.allocate(1024 * kKiB, first.handle());
      pool.deallocate(a, 1024 * kKiB, first.handle());
      const cuda::CUdeviceptr on_second = pool.allocate(1024 * kKiB, second.handle());
      EXPECT_NE(on_second, a) << "a block let go on one stream served another stream";
      const cuda::CUdeviceptr stream_less = pool.allocate(1024 * kKiB);
      EXPECT_NE(stream_less, a) << "a block let go on a stream served a stream-less request";
      const cuda::CUdeviceptr too_small = pool.allocate(256 * kKiB, first.handle());
      EXPECT_NE(too_small, a) << "a request of a quarter of the block took it";
      cuda::CUdeviceptr from_another_thread = 0;
      std::thread([&] {
        ScopedContext other_scope(context);
        from_another_thread = pool.allocate(1024 * kKiB, first.handle());
      }).join();
      EXPECT_NE(from_another_thread, a) << "another thread's request took the capture's block";
      const cuda::CUdeviceptr again = pool.allocate(768 * kKiB, first.handle());
      EXPECT_EQ(again, a) << "the block let go on the stream did not serve its next request there";
      EXPECT_NE(pool.allocate(768 * kKiB, first.handle()), a) << "a block the program holds served again";
      pool.deallocate(again, 768 * kKiB, first.handle());
      EXPECT_EQ(pool.allocate(1024 * kKiB, first.handle()), a) << "a block reused once was not reused again";
      // Let go without a stream: kept, not reused.
      const cuda::CUdeviceptr b = pool.allocate(2048 * kKiB, first.handle());
      pool.deallocate(b, 2048 * kKiB);
      EXPECT_NE(pool.allocate(2048 * kKiB, first.handle()), b) << "a block let go without a stream was reused";
      pool.deallocate(from_another_thread, 1024 * kKiB, first.handle());
      memory = capture.memory();
      EXPECT_EQ(memory->reuses(), 2u);
      // a, on_second, stream_less, too_small, the other block of 768 KiB, b and the last 2 MiB.
      EXPECT_EQ(memory->blocks(), 7u);
    }
    // (The blocks the program still holds go back with the pool.)
    EXPECT_EQ(pool.statistics().rejected_frees, 0u);
  });
}

// MemoryPointer::free() releases at once whatever keeps the pointer: the
// scope counts such frees and says so when it closes.
TEST(CaptureScope, AnExplicitFreeDuringTheScopeIsReported) {
  Context& context = current_context();
  ::testing::internal::CaptureStderr();
  std::shared_ptr<GraphMemory> memory;
  {
    CaptureScope capture(context);
    memory = capture.memory();
    context.memalloc(1 << 12)->free();
    context.memalloc(1 << 12).reset();
    EXPECT_EQ(memory->blocks_freed_explicitly(), 1u);
    EXPECT_EQ(memory->blocks_freed_by_the_program(), 1u);
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("1 block(s) allocated during a graph capture were freed with free()"), std::string::npos)
      << said;
}

// Graphs captured and launched (on the GPU, and on the simulated driver,
// which captures one stream's work): a driver that captures graphs, the test
// kernels and a non-blocking stream to capture on.
class CapturedGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& api = driver::Driver::get().api();
    if (!api.cuStreamBeginCapture || !api.cuGraphInstantiate)
      GTEST_SKIP() << "needs a driver that captures graphs (CUDA 11.4)";
    module = context.load_module(cuemm::testing::test_kernels_ptx());
    stream = context.create_stream(/*non_blocking=*/true);
  }
  // The words of the i-th scratch block that a test's capture fills.
  static std::size_t words_of(int i) { return std::size_t{1} << (8 + i % 10); }  // 1 KiB to 512 KiB
  // Launches `graph` three times on the stream, waits, and destroys it.
  void launch_three_times(cuda::CUgraph graph) {
    cuda::CUgraphExec executable = nullptr;
    CUEMM_CU(cuGraphInstantiate, &executable, graph, 0);
    for (int launch = 0; launch < 3; ++launch) CUEMM_CU(cuGraphLaunch, executable, stream->handle());
    stream->synchronize();
    CUEMM_CU(cuGraphExecDestroy, executable);
    CUEMM_CU(cuGraphDestroy, graph);
  }
  // Each scratch block holds `first + i` in every word, as its fill left it.
  static void expect_filled(const std::vector<Freed>& scratch, std::uint32_t first) {
    for (std::size_t i = 0; i < scratch.size(); ++i) {
      std::vector<std::uint32_t> words(words_of(static_cast<int>(i)));
      CUEMM_CU(cuMemcpyDtoH, words.data(), scratch[i].address, words.size() * 4);
      EXPECT_EQ(std::count(words.begin(), words.end(), first + i), static_cast<std::ptrdiff_t>(words.size()))
          << "scratch block " << i;
    }
  }

  // Requests of the scratch blocks' sizes while the graph lives: none gets one.
  void expect_kept(const std::vector<Freed>& scratch) {
    const auto taken = churn(context, scratch);
    for (const Freed& block : scratch)
      for (const auto& other : taken)
        ASSERT_FALSE(overlap(*other, block.address, block.size))
            << "a scratch block (" << block.size << " bytes) served another request while its Graph lived";
  }
  // Launches `graph` on the stream `launches` times, each onto zeroed
  // outputs, after which output i holds `first + i` in every word.
  void expect_launches_fill(const Graph& graph, const std::vector<std::shared_ptr<MemoryPointer>>& outputs,
                            std::uint32_t first, int launches) {
    for (int launch = 0; launch < launches; ++launch) {
      for (const auto& output : outputs) output->memset(0, std::nullopt, &*stream);  // (ordered before the launch)
      graph.launch(*stream);
      stream->synchronize();
      for (std::size_t i = 0; i < outputs.size(); ++i) {
        std::vector<std::uint32_t> words(outputs[i]->size() / 4);
        CUEMM_CU(cuMemcpyDtoH, words.data(), outputs[i]->device_pointer(), words.size() * 4);
        ASSERT_EQ(std::count(words.begin(), words.end(), first + i), static_cast<std::ptrdiff_t>(words.size()))
            << "launch " << launch << ", output " << i;
      }
    }
  }

  Context& context = current_context();
  ScopedContext scope{context};
  std::optional<Module> module;
  std::optional<Stream> stream;
};

// A graph captured in the global mode whose work fills scratch
// blocks that the capturing thread let go of at once. While its GraphMemory
// is held, later requests of the same sizes get other blocks, and the graph's
// launch leaves their bytes alone while it fills its own.
TEST_F(CapturedGraph, AGraphsScratchBlocksOutliveTheCaptureUntilItsMemoryGoes) {
  SCOPED_TRACE(manager_name());
  constexpr int kScratch = 16;
  std::vector<Freed> scratch;
  std::shared_ptr<GraphMemory> memory;
  cuda::CUgraph graph = nullptr;
  {
    CaptureScope capture(context);
    CUEMM_CU(cuStreamBeginCapture, stream->handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
    for (int i = 0; i < kScratch; ++i) {
      auto block = context.memalloc(words_of(i) * 4);
      module->function("cuemm_fill_u32")
          .launch({64}, {256}, *stream, block->device_pointer(), 0xA0u + i, static_cast<std::uint64_t>(words_of(i)));
      scratch.push_back({block->handle(), block->size(), 0});
    }  // (each let go at once, as a temporary)
    ASSERT_EQ(CUEMM_CU_RESULT(cuStreamEndCapture, stream->handle(), &graph), cuda::CUDA_SUCCESS)
        << "the manager ended an announced capture";
    memory = capture.memory();
  }
  EXPECT_EQ(memory->blocks_freed_by_the_program(), std::size_t{kScratch});
  const auto taken = churn(context, scratch);  // 0xEE in every byte
  for (const Freed& block : scratch)
    for (const auto& other : taken) ASSERT_FALSE(overlap(*other, block.address, block.size));
  launch_three_times(graph);
  for (const auto& other : taken) {
    const auto bytes = read_back(other);
    ASSERT_EQ(std::count(bytes.begin(), bytes.end(), 0xEE), static_cast<std::ptrdiff_t>(bytes.size()))
        << "the graph wrote into a block handed out after its capture";
  }
  expect_filled(scratch, 0xA0u);
  memory.reset();  // after the graph: its blocks go back, behind its last launch
  churn(context, scratch);
}

// Reusing: each step of the capture fills a scratch block and
// copies it into an output block, then lets the scratch go, all on one
// stream; the steps' scratch blocks are few, and every output reads its
// step's value after the launches.
TEST_F(CapturedGraph, AGraphThatReusesItsScratchBlocksInCaptureOrderComputesEveryStep) {
  SCOPED_TRACE(manager_name());
  constexpr int kSteps = 32;
  constexpr std::size_t kWords = std::size_t{1} << 16;
  std::vector<std::shared_ptr<MemoryPointer>> outputs;
  std::shared_ptr<GraphMemory> memory;
  cuda::CUgraph graph = nullptr;
  {
    CaptureScope capture(context, CaptureScope::Reuse::in_capture_order);
    CUEMM_CU(cuStreamBeginCapture, stream->handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
    for (int step = 0; step < kSteps; ++step) {
      auto scratch = context.memalloc(kWords * 4 - 1024 * (step % 4));
      module->function("cuemm_fill_u32")
          .launch({64}, {256}, *stream, scratch->device_pointer(), 0xB00u + step, static_cast<std::uint64_t>(kWords / 4));
      outputs.push_back(context.memalloc(kWords));  // (too small to take a scratch block)
      CUEMM_CU(cuMemcpyDtoDAsync, outputs.back()->device_pointer(), scratch->device_pointer(), kWords,
               stream->handle());
    }
    ASSERT_EQ(CUEMM_CU_RESULT(cuStreamEndCapture, stream->handle(), &graph), cuda::CUDA_SUCCESS);
    memory = capture.memory();
  }
  EXPECT_EQ(memory->reuses(), std::size_t{kSteps - 1}) << "each step's scratch block serves the next";
  EXPECT_EQ(memory->blocks(), std::size_t{kSteps + 1});  // the outputs and one scratch block
  for (const auto& output : outputs) output->memset(0, std::nullopt, &*stream);  // (ordered before the launches)
  launch_three_times(graph);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::uint32_t> words(kWords / 4);
    CUEMM_CU(cuMemcpyDtoH, words.data(), outputs[step]->device_pointer(), kWords);
    EXPECT_EQ(std::count(words.begin(), words.end(), 0xB00u + step), static_cast<std::ptrdiff_t>(words.size()))
        << "step " << step;
  }
}

// The pool's raw interface as RMM's and PyTorch's users call it:
// blocks allocated and freed on the capturing stream around the kernels that
// fill them. After the capture, the pool's raw requests of the same sizes get
// other blocks, and the launches leave those alone.
TEST_F(CapturedGraph, AGraphsRawStreamOrderedBlocksOutliveTheCapture) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  constexpr int kScratch = 10;  // (sizes that grow: none takes a block let go before)
  std::vector<Freed> scratch;
  std::shared_ptr<GraphMemory> memory;
  cuda::CUgraph graph = nullptr;
  {
    CaptureScope capture(context);
    CUEMM_CU(cuStreamBeginCapture, stream->handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
    for (int i = 0; i < kScratch; ++i) {
      const std::size_t bytes = words_of(i) * 4;
      const cuda::CUdeviceptr block = pool.allocate(bytes, stream->handle());
      module->function("cuemm_fill_u32")
          .launch({64}, {256}, *stream, block, 0xC0u + i, static_cast<std::uint64_t>(words_of(i)));
      pool.deallocate(block, bytes, stream->handle());
      scratch.push_back({block, bytes, 0});
    }
    ASSERT_EQ(CUEMM_CU_RESULT(cuStreamEndCapture, stream->handle(), &graph), cuda::CUDA_SUCCESS)
        << "the pool ended an announced capture";
    memory = capture.memory();
  }
  EXPECT_EQ(memory->blocks_freed_by_the_program(), std::size_t{kScratch});
  std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> taken;
  for (int round = 0; round < 8; ++round)
    for (const Freed& block : scratch) {
      const cuda::CUdeviceptr other = pool.allocate(block.size, stream->handle());
      CUEMM_CU(cuMemsetD8, other, 0xEE, block.size);
      taken.push_back({other, block.size});
      for (const Freed& kept : scratch)
        ASSERT_FALSE(other < kept.address + kept.size && kept.address < other + block.size);
    }
  launch_three_times(graph);
  for (const auto& [other, size] : taken) {
    std::vector<std::uint8_t> bytes(size);
    CUEMM_CU(cuMemcpyDtoH, bytes.data(), other, size);
    ASSERT_EQ(std::count(bytes.begin(), bytes.end(), 0xEE), static_cast<std::ptrdiff_t>(size))
        << "the graph wrote into a raw block handed out after its capture";
    pool.deallocate(other, size, stream->handle());
  }
  expect_filled(scratch, 0xC0u);
}

// Raw and reusing: each step allocates a scratch block on the
// capturing stream, fills it, copies it into an output block and frees it on
// that stream; the next step's scratch block is the same one, and every
// output reads its step's value after the launches.
TEST_F(CapturedGraph, AGraphThatReusesItsRawBlocksOnItsStreamComputesEveryStep) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  constexpr int kSteps = 32;
  constexpr std::size_t kWords = std::size_t{1} << 16;
  const Function fill = module->function("cuemm_fill_u32");
  std::vector<cuda::CUdeviceptr> outputs, scratch_blocks;
  std::shared_ptr<GraphMemory> memory;
  cuda::CUgraph graph = nullptr;
  {
    CaptureScope capture(context);
    CUEMM_CU(cuStreamBeginCapture, stream->handle(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL);
    for (int step = 0; step < kSteps; ++step) {
      const std::size_t bytes = kWords * 4 - 1024 * (step % 4);
      const cuda::CUdeviceptr scratch = pool.allocate(bytes, stream->handle());
      fill.launch({64}, {256}, *stream, scratch, 0xD00u + step, static_cast<std::uint64_t>(kWords / 4));
      outputs.push_back(pool.allocate(kWords, stream->handle()));  // (too small to take the scratch block)
      CUEMM_CU(cuMemcpyDtoDAsync, outputs.back(), scratch, kWords, stream->handle());
      pool.deallocate(scratch, bytes, stream->handle());
      scratch_blocks.push_back(scratch);
    }
    ASSERT_EQ(CUEMM_CU_RESULT(cuStreamEndCapture, stream->handle(), &graph), cuda::CUDA_SUCCESS)
        << "the pool ended an announced capture";
    memory = capture.memory();
  }
  EXPECT_EQ(memory->reuses(), std::size_t{kSteps - 1}) << "each step's scratch block serves the next";
  EXPECT_EQ(std::count(scratch_blocks.begin(), scratch_blocks.end(), scratch_blocks.front()),
            std::ptrdiff_t{kSteps});
  EXPECT_EQ(memory->blocks(), std::size_t{kSteps + 1});  // the outputs and one scratch block
  for (const cuda::CUdeviceptr output : outputs) CUEMM_CU(cuMemsetD8Async, output, 0, kWords, stream->handle());
  launch_three_times(graph);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::uint32_t> words(kWords / 4);
    CUEMM_CU(cuMemcpyDtoH, words.data(), outputs[step], kWords);
    EXPECT_EQ(std::count(words.begin(), words.end(), 0xD00u + step), static_cast<std::ptrdiff_t>(words.size()))
        << "step " << step;
    pool.deallocate(outputs[step], kWords, stream->handle());
  }
}


// --- capture_graph: the capture, its scope and its memory in one call ---

// The status of the capture on `stream` (CU_STREAM_CAPTURE_STATUS_*).
int capture_status(const Stream& stream) {
  int status = -1;
  CUEMM_CU(cuStreamIsCapturing, stream.handle(), &status);
  return status;
}

// Scratch blocks that the recording lets go of at once stay the Graph's: its
// launches compute every output, later requests land elsewhere while it
// lives, and its memory goes with it.
TEST_F(CapturedGraph, ACapturedGraphHoldsItsScratchBlocksAndComputesOnEveryLaunch) {
  SCOPED_TRACE(manager_name());
  constexpr int kSteps = 12;
  const Function fill = module->function("cuemm_fill_u32");
  const Function add = module->function("cuemm_add_u32");
  std::vector<std::shared_ptr<MemoryPointer>> outputs;
  for (int i = 0; i < kSteps; ++i) outputs.push_back(context.memalloc(words_of(i) * 4));
  std::vector<Freed> scratch;
  Graph graph = capture_graph(*stream, [&](const Stream& recording) {
    EXPECT_TRUE(context.capturing());
    for (int i = 0; i < kSteps; ++i) {
      auto block = context.memalloc(words_of(i) * 4);
      const auto words = static_cast<std::uint64_t>(words_of(i));
      fill.launch({64}, {256}, recording, block->device_pointer(), 0xB00u + i, words);
      add.launch({64}, {256}, recording, block->device_pointer(), 1u, words);
      CUEMM_CU(cuMemcpyDtoDAsync, outputs[i]->device_pointer(), block->device_pointer(), words * 4, recording.handle());
      scratch.push_back({block->handle(), block->size(), 0});
    }  // (each let go at once)
  });
  EXPECT_FALSE(context.capturing());
  EXPECT_EQ(capture_status(*stream), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_TRUE(graph.memory());
  EXPECT_EQ(graph.memory()->blocks(), std::size_t{kSteps});
  EXPECT_EQ(graph.memory()->blocks_freed_by_the_program(), std::size_t{kSteps});
  expect_kept(scratch);
  expect_launches_fill(graph, outputs, 0xB01u, 3);
  // Moved, the graph still runs; its memory goes with its last holder.
  std::weak_ptr<GraphMemory> memory = graph.memory();
  {
    Graph moved = std::move(graph);
    EXPECT_THROW(graph.launch(*stream), StateError);  // NOLINT(bugprone-use-after-move): the case under test
    moved.launch(*stream);
    stream->synchronize();
  }
  EXPECT_TRUE(memory.expired()) << "the Graph's memory outlived it";
  context.memory_manager().get_memory_info();  // (still consistent)
}

// CaptureOptions: a recording that reuses its scratch blocks in capture
// order, and a second graph that shares the first one's memory.
TEST_F(CapturedGraph, GraphsLaunchedInTurnMayReuseAndShareTheirMemory) {
  SCOPED_TRACE(manager_name());
  constexpr int kSteps = 16;
  constexpr std::size_t kWords = std::size_t{1} << 14;
  const Function fill = module->function("cuemm_fill_u32");
  std::vector<std::shared_ptr<MemoryPointer>> outputs;
  for (int i = 0; i < 2 * kSteps; ++i) outputs.push_back(context.memalloc(kWords * 4));
  auto steps = [&](int first) {
    return [&, first](const Stream& recording) {
      for (int i = first; i < first + kSteps; ++i) {
        auto scratch = context.memalloc(kWords * 4 - 256 * (i % 3));
        fill.launch({64}, {256}, recording, scratch->device_pointer(), 0xC00u + i,
                    static_cast<std::uint64_t>(kWords / 2));
        CUEMM_CU(cuMemcpyDtoDAsync, outputs[i]->device_pointer(), scratch->device_pointer(), kWords * 2,
                 recording.handle());
      }
    };
  };
  CaptureOptions options;
  options.reuse = CaptureScope::Reuse::in_capture_order;
  const Graph first = capture_graph(*stream, steps(0), options);
  EXPECT_EQ(first.memory()->reuses(), std::size_t{kSteps - 1}) << "each step's scratch block serves the next";
  options.shared_memory = first.memory();
  const Graph second = capture_graph(*stream, steps(kSteps), options);
  EXPECT_EQ(second.memory(), first.memory());
  EXPECT_EQ(first.memory()->reuses(), std::size_t{2 * kSteps - 1}) << "the second graph reused the first one's block";
  EXPECT_EQ(first.memory()->blocks(), 1u);
  for (int launch = 0; launch < 2; ++launch) {
    for (const auto& output : outputs) output->memset(0, std::nullopt, &*stream);
    first.launch(*stream);
    second.launch(*stream);
    stream->synchronize();
    for (int i = 0; i < 2 * kSteps; ++i) {
      std::vector<std::uint32_t> words(kWords / 2);
      CUEMM_CU(cuMemcpyDtoH, words.data(), outputs[i]->device_pointer(), kWords * 2);
      ASSERT_EQ(std::count(words.begin(), words.end(), 0xC00u + i), static_cast<std::ptrdiff_t>(words.size()))
          << "launch " << launch << ", step " << i;
    }
  }
}

// An exception from the recording ends the capture before it propagates:
// the stream takes work again, the scope is closed, and nothing leaks.
TEST_F(CapturedGraph, AnExceptionWhileRecordingEndsTheCaptureAndPropagates) {
  SCOPED_TRACE(manager_name());
  const Function fill = module->function("cuemm_fill_u32");
  auto block = context.memalloc(4096);
  std::weak_ptr<MemoryPointer> scratch;
  try {
    capture_graph(*stream, [&](const Stream& recording) {
      auto temporary = context.memalloc(8192);
      scratch = temporary;
      fill.launch({4}, {256}, recording, temporary->device_pointer(), 7u, std::uint64_t{2048});
      throw std::runtime_error("the recording failed");
    });
    FAIL() << "capture_graph swallowed the recording's exception";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "the recording failed");
  }
  EXPECT_FALSE(context.capturing());
  EXPECT_EQ(capture_status(*stream), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_TRUE(scratch.expired()) << "the failed capture's block was kept";
  fill.launch({4}, {256}, *stream, block->device_pointer(), 0x5A5Au, std::uint64_t{1024});
  stream->synchronize();
  std::vector<std::uint32_t> words(1024);
  CUEMM_CU(cuMemcpyDtoH, words.data(), block->device_pointer(), 4096);
  EXPECT_EQ(std::count(words.begin(), words.end(), 0x5A5Au), 1024);
}

// A call that the capture forbids ends it; capture_graph says so rather
// than hand back a graph, and leaves the stream usable.
TEST_F(CapturedGraph, ACaptureThatAForbiddenCallEndedIsAClearError) {
  SCOPED_TRACE(manager_name());
  try {
    capture_graph(*stream, [&](const Stream&) {
      EXPECT_NE(CUEMM_CU_RESULT(cuCtxSynchronize), cuda::CUDA_SUCCESS) << "the driver let a capture synchronise";
    });
    FAIL() << "capture_graph returned a graph from an ended capture";
  } catch (const CudaError& error) {
    EXPECT_EQ(error.code(), cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    EXPECT_NE(std::string(error.what()).find("forbids"), std::string::npos) << error.what();
    // (capture_graph's own scope was open: nothing may blame a missing one.)
    EXPECT_EQ(std::string(error.what()).find("CaptureScope"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(context.capturing());
  EXPECT_EQ(capture_status(*stream), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  stream->synchronize();
}

// The driver does not capture the legacy default stream: an error that says
// so, before anything begins. The per-thread default stream captures.
TEST_F(CapturedGraph, TheLegacyStreamIsRefusedAndThePerThreadStreamCaptures) {
  SCOPED_TRACE(manager_name());
  for (const Stream& legacy : {Stream(), Stream::legacy_default()}) {
    try {
      capture_graph(legacy, [](const Stream&) { ADD_FAILURE() << "recorded on the legacy stream"; });
      FAIL() << "the legacy stream was captured";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("legacy default stream"), std::string::npos) << error.what();
    }
    EXPECT_FALSE(context.capturing());
  }
  const Stream per_thread = Stream::per_thread_default();
  auto output = context.memalloc(4096);
  const Function fill = module->function("cuemm_fill_u32");
  const Graph graph = capture_graph(per_thread, [&](const Stream& recording) {
    fill.launch({4}, {256}, recording, output->device_pointer(), 0x77u, std::uint64_t{1024});
  });
  output->memset(0);
  graph.launch(per_thread);
  per_thread.synchronize();
  std::vector<std::uint32_t> words(1024);
  CUEMM_CU(cuMemcpyDtoH, words.data(), output->device_pointer(), 4096);
  EXPECT_EQ(std::count(words.begin(), words.end(), 0x77u), 1024);
}

// A graph captured on two streams (the second forked through an event and
// joined back): a raw block let go on one stream serves that stream's later
// request, never the other stream's, whose work may run beside it.
TEST_F(CapturedGraph, AGraphOfTwoStreamsReusesRawBlocksOnlyOnTheStreamThatLetThemGo) {
  PoolMemoryManager pool(&context);
  pool.initialize();
  const Stream side = context.create_stream(/*non_blocking=*/true);
  const Event fork = context.create_event(/*timing=*/false);
  const Event join = context.create_event(/*timing=*/false);
  constexpr std::size_t kWords = std::size_t{1} << 16;
  constexpr std::size_t kBytes = kWords * 4;
  const Function fill = module->function("cuemm_fill_u32");
  std::vector<cuda::CUdeviceptr> outputs;
  for (int i = 0; i < 3; ++i) outputs.push_back(pool.allocate(kBytes, stream->handle()));
  cuda::CUdeviceptr on_origin = 0, on_side = 0, again_on_origin = 0;
  // Fills a raw block on `on`, copies it into the output `i` and lets the block go there.
  auto step = [&](const Stream& on, int i) {
    const cuda::CUdeviceptr scratch = pool.allocate(kBytes, on.handle());
    fill.launch({64}, {256}, on, scratch, 0xE00u + i, static_cast<std::uint64_t>(kWords));
    CUEMM_CU(cuMemcpyDtoDAsync, outputs[i], scratch, kBytes, on.handle());
    pool.deallocate(scratch, kBytes, on.handle());
    return scratch;
  };
  const Graph graph = capture_graph(*stream, [&](const Stream& recording) {
    on_origin = step(recording, 0);
    fork.record(recording);
    side.wait_event(fork);
    on_side = step(side, 1);
    again_on_origin = step(recording, 2);
    join.record(side);
    recording.wait_event(join);
  });
  EXPECT_NE(on_side, on_origin) << "a block let go on one stream of the capture served another";
  EXPECT_EQ(again_on_origin, on_origin) << "a block let go on a stream did not serve its next request";
  EXPECT_EQ(graph.memory()->reuses(), 1u);
  for (int launch = 0; launch < 3; ++launch) {
    for (const cuda::CUdeviceptr output : outputs) CUEMM_CU(cuMemsetD8Async, output, 0, kBytes, stream->handle());
    graph.launch(*stream);
    stream->synchronize();
    for (int i = 0; i < 3; ++i) {
      std::vector<std::uint32_t> words(kWords);
      CUEMM_CU(cuMemcpyDtoH, words.data(), outputs[i], kBytes);
      ASSERT_EQ(std::count(words.begin(), words.end(), 0xE00u + i), static_cast<std::ptrdiff_t>(kWords))
          << "launch " << launch << ", output " << i;
    }
  }
  for (const cuda::CUdeviceptr output : outputs) pool.deallocate(output, kBytes, stream->handle());
}

// A capture that a second thread records into, on a stream forked from it:
// with a Member of the recording's scope, that thread's scratch blocks are
// the graph's too, and later requests do not get them while it lives.
TEST_F(CapturedGraph, AThreadThatRecordsIntoTheCaptureAsAMemberHasItsScratchKept) {
  SCOPED_TRACE(manager_name());
  const Stream side = context.create_stream(/*non_blocking=*/true);
  const Event fork = context.create_event(/*timing=*/false);
  const Event join = context.create_event(/*timing=*/false);
  constexpr int kSteps = 6;
  const Function fill = module->function("cuemm_fill_u32");
  std::vector<std::shared_ptr<MemoryPointer>> outputs;
  for (int i = 0; i < kSteps; ++i) outputs.push_back(context.memalloc(words_of(i) * 4));
  std::vector<Freed> scratch;
  const Graph graph = capture_graph(*stream, [&](const Stream& recording) {
    fork.record(recording);
    side.wait_event(fork);
    CaptureScope* scope = CaptureScope::of_this_thread(context);
    ASSERT_NE(scope, nullptr);
    std::thread worker([&] {
      const CaptureScope::Member member(*scope);
      ScopedContext current(context);
      for (int i = 0; i < kSteps; ++i) {
        auto block = context.memalloc(words_of(i) * 4);
        const auto words = static_cast<std::uint64_t>(words_of(i));
        fill.launch({64}, {256}, side, block->device_pointer(), 0xF00u + i, words);
        CUEMM_CU(cuMemcpyDtoDAsync, outputs[i]->device_pointer(), block->device_pointer(), words * 4, side.handle());
        scratch.push_back({block->handle(), block->size(), 0});
      }
    });
    worker.join();
    join.record(side);
    recording.wait_event(join);
  });
  EXPECT_EQ(graph.memory()->blocks(), std::size_t{kSteps}) << "the worker's scratch blocks";
  expect_kept(scratch);
  expect_launches_fill(graph, outputs, 0xF00u, 2);
}

// Bad input: no recording, another context's memory to share, a launch on
// another device's stream. Each is an error that names what was wrong, and
// none leaves a capture under way.
TEST_F(CapturedGraph, BadInputIsAClearErrorAndLeavesNoCaptureBehind) {
  try {
    capture_graph(*stream, nullptr);
    FAIL() << "a capture without a recording";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("no recording"), std::string::npos) << error.what();
  }
  EXPECT_EQ(capture_status(*stream), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  if (Device::count() < 2) GTEST_SKIP() << "the other cases need two devices";
  Context& other = Device::get(1).primary_context();
  other.prepare_for_use();
  CaptureOptions options;
  {
    CaptureScope elsewhere(other);
    options.shared_memory = elsewhere.memory();
  }
  try {
    capture_graph(*stream, [](const Stream&) { ADD_FAILURE() << "recorded"; }, options);
    FAIL() << "a capture shared another context's memory";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("another context (device 1)"), std::string::npos) << error.what();
  }
  EXPECT_EQ(capture_status(*stream), cuda::CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_FALSE(context.capturing());
  const Graph graph = capture_graph(*stream, [&](const Stream& recording) {
    context.memalloc(4096)->memset(1, std::nullopt, &recording);
  });
  std::optional<Stream> other_stream;
  {
    ScopedContext on_other(other);
    other_stream = other.create_stream();
  }
  try {
    graph.launch(*other_stream);
    FAIL() << "a graph launched on another device's stream";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("the stream is of device 1's context, the graph of device 0's"),
              std::string::npos)
        << error.what();
  }
  graph.launch(*stream);
  stream->synchronize();
}

// A Graph dropped while its launch on a non-blocking stream still waits to
// run: its scratch blocks go back to their manager, and a block allocated
// then and written on the legacy stream is written only after the launch
// (the Graph ordered the legacy stream after it: its queue ends once the
// launch has), so the launch's late fill never lands in it, under every
// manager.
TEST_F(CapturedGraph, AGraphDroppedWhileItsLaunchWaitsLeavesLaterBlocksAlone) {
  SCOPED_TRACE(manager_name());
  constexpr std::size_t kBytes = std::size_t{1} << 20;
  const Function fill = module->function("cuemm_fill_u32");
  std::optional<Graph> graph = capture_graph(*stream, [&](const Stream& recording) {
    auto scratch = context.memalloc(kBytes);
    fill.launch({64}, {256}, recording, scratch->device_pointer(), 0xABCDu, static_cast<std::uint64_t>(kBytes / 4));
  });
  cuemm::testing::HeldKernel held(context, *stream);  // the launch waits behind it
  graph->launch(*stream);
  std::shared_ptr<MemoryPointer> later;
  const bool waited = held.waited_for_by([&] {
    graph.reset();  // the scratch block goes back to the manager
    later = context.memalloc(kBytes);
    later->memset(0x11);                        // on the legacy stream
    Stream::legacy_default().synchronize();     // (a memset of device memory may return before it ran)
  });
  EXPECT_TRUE(waited) << "the legacy stream was not ordered after the dropped graph's launch";
  stream->synchronize();
  const auto bytes = read_back(later);
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x11), static_cast<std::ptrdiff_t>(bytes.size()))
      << "the dropped graph's launch wrote into a block allocated after it";
}

}  // namespace
}  // namespace cuemm
