// The pinned host pool: cached reuse, kinds kept apart, stream-safe reuse,
// pinned ranges, trimming, and memory that outlives the pool.
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "support/block_storm.hpp"
#include "support/test_support.hpp"

using namespace cuemm;

namespace {
class HostPool : public ::testing::Test {
 protected:
  Context& context = current_context();
};
constexpr std::uint64_t kSpinNanoseconds = 100'000'000;
}  // namespace

TEST_F(HostPool, ReleasedBlocksAreHandedOutAgain) {
  PinnedHostPool pool(context);
  auto round = [&] {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 20; ++i) blocks.push_back(pool.allocate(4096, false, false, false));
  };
  round();
  pool.allocate(4096, false, false, false).reset();  // twenty frees: this seals their epoch
  context.synchronize();                             // and the GPU is idle, so it is safe
  const PinnedHostPoolStatistics before = pool.statistics();
  round();
  const PinnedHostPoolStatistics after = pool.statistics();
  EXPECT_GE(after.hits - before.hits, 19u);
  EXPECT_LE(after.allocated_bytes, 22u * 4096u) << "blocks were allocated anew instead of reused";
  EXPECT_EQ(after.cached_bytes, after.allocated_bytes);
}

TEST_F(HostPool, ALargeBlockIsWaitedForRatherThanAllocatedAgain) {
  PinnedHostPool pool(context);
  std::uintptr_t first = 0;
  {
    auto block = pool.allocate(4 << 20, false, false, false);
    first = block->host_pointer();
  }
  auto again = pool.allocate(4 << 20, false, false, false);
  EXPECT_EQ(again->host_pointer(), first);
  EXPECT_EQ(pool.statistics().misses, 1u);
}

// After a seal that could neither record an event nor synchronise (as while
// a graph is captured), the block it left unsafe is sealed for again at the
// next request and reused: the pool does not buy a block at every request.
TEST_F(HostPool, AfterASealThatCouldNotWaitALoopReusesItsBlockAgain) {
  CUEMM_REQUIRE_SIMULATION("fault injection and call counters");  // (refuses the driver's calls and counts them)
  PinnedHostPool pool(context);
  pool.allocate(4 << 20, false, false, false).reset();
  cuemm::testing::refuse_the_next_seals(1);
  pool.allocate(4 << 20, false, false, false).reset();  // its seal fails: a second block
  simulation::clear_faults();
  simulation::reset_call_counts();
  for (int i = 0; i < 20; ++i) pool.allocate(4 << 20, false, false, false).reset();
  EXPECT_EQ(simulation::call_count("cuMemHostAlloc"), 0u);
  EXPECT_EQ(pool.statistics().allocated_bytes, 8u << 20);
}

// A long loop of large blocks, once its seals have cost about as much as a
// new block, rotates through a few (here up to 16 of 1 MiB) and seals once a
// rotation rather than once a request.
TEST_F(HostPool, ALongLoopOfLargeBlocksRotatesThroughAFew) {
  CUEMM_REQUIRE_SIMULATION("call counters");  // (counts the driver's calls; 300k pairs)
  PinnedHostPool pool(context);
  for (int i = 0; i < 300000; ++i) pool.allocate(1 << 20, false, false, false).reset();
  EXPECT_LE(pool.statistics().allocated_bytes, 16u << 20);
  EXPECT_GT(pool.statistics().allocated_bytes, 1u << 20) << "the rotation did not grow";
  simulation::reset_call_counts();
  const std::size_t seals_before = pool.statistics().seals;
  for (int i = 0; i < 1000; ++i) pool.allocate(1 << 20, false, false, false).reset();
  EXPECT_LE(cuemm::testing::seal_calls(), 1000u / 4) << "a seal for every few requests, not each";
  EXPECT_EQ(simulation::call_count("cuMemHostAlloc"), 0u);
  // The statistics count those seals: each made one such call.
  EXPECT_EQ(pool.statistics().seals - seals_before, cuemm::testing::seal_calls());
  EXPECT_GT(pool.statistics().seals, seals_before);
}

// Small blocks rotate through 16 at once (new ones until 16 were freed), and
// beyond, up to 64, only as their seals pay for more: a 4 KiB loop then seals
// once per 64 pairs rather than once per 16.
TEST_F(HostPool, ALongLoopOfSmallBlocksGrowsItsRotationAsItsSealsPay) {
  CUEMM_REQUIRE_SIMULATION("call counters");  // (counts the driver's calls; 1.5 million pairs)
  PinnedHostPool pool(context);
  for (int i = 0; i < 2000; ++i) pool.allocate(4096, false, false, false).reset();
  EXPECT_EQ(pool.statistics().allocated_bytes, 16u * 4096u) << "not a rotation of 16 at once, or grown unpaid";
  for (int i = 0; i < 1500000; ++i) pool.allocate(4096, false, false, false).reset();
  EXPECT_EQ(pool.statistics().allocated_bytes, 64u * 4096u);
  simulation::reset_call_counts();
  for (int i = 0; i < 6400; ++i) pool.allocate(4096, false, false, false).reset();
  EXPECT_LE(cuemm::testing::seal_calls(), 6400u / 64 + 1);
  EXPECT_EQ(simulation::call_count("cuMemHostAlloc"), 0u);
}

// Large blocks may rotate through more than small ones' 32 MiB, as their
// seals buy them: 4 MiB blocks beyond 8, up to 16.
TEST_F(HostPool, ALongLoopOfLargeBlocksMayRotateBeyondTheSmallBlocksBudget) {
  CUEMM_REQUIRE_SIMULATION("seals, which complete as soon as they are made");  // (400k pairs)
  PinnedHostPool pool(context);
  for (int i = 0; i < 400000; ++i) pool.allocate(4 << 20, false, false, false).reset();
  EXPECT_GT(pool.statistics().allocated_bytes, 32u << 20) << "the rotation stopped at 8 blocks";
  EXPECT_LE(pool.statistics().allocated_bytes, 64u << 20);
}

TEST_F(HostPool, KindsAreKeptApart) {
  PinnedHostPool pool(context);
  pool.allocate(4 << 20, true, false, false).reset();
  auto pinned = pool.allocate(4 << 20, false, false, false);
  EXPECT_EQ(pinned->kind(), MemoryKind::Pinned);
  EXPECT_THROW(pinned->device_pointer(), StateError);
  auto mapped = pool.allocate(4 << 20, true, false, false);
  EXPECT_EQ(mapped->kind(), MemoryKind::Mapped);
  EXPECT_NE(mapped->device_pointer(), 0u);
  EXPECT_NE(pinned->host_pointer(), mapped->host_pointer());
  auto combined = pool.allocate(4 << 20, false, false, true);
  EXPECT_NE(combined->host_pointer(), pinned->host_pointer());
  EXPECT_NE(combined->host_pointer(), mapped->host_pointer());
}

TEST_F(HostPool, ABlockIsNotReusedWhileAQueuedCopyMayStillReadIt) {
  PinnedHostPool pool(context);
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  Stream stream = context.create_stream();
  const std::uint64_t count = 1024;
  auto scratch = context.memalloc(1 << 20);
  auto device = context.memalloc(count * 4);
  auto source = pool.allocate(count * 4, false, false, false);
  auto* words = reinterpret_cast<std::uint32_t*>(source->host_pointer());
  std::fill(words, words + count, 5u);
  const std::uintptr_t source_address = source->host_pointer();
  // The copy waits behind a long kernel; its source is released meanwhile.
  module.function("cuemm_spin_fill_u32").launch({1}, {32}, stream, scratch->device_pointer(), 1u,
                                                std::uint64_t{32}, kSpinNanoseconds);
  CUEMM_CU(cuMemcpyHtoDAsync, device->device_pointer(), words, count * 4, stream.handle());
  source.reset();
  for (int i = 0; i < 40; ++i) {  // enough frees to seal an epoch
    auto other = pool.allocate(count * 4, false, false, false);
    if (other->host_pointer() == source_address)
      std::fill(reinterpret_cast<std::uint32_t*>(other->host_pointer()),
                reinterpret_cast<std::uint32_t*>(other->host_pointer()) + count, 9u);
  }
  stream.synchronize();
  std::vector<std::uint32_t> copied(count);
  CUEMM_CU(cuMemcpyDtoH, copied.data(), device->device_pointer(), count * 4);
  EXPECT_EQ(copied, std::vector<std::uint32_t>(count, 5u)) << "the source was overwritten before the copy ran";
}

TEST_F(HostPool, TrimFreesEveryCachedBlock) {
  PinnedHostPool pool(context);
  pool.allocate(1 << 20, false, false, false).reset();
  pool.allocate(1 << 16, true, true, false).reset();
  EXPECT_GT(pool.statistics().cached_bytes, 0u);
  EXPECT_GE(pool.trim(), (1u << 20) + (1u << 16));
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
  EXPECT_EQ(pool.statistics().allocated_bytes, 0u);
}

TEST_F(HostPool, TheCacheKeepsAtMostItsMaximum) {
  PinnedHostPoolOptions options;
  options.maximum_cached_bytes = 1 << 20;
  options.idle_before_eviction = std::chrono::milliseconds(0);
  PinnedHostPool pool(context, options);
  {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate(512 << 10, false, false, false));
  }
  EXPECT_LE(pool.statistics().cached_bytes, 1u << 20);
  EXPECT_LE(pool.statistics().allocated_bytes, 1u << 20);
}

// Blocks that go round (released and taken again within
// idle_before_eviction) stay cached past the maximum, rather than be freed
// and bought again; once idle that long, the next release past the maximum
// frees them.
TEST_F(HostPool, BlocksThatGoRoundStayCachedPastTheMaximumUntilIdle) {
  constexpr std::size_t kBlock = 1 << 20;  // large: waited for rather than bought while its epoch is open
  PinnedHostPoolOptions options;
  options.maximum_cached_bytes = 2 * kBlock;
  options.idle_before_eviction = std::chrono::milliseconds(300);
  PinnedHostPool pool(context, options);
  auto take_and_release = [&](int count) {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < count; ++i) blocks.push_back(pool.allocate(kBlock, false, false, false));
  };
  take_and_release(8);  // 8 MiB, released at once
  EXPECT_EQ(pool.statistics().allocated_bytes, 8 * kBlock) << "released blocks were freed at once";
  const PinnedHostPoolStatistics before = pool.statistics();
  take_and_release(8);
  EXPECT_EQ(pool.statistics().misses, before.misses) << "blocks past the maximum were bought again";
  EXPECT_EQ(pool.statistics().allocated_bytes, 8 * kBlock);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  // The front holds its share of the maximum, so these three go to the
  // shared lists, past the maximum: the idle blocks go, these stay.
  take_and_release(3);
  EXPECT_LE(pool.statistics().allocated_bytes, options.maximum_cached_bytes + 3 * kBlock)
      << "idle blocks past the maximum were kept";
  EXPECT_EQ(pool.statistics().cached_bytes, pool.statistics().allocated_bytes);
  pool.trim();
  EXPECT_EQ(pool.statistics().allocated_bytes, 0u);
}

namespace {
// A cap of one block, whose released blocks stay recent for the whole test.
constexpr std::size_t kCapBlock = 1 << 20;
PinnedHostPoolOptions one_block_cap_never_idle() {
  PinnedHostPoolOptions options;
  options.maximum_cached_bytes = kCapBlock;
  options.idle_before_eviction = std::chrono::seconds(60);
  return options;
}
std::vector<std::shared_ptr<MemoryPointer>> take_blocks(PinnedHostPool& pool, int count) {
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < count; ++i) blocks.push_back(pool.allocate(kCapBlock, false, false, false));
  return blocks;
}
}  // namespace

// Releases past the maximum whose blocks are all recent do not ask the
// GPU whether it is busy (an event recorded and queried): only an idle
// block could go.
TEST_F(HostPool, ReleasesPastTheMaximumAskTheGpuNothingWhileNoBlockIsIdle) {
  CUEMM_REQUIRE_SIMULATION("call counters");
  PinnedHostPool pool(context, one_block_cap_never_idle());
  auto blocks = take_blocks(pool, 4);
  simulation::reset_call_counts();
  blocks.clear();
  EXPECT_EQ(simulation::call_count("cuEventQuery") + simulation::call_count("cuStreamQuery"), 0u);
  EXPECT_EQ(pool.statistics().allocated_bytes, 4 * kCapBlock);
}

// Past four times the maximum, blocks go back at once, idle or not: a burst
// of releases keeps no more than that.
TEST_F(HostPool, ABurstOfReleasesKeepsAtMostFourTimesTheMaximum) {
  PinnedHostPool pool(context, one_block_cap_never_idle());
  take_blocks(pool, 16).clear();
  EXPECT_LE(pool.statistics().allocated_bytes, 4 * kCapBlock);
  EXPECT_GE(pool.statistics().allocated_bytes, 2 * kCapBlock) << "blocks not yet idle were freed";
  EXPECT_EQ(pool.statistics().cached_bytes, pool.statistics().allocated_bytes);
}

// cuMemFreeHost would wait for a busy GPU: the cache passes its maximum by
// up to an eighth rather than evict, and evicts once the GPU is idle.
TEST_F(HostPool, TheCacheEvictsOnlyOnceTheGpuIsIdle) {
  PinnedHostPoolOptions options;
  options.maximum_cached_bytes = 1 << 20;
  options.idle_before_eviction = std::chrono::milliseconds(0);
  PinnedHostPool pool(context, options);
  Stream stream = context.create_stream();
  DeviceArray<std::uint32_t> target(32, context);
  auto take_and_release = [&] {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 9; ++i) blocks.push_back(pool.allocate(128 << 10, false, false, false));
  };
  {
    cuemm::testing::HeldKernel kernel(context, stream, target.device_pointer(), 1u, 32);
    // 1.125 MiB released while the kernel runs.
    EXPECT_FALSE(kernel.waited_for_by(take_and_release)) << "the pool waited for the kernel";
  }
  EXPECT_GT(pool.statistics().allocated_bytes, 1u << 20);
  EXPECT_LE(pool.statistics().allocated_bytes, (1u << 20) + (128u << 10));
  take_and_release();
  EXPECT_LE(pool.statistics().allocated_bytes, 1u << 20);
}

TEST_F(HostPool, PinningTheSameRangeAgainReusesTheRegistration) {
  CUEMM_REQUIRE_SIMULATION("call counters");
  PinnedHostPool pool(context);
  auto buffer = std::make_shared<std::vector<char>>(1 << 20);
  simulation::reset_call_counts();
  for (int i = 0; i < 10; ++i) {
    auto pinned = pool.pin(buffer, buffer->data(), buffer->size(), true);
    EXPECT_NE(pinned->device_pointer(), 0u);
  }
  EXPECT_EQ(simulation::call_count("cuMemHostRegister"), 1u);
  EXPECT_EQ(pool.statistics().cached_registrations, 1u);
  EXPECT_EQ(buffer.use_count(), 2) << "the cached registration keeps its owner alive";
  pool.trim();
  EXPECT_EQ(simulation::call_count("cuMemHostUnregister"), 1u);
  EXPECT_EQ(buffer.use_count(), 1);
}

// A range pinned without an owner may be unmapped once released, and a new
// mapping may land at its addresses: its registration is undone at release,
// and pinning the new mapping registers it anew (whose bytes copies read).
TEST_F(HostPool, ARangePinnedWithoutAnOwnerIsNotCachedPastItsRelease) {
  PinnedHostPool pool(context);
  const std::size_t size = std::size_t{1} << 20;
  void* first = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(first, MAP_FAILED);
  pool.pin(nullptr, first, size, false).reset();
  EXPECT_EQ(pool.statistics().cached_registrations, 0u) << "a registration without an owner was kept";
  ASSERT_EQ(munmap(first, size), 0);
  void* second = mmap(first, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(second, MAP_FAILED);
  std::memset(second, 0x5a, size);
  const std::size_t misses = pool.statistics().misses;
  auto pinned = pool.pin(nullptr, second, size, false);
  EXPECT_EQ(pool.statistics().misses, misses + 1) << "the new mapping was not registered anew";
  auto device = device_array<unsigned char>(size);
  device.copy_to_device(std::span<const unsigned char>(static_cast<unsigned char*>(second), size));
  EXPECT_EQ(device.copy_to_host(), std::vector<unsigned char>(size, 0x5a));
  pinned.reset();
  munmap(second, size);
  // With an owner, the registration is kept (and the owner with it).
  auto buffer = std::make_shared<std::vector<char>>(size);
  pool.pin(buffer, buffer->data(), size, false).reset();
  EXPECT_EQ(pool.statistics().cached_registrations, 1u);
}

TEST_F(HostPool, AnOverlappingRangeEvictsCachedRegistrations) {
  PinnedHostPool pool(context);
  auto buffer = std::make_shared<std::vector<char>>(1 << 20);
  pool.pin(buffer, buffer->data(), buffer->size(), false).reset();
  auto half = pool.pin(buffer, buffer->data(), buffer->size() / 2, false);
  EXPECT_EQ(half->host_pointer(), reinterpret_cast<std::uintptr_t>(buffer->data()));
}

TEST_F(HostPool, BlocksOutliveThePool) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");
  const auto before = simulation::live_allocations();
  std::shared_ptr<MemoryPointer> block;
  {
    PinnedHostPool pool(context);
    block = pool.allocate(8192, true, false, false);
    pool.allocate(8192, false, false, false).reset();
  }
  EXPECT_EQ(simulation::live_allocations(), before + 1) << "the cached block was not freed with the pool";
  std::memset(reinterpret_cast<void*>(block->host_pointer()), 1, 8192);
  block.reset();
  EXPECT_EQ(simulation::live_allocations(), before);
}

TEST_F(HostPool, ThreadsShareThePoolSafely) {
  PinnedHostPool pool(context);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      for (int i = 0; i < 200; ++i) {
        auto block = pool.allocate(4096 * (1 + i % 3), i % 2 == 0, false, false);
        auto* bytes = reinterpret_cast<unsigned char*>(block->host_pointer());
        std::memset(bytes, t, block->size());
        for (std::size_t k = 0; k < block->size(); k += 512)
          if (bytes[k] != t) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(HostPool, ThePoolManagerUsesIt) {
  PoolMemoryManager manager(&context);
  manager.initialize();
  ASSERT_NE(manager.pinned_host_pool(), nullptr);
  for (int i = 0; i < 3; ++i) manager.memhostalloc(4 << 20, true, false, false);  // large: waited for, reused
  EXPECT_EQ(manager.pinned_host_pool()->statistics().hits, 2u);
  PoolOptions options;
  options.pinned_host_pool = false;
  PoolMemoryManager without(&context, options);
  EXPECT_EQ(without.pinned_host_pool(), nullptr);
}

// CUEMM_PINNED_MAXIMUM_CACHED sets the pool and async managers' cap; a value
// that is no byte count is refused, naming the variable.
TEST_F(HostPool, TheManagersTakeTheCapFromTheEnvironment) {
  {
    cuemm::testing::ScopedVariable cap("CUEMM_PINNED_MAXIMUM_CACHED", "1M");
    PoolMemoryManager manager(&context);
    manager.initialize();
    {
      std::vector<std::shared_ptr<MemoryPointer>> blocks;
      for (int i = 0; i < 8; ++i) blocks.push_back(manager.memhostalloc(1 << 20, false, false, false));
    }
    // Released at once, not idle: up to four times the cap stays.
    EXPECT_LE(manager.pinned_host_pool()->statistics().allocated_bytes, 4u << 20);
  }
  {
    PoolMemoryManager manager(&context);  // the default cap, 1 GiB: all eight stay
    manager.initialize();
    {
      std::vector<std::shared_ptr<MemoryPointer>> blocks;
      for (int i = 0; i < 8; ++i) blocks.push_back(manager.memhostalloc(1 << 20, false, false, false));
    }
    EXPECT_EQ(manager.pinned_host_pool()->statistics().allocated_bytes, 8u << 20);
  }
  cuemm::testing::ScopedVariable bad("CUEMM_PINNED_MAXIMUM_CACHED", "lots");
  EXPECT_TRUE(cuemm::testing::throws<InvalidArgument>([&] { AsyncMemoryManager manager(&context); },
                                                      "CUEMM_PINNED_MAXIMUM_CACHED", "lots"));
}

TEST_F(HostPool, ReleasingEverythingFreesBlocksStillHeld) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");
  const auto before = simulation::live_allocations(simulation::AllocationKind::PinnedHost);
  PinnedHostPool pool(context);
  auto held = pool.allocate(8192, true, false, false);
  pool.allocate(8192, false, false, false).reset();
  pool.release_everything();
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), before);
  held.reset();  // already freed: nothing happens
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), before);
}

// Note [Per-thread fronts]: a thread's released blocks are kept by the
// thread, and still reach every other part of the pool.
TEST_F(HostPool, AThreadKeepsFourKindsAndSizesAndSharesTheRest) {
  CUEMM_REQUIRE_SIMULATION("call counters");
  PinnedHostPool pool(context);
  const std::size_t sizes[] = {1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20};  // large: waited for
  for (std::size_t size : sizes) pool.allocate(size, false, false, false).reset();
  simulation::reset_call_counts();
  const auto before = pool.statistics();
  for (std::size_t size : sizes) pool.allocate(size, false, false, false).reset();
  EXPECT_EQ(simulation::call_count("cuMemHostAlloc"), 0u) << "the size the front gave back was allocated anew";
  EXPECT_EQ(pool.statistics().hits - before.hits, 5u);
  EXPECT_EQ(pool.statistics().cached_bytes, 15u << 20);
}

TEST_F(HostPool, AFinishedThreadsBlocksServeTheOthers) {
  CUEMM_REQUIRE_SIMULATION("call counters");
  PinnedHostPool pool(context);
  std::uintptr_t released = 0;
  std::thread([&] {
    ScopedContext scope(context);
    auto block = pool.allocate(1 << 20, true, false, false);
    released = block->host_pointer();
  }).join();
  EXPECT_EQ(pool.statistics().cached_bytes, 1u << 20);
  simulation::reset_call_counts();
  auto again = pool.allocate(1 << 20, true, false, false);
  EXPECT_EQ(again->host_pointer(), released);
  EXPECT_EQ(simulation::call_count("cuMemHostAlloc"), 0u);
}

// Threads that take blocks of every kind and of small and large sizes, pin
// ranges of their own, free each other's blocks and trim the pool meanwhile:
// no block is handed out while another overlaps it, and each keeps what was
// written to it.
TEST_F(HostPool, KindsSizesPinsAndTrimsFromManyThreadsNeverHandOutOverlappingBlocks) {
  PinnedHostPool pool(context);
  struct Block {
    std::shared_ptr<MemoryPointer> memory;
    unsigned char mark;
  };
  cuemm::testing::LiveRanges live;  // host addresses
  cuemm::testing::HandedOver<Block> handed_over;
  std::atomic<int> corrupted{0};
  auto bytes_of = [](const Block& block) { return reinterpret_cast<unsigned char*>(block.memory->host_pointer()); };
  auto release = [&](Block& block) {
    const unsigned char* bytes = bytes_of(block);
    if (bytes[0] != block.mark || bytes[block.memory->size() - 1] != block.mark) corrupted.fetch_add(1);
    live.remove(reinterpret_cast<std::uintptr_t>(bytes));
    block.memory.reset();
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      std::mt19937 random(t + 1);
      std::vector<Block> mine;
      for (unsigned step = 0; step < 300; ++step) {
        const unsigned draw = random() % 100;
        if (draw < 2) {
          pool.trim();
        } else if (mine.size() < 8 && draw < 65) {
          const std::size_t size =
              random() % 8 ? 4096 * (1 + random() % 16) : (std::size_t{1} << 20) + random() % (1 << 20);
          Block block{nullptr, static_cast<unsigned char>(1 + (t * 31 + step) % 255)};
          if (random() % 5 == 0) {  // a range of its own, pinned
            auto owner = std::shared_ptr<unsigned char[]>(new unsigned char[size]);
            block.memory = pool.pin(owner, owner.get(), size, random() % 2 == 0);
          } else {
            block.memory = pool.allocate(size, random() % 2 == 0, random() % 3 == 0, random() % 4 == 0);
          }
          unsigned char* bytes = bytes_of(block);
          live.add(reinterpret_cast<std::uintptr_t>(bytes), size);
          bytes[0] = bytes[size - 1] = block.mark;
          mine.push_back(std::move(block));
        } else if (!mine.empty()) {
          Block block = cuemm::testing::take_one(mine, random);
          if (random() % 4 == 0) {  // another thread frees it
            handed_over.leave(std::move(block));
          } else {
            release(block);
          }
        }
        if (random() % 8 == 0) {  // a block another thread left
          if (std::optional<Block> theirs = handed_over.take()) release(*theirs);
        }
      }
      for (Block& block : mine) release(block);
    });
  }
  for (auto& thread : threads) thread.join();
  for (Block& block : handed_over.take_all()) release(block);
  EXPECT_EQ(live.overlaps(), 0) << "a block was handed out while another overlapped it";
  EXPECT_EQ(corrupted, 0) << "a block lost what was written to it";
  pool.trim();
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
}

TEST_F(HostPool, TrimAndReleaseEverythingReachTheFrontsOfLivingThreads) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");
  const auto before = simulation::live_allocations(simulation::AllocationKind::PinnedHost);
  PinnedHostPool pool(context);
  std::shared_ptr<MemoryPointer> held;
  std::atomic<int> step{0};
  std::thread owner([&] {
    ScopedContext scope(context);
    // Small blocks: a rotation of new ones until enough frees make a seal worth it.
    for (int i = 0; i < 3; ++i) pool.allocate(8192, false, false, false).reset();
    held = pool.allocate(8192, true, false, false);
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    pool.allocate(8192, false, false, false).reset();  // after release_everything(): freed at once
  });
  while (step.load() != 1) std::this_thread::yield();
  EXPECT_EQ(pool.statistics().cached_bytes, 3u * 8192u);
  EXPECT_EQ(pool.trim(), 3u * 8192u);
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), before + 1);
  pool.release_everything();
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), before);
  step = 2;
  owner.join();
  held.reset();  // freed by release_everything(): nothing happens
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), before);
  EXPECT_EQ(pool.statistics().cached_bytes, 0u);
}

TEST_F(HostPool, AManagersResetFreesItsHostMemory) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");
  const auto before = simulation::live_allocations(simulation::AllocationKind::PinnedHost);
  PoolMemoryManager manager(&context);
  manager.initialize();
  auto held = manager.memhostalloc(4096, false, false, false);
  manager.reset();
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), before);
  held.reset();
  auto fresh = manager.memhostalloc(4096, true, false, false);  // a new pool serves after the reset
  EXPECT_NE(fresh->device_pointer(), 0u);
}

// A loader thread's staging buffers, dropped by the thread that copies them:
// one thread allocates, another releases, 16 blocks at a time. The blocks
// come back to the allocating thread mostly through its own front, a trip
// to the pool's lock per batch (refilled from the shared lists), the pool
// buys no more than the blocks in flight and the fronts' rotations, and
// what each block carries is its own.
TEST_F(HostPool, BlocksReleasedByAnotherThreadComeBackInBatches) {
  PinnedHostPool pool(context);
  constexpr std::size_t kBlock = 4096, kBatch = 16, kBlocks = 8000;
  using Batch = std::vector<std::shared_ptr<MemoryPointer>>;
  cuemm::testing::BatchPipeline<Batch> pipeline;
  std::atomic<int> corrupted{0};
  std::thread releaser([&] {
    ScopedContext scope(context);
    while (auto batch = pipeline.pop()) {
      for (auto& block : *batch) {
        const auto* bytes = reinterpret_cast<const std::uint32_t*>(block->host_pointer());
        if (bytes[0] != static_cast<std::uint32_t>(block->host_pointer() ^ 0x5a5a5a5au)) ++corrupted;
        block.reset();
      }
    }
  });
  const PinnedHostPoolStatistics before = pool.statistics();
  Batch batch;
  for (std::size_t i = 0; i < kBlocks; ++i) {
    batch.push_back(pool.allocate(kBlock, false, false, false));
    *reinterpret_cast<std::uint32_t*>(batch.back()->host_pointer()) =
        static_cast<std::uint32_t>(batch.back()->host_pointer() ^ 0x5a5a5a5au);
    if (batch.size() == kBatch) {
      pipeline.push(std::move(batch));
      batch.clear();
    }
  }
  pipeline.close();
  releaser.join();
  const PinnedHostPoolStatistics after = pool.statistics();
  EXPECT_EQ(corrupted.load(), 0);
  const std::size_t requests = (after.hits + after.misses) - (before.hits + before.misses);
  EXPECT_EQ(requests, kBlocks);
  // In flight: up to three batches; the releasing thread's front keeps a
  // rotation (64), the allocating one's half of one.
  EXPECT_LE(after.allocated_bytes, (3 * kBatch + 64 + 32 + 16) * kBlock) << "the pool bought blocks it had";
  EXPECT_GE(after.front_hits - before.front_hits, kBlocks * 3 / 4)
      << "the allocating thread went to the shared lists for most blocks (hits "
      << after.hits - before.hits << ", of them from its front " << after.front_hits - before.front_hits << ")";
  EXPECT_EQ(after.cached_bytes, after.allocated_bytes);
  pool.trim();
  EXPECT_EQ(pool.statistics().allocated_bytes, 0u);
}
