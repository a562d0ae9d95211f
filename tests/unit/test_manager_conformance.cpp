// What every memory manager and adaptor must do, instantiated for each one: a
// new manager gets every test by being added to ManagerTypes.
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "support/block_storm.hpp"
#include "support/host_allocation_faults.hpp"
#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::throws;

namespace {

// How to make each manager under test.
template <typename Manager>
struct Plain {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) { return std::make_unique<Manager>(context); }
};
std::ostream& discarded() {
  static std::ostringstream sink;
  sink.str("");
  return sink;
}
struct StatisticsOverPool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    return std::make_unique<StatisticsAdaptor>(context, std::make_unique<PoolMemoryManager>(context));
  }
};
// The pool with its expandable arena (Note [Expandable arena]).
struct ExpandablePool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    PoolOptions options = PoolOptions::from_environment();
    options.expandable = true;
    return std::make_unique<PoolMemoryManager>(context, options);
  }
};
// The same, assembling blocks from pages' free ends at its peak (Note [Assembled blocks]).
struct AssemblingPool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    PoolOptions options = PoolOptions::from_environment();
    options.expandable = true;
    options.assemble_blocks = true;
    return std::make_unique<PoolMemoryManager>(context, options);
  }
};
// The pool that splits spares for recurring large sizes at its peak (Note [Recurring large sizes]).
struct SplitSparesPool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    PoolOptions options = PoolOptions::from_environment();
    options.split_spares = true;
    return std::make_unique<PoolMemoryManager>(context, options);
  }
};
struct LoggingOverDefault {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    return std::make_unique<LoggingAdaptor>(context, std::make_unique<DefaultMemoryManager>(context), discarded());
  }
};
struct TrackingOverPool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    return std::make_unique<TrackingAdaptor>(context, std::make_unique<PoolMemoryManager>(context), &discarded());
  }
};
struct LimitingOverStatisticsOverPool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    return std::make_unique<LimitingAdaptor>(context, StatisticsOverPool::make(context), std::size_t{8} << 30);
  }
};

// A handler that gives back what the pool keeps and retries once (the pool
// does that itself already: this runs every test through the retry path).
struct OutOfMemoryHandlerOverPool {
  static std::unique_ptr<BaseMemoryManager> make(Context* context) {
    auto pool = std::make_unique<PoolMemoryManager>(context);
    BaseMemoryManager* upstream = pool.get();
    return std::make_unique<OutOfMemoryHandlerAdaptor>(context, std::move(pool), [upstream](const OutOfMemory&, int attempt) {
      release_unused_memory(*upstream);
      return attempt == 1;
    });
  }
};

bool i_mapped(std::uint64_t nth) { return nth % 2 == 1; }

// Lets `user`'s kernels use memory of `owner`'s device, as a program does (the
// driver keeps it for the process).
void enable_peer_access(const Context& user, const Context& owner) {
  ScopedContext scope(user);
  const cuda::CUresult result = CUEMM_CU_RESULT(cuCtxEnablePeerAccess, owner.handle(), 0);
  if (result != cuda::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) driver::check(result, "cuCtxEnablePeerAccess");
}

template <typename Maker>
class Conformance : public ::testing::Test {
 protected:
  void SetUp() override {
    context.deallocations().flush_all();
    if (simulation::active()) simulation::clear_faults();
    manager = Maker::make(&context);
    manager->initialize();
  }
  void TearDown() override {
    if (simulation::active()) simulation::clear_faults();
  }
  void flush() {
    if (auto* host = find_adaptor<HostOnlyMemoryManager>(*manager)) host->deallocations().flush_all();
  }

  // Fills the memory with a pattern derived from `seed` and returns it.
  static std::vector<std::uint32_t> fill(const std::shared_ptr<MemoryPointer>& memory, std::uint32_t seed) {
    std::vector<std::uint32_t> values(memory->size() / 4);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = seed * 2654435761u + static_cast<std::uint32_t>(i);
    DeviceArray<std::uint32_t>(memory, values.size()).copy_to_device(values);
    return values;
  }
  static bool holds(const std::shared_ptr<MemoryPointer>& memory, const std::vector<std::uint32_t>& values) {
    return DeviceArray<std::uint32_t>(memory, values.size()).copy_to_host() == values;
  }
  // A storm thread's blocks and the contents each was filled with.
  using HeldBlocks = std::vector<std::pair<std::shared_ptr<MemoryPointer>, std::vector<std::uint32_t>>>;
  // One step of a storm thread: with fewer than 8 held, mostly a new block
  // of `size` bytes filled from `seed`; else a held one checked and freed.
  // Returns 1 where the block checked lost its contents.
  int storm_step(HeldBlocks& held, std::mt19937& random, std::size_t size, std::uint32_t seed) {
    if (held.size() < 8 && random() % 3) {
      auto memory = manager->memalloc(size);
      auto values = fill(memory, seed);
      held.emplace_back(std::move(memory), std::move(values));
      return 0;
    }
    if (held.empty()) return 0;
    const auto victim = held.begin() + static_cast<long>(random() % held.size());
    const bool intact = holds(victim->first, victim->second);
    held.erase(victim);
    return intact ? 0 : 1;
  }
  // How many of `held` lost their contents.
  int lost_contents(const HeldBlocks& held) {
    return static_cast<int>(std::count_if(held.begin(), held.end(),
                                          [&](const auto& block) { return !holds(block.first, block.second); }));
  }

  // One block of three quarters of `held` bytes, which were all freed (as
  // `freed` says): the manager must have given back what it kept of them.
  // Null, the failure reported, where it did not fit.
  std::shared_ptr<MemoryPointer> three_quarters_of(std::size_t held, const std::string& freed) {
    constexpr std::size_t kPage = std::size_t{2} << 20;
    const std::size_t most = held / 4 * 3 / kPage * kPage;
    try {
      return manager->memalloc(most);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "after " << freed << " were freed, one block of " << most << " bytes did not fit: "
                    << error.what();
      return nullptr;
    }
  }

  // With every block released: what the adaptors in the chain count says
  // so too (Note [Counting across a reset]); one failure each that does not.
  void expect_adaptors_count_nothing_in_use(const std::string& after) {
    if (auto* statistics = find_adaptor<StatisticsAdaptor>(*manager)) {
      const MemoryStatistics counts = statistics->statistics();
      for (MemoryKind kind : {MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Mapped, MemoryKind::Managed}) {
        EXPECT_EQ(counts.of(kind).current_count, 0u) << to_string(kind) << " blocks in use " << after;
        EXPECT_EQ(counts.of(kind).current_bytes, 0u) << to_string(kind) << " bytes in use " << after;
      }
    }
    if (auto* limit = find_adaptor<LimitingAdaptor>(*manager)) {
      EXPECT_EQ(limit->in_use(), 0u) << "bytes counted against the limit " << after;
    }
    if (auto* tracking = find_adaptor<TrackingAdaptor>(*manager)) {
      EXPECT_EQ(tracking->outstanding().size(), 0u) << "allocations outstanding " << after;
    }
  }

  // With every block released: a pool under the chain counts none in use
  // (a block lost on a failure path stays counted so until a reset).
  void expect_pool_counts_nothing_in_use(const std::string& after) {
    if (auto* pool = find_adaptor<PoolMemoryManager>(*manager)) {
      EXPECT_EQ(pool->statistics().in_use_bytes, 0u) << "bytes the pool counts in use " << after;
    }
  }

  // After a fault test's workload, every block of `manager` freed: nothing
  // is counted in use, a new block holds what is written to it, and
  // `manager` is reset.
  void expect_intact_once_all_freed(std::unique_ptr<BaseMemoryManager>& tested) {
    manager.swap(tested);  // (for the adaptors' counts)
    flush();
    expect_adaptors_count_nothing_in_use("after the blocks held were freed");
    expect_pool_counts_nothing_in_use("after the blocks held were freed");
    auto memory = manager->memalloc(1 << 20);
    auto values = fill(memory, 7);
    EXPECT_TRUE(holds(memory, values));
    memory.reset();
    manager.swap(tested);
    tested->reset();
  }

  // What the simulated driver holds: device memory, pinned and registered host memory.
  struct DriverHoldings {
    std::uint64_t device_bytes, pinned, registered;
  };
  DriverHoldings driver_holdings() {
    context.deallocations().flush_all();
    context.synchronize();
    return {simulation::device_bytes_in_use(0), simulation::live_allocations(simulation::AllocationKind::PinnedHost),
            simulation::live_allocations(simulation::AllocationKind::RegisteredHost)};
  }
  void expect_nothing_left_since(const DriverHoldings& before) {
    const DriverHoldings now = driver_holdings();
    EXPECT_EQ(now.device_bytes, before.device_bytes) << "device memory leaked";
    EXPECT_EQ(now.pinned, before.pinned) << "pinned host memory leaked";
    EXPECT_EQ(now.registered, before.registered) << "host memory left pinned";
  }

  // After threads raced resets and released every block: the adaptors count
  // nothing in use, nothing stays with the driver past `device_baseline`
  // (bytes in use before; simulated driver), and a new block works.
  void expect_consistent_after_racing_resets(std::uint64_t device_baseline) {
    expect_adaptors_count_nothing_in_use("after the resets, every block released");
    manager->reset();
    flush();
    if (simulation::active()) {
      EXPECT_EQ(simulation::device_bytes_in_use(0), device_baseline) << "memory of the racing blocks was left behind";
    }
    auto memory = manager->memalloc(1 << 20);
    auto values = fill(memory, 3);
    EXPECT_TRUE(holds(memory, values));
  }

  Context& context = current_context();
  std::unique_ptr<BaseMemoryManager> manager;
};

// Whether the manager keeps freed device memory for reuse, so that
// release_unused_memory() has some to give back: the pool does; the async
// manager's driver pool only above a release threshold of 0 (at 0 the
// driver gives it back at each synchronisation itself).
bool keeps_freed_device_memory(BaseMemoryManager& manager) {
  if (find_adaptor<PoolMemoryManager>(manager)) return true;
  const auto* async = find_adaptor<AsyncMemoryManager>(manager);
  return async && async->options().release_threshold > 0;
}

using ManagerTypes = ::testing::Types<Plain<DefaultMemoryManager>, Plain<PoolMemoryManager>, ExpandablePool,
                                      AssemblingPool, SplitSparesPool, Plain<AsyncMemoryManager>, StatisticsOverPool,
                                      LoggingOverDefault, TrackingOverPool, LimitingOverStatisticsOverPool,
                                      OutOfMemoryHandlerOverPool>;
TYPED_TEST_SUITE(Conformance, ManagerTypes);

}  // namespace

TYPED_TEST(Conformance, BlocksAreAlignedTo256Bytes) {
  std::mt19937 random(1);
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 300; ++i) {
    blocks.push_back(this->manager->memalloc(1 + random() % 100000));
    EXPECT_EQ(blocks.back()->device_pointer() % 256, 0u) << "size " << blocks.back()->size();
  }
}

TYPED_TEST(Conformance, ZeroBytesIsRefused) {
  EXPECT_THROW(this->manager->memalloc(0), InvalidArgument);
}

// Sizes no device holds, up to those whose rounding would wrap past 2^64:
// out of memory, naming the size asked for (pinned host memory: an error
// naming it); then the manager works as before.
TYPED_TEST(Conformance, ImpossibleSizesAreOutOfMemoryNamingTheSize) {
  const MemoryInfo info = this->manager->get_memory_info();
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (const std::size_t size : {max, max - 255, max / 2 + 1, std::size_t{1} << 62, info.total + 1}) {
    SCOPED_TRACE(size);
    try {
      this->manager->memalloc(size);
      ADD_FAILURE() << "an allocation of " << size << " bytes succeeded";
    } catch (const OutOfMemory& error) {
      EXPECT_NE(std::string(error.what()).find(std::to_string(size)), std::string::npos) << error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << "not OutOfMemory: " << error.what();
    }
    if (size == info.total + 1) continue;  // host memory may well hold that
    try {
      this->manager->memhostalloc(size, false, false, false);
      ADD_FAILURE() << "a host allocation of " << size << " bytes succeeded";
    } catch (const CudaError& error) {  // the driver may call it out of memory or an invalid value
      EXPECT_NE(std::string(error.what()).find(std::to_string(size)), std::string::npos) << error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << "host, not a CudaError: " << error.what();
    }
  }
  auto memory = this->manager->memalloc(1 << 20);
  auto values = this->fill(memory, 4);
  EXPECT_TRUE(this->holds(memory, values));
}

// A manager that filled the device (or its cap) gives that memory back for
// reuse once its blocks are freed, whatever caches and segments hold them:
// one block of most of it then fits (flush-and-retry, and the pools'
// release of what they keep on out-of-memory). Small blocks first, so that
// the pools' rings and shared segments hold some of it; then large ones
// until out of memory.
TYPED_TEST(Conformance, AfterFillingTheDeviceOneBlockOfMostOfItFitsOnceAllAreFreed) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  constexpr std::size_t kLarge = 256 * kMiB;
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  std::size_t held = 0;
  for (int i = 0; i < 512; ++i, held += kMiB) blocks.push_back(this->manager->memalloc(kMiB));
  for (;;) {
    try {
      blocks.push_back(this->manager->memalloc(kLarge));
      held += kLarge;
    } catch (const OutOfMemory& error) {
      EXPECT_NE(std::string(error.what()).find(std::to_string(kLarge)), std::string::npos) << error.what();
      break;
    }
    ASSERT_LT(blocks.size(), 100000u) << "never out of memory";
  }
  ASSERT_GT(held, 512 * kMiB) << "no large block fitted at all";
  const std::string freed = std::to_string(blocks.size()) + " blocks of " + std::to_string(held) + " bytes in all";
  blocks.clear();
  std::shared_ptr<MemoryPointer> one = this->three_quarters_of(held, freed);
  ASSERT_TRUE(one);
  // Its first and last pages are the device's (the rest is too large to copy here).
  for (const std::size_t start : {std::size_t{0}, one->size() - 4096}) {
    const auto values = this->fill(one->view(start, start + 4096), static_cast<std::uint32_t>(start));
    EXPECT_TRUE(this->holds(one->view(start, start + 4096), values)) << "at " << start;
  }
  one.reset();
  this->flush();
  // And the manager serves small blocks as before.
  auto memory = this->manager->memalloc(kMiB);
  const auto contents = this->fill(memory, 11);
  EXPECT_TRUE(this->holds(memory, contents));
}

// Threads that run the device out of memory together: each gets blocks of
// random sizes until out of memory (the only error allowed), then all free
// them. No thread hangs, and the manager serves one block of most of what
// they held, then small blocks that keep their contents.
TYPED_TEST(Conformance, ThreadsThatRunTheDeviceOutOfMemoryTogetherLeaveItConsistent) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  constexpr int kThreads = 8;
  std::vector<std::vector<std::shared_ptr<MemoryPointer>>> held(kThreads);
  std::vector<std::size_t> bytes(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(100 + t);
      try {
        for (int misses = 0; misses < 3;) {
          const std::size_t size = (1 + random() % 512) * kMiB - random() % 4096;
          try {
            held[t].push_back(this->manager->memalloc(size));
            bytes[t] += size;
          } catch (const OutOfMemory&) {
            ++misses;
          }
        }
      } catch (const std::exception& error) {
        errors[t] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::size_t total = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    total += bytes[t];
  }
  ASSERT_GT(total, 512 * kMiB);
  held.clear();
  this->flush();
  EXPECT_TRUE(this->three_quarters_of(total, std::to_string(total) + " bytes of " + std::to_string(kThreads) +
                                                 " threads"));
  this->flush();
  std::vector<std::shared_ptr<MemoryPointer>> small;
  std::vector<std::vector<std::uint32_t>> contents;
  for (std::uint32_t i = 0; i < 16; ++i) {
    small.push_back(this->manager->memalloc(4096 * (i + 1)));
    contents.push_back(this->fill(small.back(), i));
  }
  for (std::size_t i = 0; i < small.size(); ++i) EXPECT_TRUE(this->holds(small[i], contents[i])) << "block " << i;
}

TYPED_TEST(Conformance, BlocksAreDistinctAndKeepTheirContents) {
  std::mt19937 random(2);
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  std::vector<std::vector<std::uint32_t>> contents;
  for (std::uint32_t i = 0; i < 200; ++i) {
    blocks.push_back(this->manager->memalloc(4 * (1 + random() % 20000)));
    contents.push_back(this->fill(blocks.back(), i));
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) ASSERT_TRUE(this->holds(blocks[i], contents[i])) << "block " << i;
}

TYPED_TEST(Conformance, FreedMemoryIsReused) {
  for (int i = 0; i < 2000; ++i) this->manager->memalloc(1 << 20).reset();
  this->flush();
  const MemoryInfo info = this->manager->get_memory_info();
  EXPECT_GT(info.free, info.total / 2) << "2000 freed MiB were not given back for reuse";
}

// An IPC handle of memory that cannot be exported is refused for what is
// wrong with the memory, under every manager (the async manager's own
// limits come after): only device memory, and only while it lives.
TYPED_TEST(Conformance, AnIpcHandleOfPinnedOrFreedMemoryIsRefusedSayingWhy) {
  auto pinned = this->manager->memhostalloc(4096, false, false, false);
  EXPECT_TRUE(throws<InvalidArgument>([&] { this->manager->get_ipc_handle(pinned); }, "only device memory",
                                      "pinned memory"));
  auto freed = this->manager->memalloc(4096);
  freed->free();
  EXPECT_TRUE(throws<StateError>([&] { this->manager->get_ipc_handle(freed); }, "already freed", "4096 bytes"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { this->manager->get_ipc_handle(nullptr); }, "null"));
}

// Host memory that cannot be page-locked (past the end of its mapping, or
// 2^64-1 bytes of it) is a driver error naming the size, under every
// manager (the pools' pinned caches included), and the manager still pins
// what can be.
TYPED_TEST(Conformance, PinningPastTheEndOfAMappingIsAnErrorNamingTheSize) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* mapped = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  ASSERT_EQ(munmap(static_cast<char*>(mapped) + page, page), 0);  // (its second page gone)
  for (const bool pinned_mapped : {false, true}) {
    for (const std::size_t size : {2 * page, std::numeric_limits<std::size_t>::max()}) {
      SCOPED_TRACE(std::to_string(size) + (pinned_mapped ? " mapped" : ""));
      EXPECT_TRUE(throws<CudaError>([&] { this->manager->mempin(nullptr, mapped, size, pinned_mapped); },
                                    std::to_string(size)));
    }
    auto pinned = this->manager->mempin(nullptr, mapped, page, pinned_mapped);
    EXPECT_EQ(pinned->size(), page);
    pinned->free();
    this->flush();  // (Numba's manager unpins in its deferred queue)
  }
  munmap(mapped, page);
}

TYPED_TEST(Conformance, MemoryInfoIsReal) {
  const MemoryInfo info = this->manager->get_memory_info();
  EXPECT_GT(info.total, 0u);
  EXPECT_LE(info.free, info.total);
}


// release_unused_memory(): once every block but one is freed, what the manager
// kept goes back to the driver (the driver's free memory grows by what it
// reports), the block still held keeps its contents, a second call finds
// nothing left, and the manager serves blocks as before.
TYPED_TEST(Conformance, ReleasingUnusedMemoryGivesBackAllButWhatIsHeld) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const std::uint64_t in_use_before = simulation::active() ? simulation::device_bytes_in_use(0) : 0;
  auto held = this->manager->memalloc(3 * kMiB);
  const auto held_values = this->fill(held, 5);
  std::mt19937 random(7);
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  std::size_t device_bytes = 0;
  for (int i = 0; i < 200; ++i) {
    const std::size_t size = 256 + random() % (i % 10 == 0 ? 24 * kMiB : 256 * 1024);
    blocks.push_back(this->manager->memalloc(size));
    device_bytes += size;
  }
  constexpr std::size_t kPinned = 4 * kMiB;
  for (int i = 0; i < 3; ++i) blocks.push_back(this->manager->memhostalloc(kPinned, i == 1, false, false));
  blocks.clear();

  auto* host = find_adaptor<HostOnlyMemoryManager>(*this->manager);
  ASSERT_TRUE(host);
  const std::size_t pending = host->deallocations().pending_count();
  const std::uint64_t free_before = driver_memory_info(this->context).free;
  const ReleasedMemory released = release_unused_memory(*this->manager);
  const std::uint64_t free_after = driver_memory_info(this->context).free;
  // Blocks of at most a page share the driver's 2 MiB pages (Note [cuMemAlloc's
  // shared pages]): a page that a block from before this test still holds
  // (one a failed cuMemFree kept) stays taken when the blocks freed here that
  // share it go back.
  const std::uint64_t held_by_earlier_blocks = in_use_before;
  EXPECT_GE(free_after + held_by_earlier_blocks, free_before + released.device_bytes)
      << "reported more than went back";
  EXPECT_EQ(released.deferred_frees, pending);
  EXPECT_EQ(host->deallocations().pending_count(), 0u) << "deferred frees still pending";
  const bool caches_device_memory = keeps_freed_device_memory(*this->manager);
  if (caches_device_memory) {
    EXPECT_GT(released.device_bytes, 0u) << "of " << device_bytes << " bytes freed";
  }
  if (host->pinned_host_pool()) {
    EXPECT_GE(released.pinned_host_bytes, kPinned) << "the pinned host pool kept its blocks";
  } else {
    EXPECT_EQ(released.pinned_host_bytes, 0u) << "no pinned host pool, yet pinned bytes given back";
  }
  // All but the segment of the held block: at most 32 MiB here, or the
  // initial segment (CUEMM_POOL_INITIAL_SIZE) where the block lies in it.
  std::size_t held_segment = caches_device_memory ? 32 * kMiB : 4 * kMiB;
  if (auto* pool = find_adaptor<PoolMemoryManager>(*this->manager)) {
    held_segment = std::max(held_segment, pool->options().initial_size);
    EXPECT_LE(pool->statistics().reserved_bytes, held_segment)
        << "of " << device_bytes << " bytes freed, released " << released.device_bytes;
  }
  if (simulation::active()) {
    // What is left in use: the held block's segment (its size in whole pages
    // without a pool).
    EXPECT_LE(simulation::device_bytes_in_use(0), in_use_before + held_segment);
  }

  const ReleasedMemory again = release_unused_memory(*this->manager);
  EXPECT_EQ(again.device_bytes, 0u);
  EXPECT_EQ(again.pinned_host_bytes, 0u);
  EXPECT_EQ(again.deferred_frees, 0u);
  EXPECT_TRUE(this->holds(held, held_values)) << "the block still held lost its contents";
  auto memory = this->manager->memalloc(kMiB);
  const auto values = this->fill(memory, 6);
  EXPECT_TRUE(this->holds(memory, values));
}

// Under defer_cleanup() nothing is released; once the guard is gone, it is.
TYPED_TEST(Conformance, ReleasingUnusedMemoryWaitsForDeferCleanupToEnd) {
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(this->manager->memalloc(std::size_t{5} << 20));
  std::optional<CleanupGuard> guard(this->manager->defer_cleanup());
  blocks.clear();
  const ReleasedMemory deferred = release_unused_memory(*this->manager);
  EXPECT_EQ(deferred.device_bytes, 0u);
  EXPECT_EQ(deferred.deferred_frees, 0u);
  EXPECT_EQ(deferred.pinned_host_bytes, 0u);
  guard.reset();
  const ReleasedMemory released = release_unused_memory(*this->manager);
  if (keeps_freed_device_memory(*this->manager) || find_adaptor<DefaultMemoryManager>(*this->manager)) {
    EXPECT_GT(released.device_bytes + released.deferred_bytes, 0u) << "nothing released once the guard ended";
  }
}
// The EMM interface's reset() clears up all memory of the context, blocks
// still held included (their memory is measured on the simulated driver).
TYPED_TEST(Conformance, ResetReleasesEverythingAndTheManagerWorksAfter) {
  this->manager->reset();
  this->flush();
  const std::uint64_t baseline = simulation::active() ? simulation::device_bytes_in_use(0) : 0;
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 20; ++i) blocks.push_back(this->manager->memalloc(i % 2 ? 1 << 16 : 8 << 20));
  this->manager->reset();
  this->flush();
  if (simulation::active()) {
    EXPECT_EQ(simulation::device_bytes_in_use(0), baseline) << "reset left the memory of blocks still held behind";
  }
  blocks.clear();  // late finalizers after a reset must be harmless
  this->flush();
  auto memory = this->manager->memalloc(4096);
  auto values = this->fill(memory, 9);
  EXPECT_TRUE(this->holds(memory, values));
}

// A reset from one thread while others allocate and free (a library that
// resets its context while another's threads still work): no crash, no
// hang, no block handed out twice at once, and once all is released and
// reset again nothing is left behind.
TYPED_TEST(Conformance, AResetWhileOtherThreadsAllocateLeavesItConsistent) {
  this->manager->reset();
  this->flush();
  const std::uint64_t baseline = simulation::active() ? simulation::device_bytes_in_use(0) : 0;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(this->context);
      std::mt19937 random(t);
      std::vector<std::shared_ptr<MemoryPointer>> mine;
      for (int step = 0; step < 400; ++step) {
        try {
          const unsigned draw = random() % 10;
          const std::size_t size = draw < 6 ? 256 + random() % 65536 : draw < 9 ? (1 << 20) + random() % (3 << 20)
                                                                                : (8 << 20) + random() % (8 << 20);
          if (draw == 0) {
            mine.push_back(this->manager->memhostalloc(4096 + random() % 8192, false, false, false));
          } else {
            mine.push_back(this->manager->memalloc(size));
          }
          if (mine.size() > 8) mine.erase(mine.begin() + random() % mine.size());
        } catch (const std::exception& error) {
          if (failures++ < 3) ADD_FAILURE() << "thread " << t << ": " << error.what();
        }
      }
      mine.clear();
    });
  }
  std::thread resetter([&] {
    ScopedContext scope(this->context);
    for (int i = 0; i < 20 && !done; ++i) {
      this->manager->reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  resetter.join();
  EXPECT_EQ(failures.load(), 0);
  this->expect_consistent_after_racing_resets(baseline);
}

// Runs `work` on a thread of `stack_bytes` of stack, and joins it.
class ThreadOfSmallStack {
 public:
  ThreadOfSmallStack(std::size_t stack_bytes, std::function<void()> work) : work_(std::move(work)) {
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, stack_bytes);
    started_ = pthread_create(&thread_, &attributes, &ThreadOfSmallStack::run, this) == 0;
    pthread_attr_destroy(&attributes);
  }
  ~ThreadOfSmallStack() { join(); }
  bool started() const noexcept { return started_; }
  void join() {
    if (std::exchange(started_, false)) pthread_join(thread_, nullptr);
  }

 private:
  static void* run(void* self) {
    static_cast<ThreadOfSmallStack*>(self)->work_();
    return nullptr;
  }
  std::function<void()> work_;
  pthread_t thread_{};
  bool started_ = false;
};

// reset() in a loop beside threads that allocate: a request that found its
// core retired went on to the successor, and from there to the next one,
// recursing; a thread that fell behind the resets ran out of stack (the
// threads' stacks are small here, so that a few thousand resets show it).
// Afterwards nothing stays with the driver, and the adaptors count nothing
// in use: a count made while a reset forgot the others stayed for good. It
// also found a mapped block's device address asked for after a reset freed
// it, and pinned ranges left registered after their buffers were freed.
TYPED_TEST(Conformance, ResetsInALoopBesideAllocatingThreads) {
  constexpr int kThreads = 4, kResets = 3000;
  constexpr std::size_t kStack = 128 << 10;
  // (A bound on the work, not a check: a real driver's reset of the async
  // manager destroys its pool, which takes far longer than the simulation's.)
  constexpr auto kMostResetting = std::chrono::seconds(3);
  this->manager->reset();
  this->flush();
  const std::uint64_t baseline = simulation::active() ? simulation::device_bytes_in_use(0) : 0;
  // Every kind of request a program makes, up to 4 blocks held: device
  // blocks small and large, pinned and mapped host memory, ranges pinned
  // (each in a buffer of its own, freed with its last pointer: malloc gives
  // its addresses to the next one), managed memory, memory info, an IPC
  // handle (refused, saying why, where a reset released the block), blocks
  // released under defer_cleanup(), and release_unused_memory().
  auto one_request = [&](std::mt19937& random, std::vector<std::shared_ptr<MemoryPointer>>& mine) {
    switch (random() % 16) {
      case 0: {
        auto buffer = std::make_shared<std::vector<char>>(65536 + 4096);
        auto* page = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(buffer->data()) + 4095) & ~4095ul);
        mine.push_back(this->manager->mempin(buffer, page, 65536, random() % 2));
        break;
      }
      case 1:
        mine.push_back(this->manager->memallocmanaged(4096 + random() % 65536, true));
        break;
      case 2:
        (void)this->manager->get_memory_info();
        break;
      case 3:
        if (!mine.empty() && mine.back()->kind() == MemoryKind::Device) {
          try {
            (void)this->manager->get_ipc_handle(mine.back());
          } catch (const Error&) {
          }
        }
        break;
      case 4: {
        auto guard = this->manager->defer_cleanup();
        mine.clear();
        break;
      }
      case 5:
      case 6:
        mine.push_back(this->manager->memhostalloc(4096 + random() % 65536, random() % 2, false, false));
        break;
      case 7:
      case 8:
      case 9:
        mine.push_back(this->manager->memalloc((1 << 20) + random() % (6 << 20)));
        break;
      case 10:
        release_unused_memory(*this->manager);
        break;
      default:
        mine.push_back(this->manager->memalloc(256 + random() % 8192));
    }
    if (mine.size() > 4) mine.erase(mine.begin() + random() % mine.size());
  };
  std::atomic<bool> resetting{true};
  std::atomic<int> failures{0};
  std::vector<std::unique_ptr<ThreadOfSmallStack>> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.push_back(std::make_unique<ThreadOfSmallStack>(kStack, [&, t] {
      ScopedContext scope(this->context);
      std::mt19937 random(t);
      std::vector<std::shared_ptr<MemoryPointer>> mine;
      while (resetting) {
        try {
          one_request(random, mine);
        } catch (const std::exception& error) {
          if (failures++ < 3) ADD_FAILURE() << "thread " << t << ": " << error.what();
        }
      }
      mine.clear();
    }));
    ASSERT_TRUE(threads.back()->started());
  }
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < kResets && std::chrono::steady_clock::now() - began < kMostResetting; ++i) this->manager->reset();
  resetting = false;
  for (auto& thread : threads) thread->join();
  EXPECT_EQ(failures.load(), 0);
  this->expect_consistent_after_racing_resets(baseline);
}

// A program that resets often (a test suite that closes its context per
// test, a service per job) must not grow: what a reset keeps (a pool's
// retired core, kept until exit for pointers that outlive it) stays small.
// Heap bytes in use, not resident memory, so that nothing else counts.
TYPED_TEST(Conformance, ResetsKeepLittleHostMemory) {
  constexpr int kResets = 300;
  constexpr std::size_t kMostPerReset = 24 << 10;
  auto one_round = [&] {
    this->manager->memalloc(1000).reset();
    this->manager->memalloc(3 << 20).reset();
    this->manager->memhostalloc(4096, false, false, false).reset();
    this->manager->reset();
  };
  for (int i = 0; i < 20; ++i) one_round();  // (what the first rounds make once)
  const std::size_t before = mallinfo2().uordblks;
  for (int i = 0; i < kResets; ++i) one_round();
  const std::size_t after = mallinfo2().uordblks;
  const std::size_t per_reset = after > before ? (after - before) / kResets : 0;
  EXPECT_LE(per_reset, kMostPerReset) << "each reset kept " << per_reset << " bytes of host memory";
}

// Numba makes an instance without a context to read its interface version.
// Such an instance allocates nothing, and says why, rather than crash.
TYPED_TEST(Conformance, AnInstanceWithoutAContextAllocatesNothingAndSaysWhy) {
  auto probe = TypeParam::make(nullptr);
  EXPECT_EQ(probe->interface_version(), kMemoryManagerInterfaceVersion);
  for (const std::size_t size : {std::size_t{100}, std::size_t{3} << 20, std::size_t{64} << 20})
    EXPECT_TRUE(throws<StateError>([&] { probe->memalloc(size); }, "no context")) << size;
  EXPECT_TRUE(throws<StateError>([&] { probe->memhostalloc(4096, false, false, false); }, "no context"));
  if (auto* pool = find_adaptor<PoolMemoryManager>(*probe)) {
    EXPECT_TRUE(throws<StateError>([&] { pool->allocate(256); }, "no context"));
    EXPECT_TRUE(throws<StateError>([&] { pool->allocate(256, cuda::CUstream{}); }, "no context"));
    EXPECT_EQ(pool->trim(), 0u);
  }
  PoolOptions initially;
  initially.initial_size = std::size_t{64} << 20;
  EXPECT_TRUE(throws<StateError>([&] { PoolMemoryManager(nullptr, initially).initialize(); }, "no context"));
  EXPECT_NO_THROW(probe->reset());
}

// Once a peer has enabled access, its kernels use the blocks as they would
// cuMemAlloc's (Note [Peer access] in src/driver/peer_access.hpp): small,
// class-sized and large enough for a segment of its own.
TYPED_TEST(Conformance, APeerThatEnabledAccessCanUseTheBlocks) {
  if (const std::string why = cuemm::testing::why_devices_are_not_peers(); !why.empty()) GTEST_SKIP() << why;
  Context& peer = Device::get(1).primary_context();
  enable_peer_access(peer, this->context);
  ScopedContext scope(peer);
  Module module = peer.load_module(cuemm::testing::test_kernels_ptx());
  Stream stream = peer.create_stream();
  for (std::size_t size : {std::size_t{4096}, std::size_t{1} << 20, std::size_t{8} << 20}) {
    auto memory = this->manager->memalloc(size);
    std::vector<std::uint32_t> values = this->fill(memory, 5);
    // A copy from pageable memory may return before its DMA has landed: it is
    // ordered on the owner's legacy stream, which device 1's streams do not wait for.
    this->context.synchronize();
    const std::uint64_t count = values.size();
    module.function("cuemm_add_u32").launch({64}, {256}, stream, memory->device_pointer(), 7u, count);
    stream.synchronize();
    for (std::uint32_t& value : values) value += 7;
    EXPECT_TRUE(this->holds(memory, values)) << size << " bytes, added to by device 1's kernel";
  }
}

TYPED_TEST(Conformance, ThreadStormsKeepEveryBlocksContents) {
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(t);
      typename TestFixture::HeldBlocks held;
      for (std::uint32_t step = 0; step < 150; ++step)
        corrupted += this->storm_step(held, random, 4 * (1 + random() % 4096), t * 1000 + step);
      corrupted += this->lost_contents(held);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupted, 0);
}

// release_unused_memory() from one thread while others allocate, fill, check
// and free blocks of small and large sizes, pinned ones among them: no block
// loses its contents, and the releases give memory back meanwhile.
TYPED_TEST(Conformance, ReleasingUnusedMemoryWhileThreadsAllocateKeepsTheirBlocks) {
  std::atomic<int> corrupted{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(t + 40);
      typename TestFixture::HeldBlocks held;
      for (std::uint32_t step = 0; step < 300; ++step) {
        if (step % 50 == 0) held.clear();  // (blocks for the releases to find)
        const std::size_t size = random() % 8 ? 4 * (1 + random() % 16384) : (1 + random() % 6) << 20;
        corrupted += this->storm_step(held, random, size, t * 1000 + step);
        if (step % 16 == 0) {
          auto pinned = this->manager->memhostalloc(4096 * (1 + random() % 64), false, false, false);
          std::memset(reinterpret_cast<void*>(pinned->host_pointer()), 1, pinned->size());
        }
      }
      corrupted += this->lost_contents(held);
    });
  }
  std::uint64_t released = 0;
  std::thread releasing([&] {
    while (!done.load()) {
      released += release_unused_memory(*this->manager).device_bytes;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  releasing.join();
  EXPECT_EQ(corrupted, 0);
  released += release_unused_memory(*this->manager).device_bytes;
  if (keeps_freed_device_memory(*this->manager)) {
    EXPECT_GT(released, 0u) << "the threads' freed blocks stayed in the manager";
  }
}

// Threads of every size (the classes, the index, segments of their own, in
// a pool) that free each other's blocks and ask for memory info meanwhile:
// no block is handed out while another overlaps it, and each keeps its first
// and last words.
TYPED_TEST(Conformance, ThreadsOfEverySizeNeverGetOverlappingBlocks) {
  using Block = std::pair<std::shared_ptr<MemoryPointer>, std::uint32_t>;  // and its mark
  cuemm::testing::LiveRanges live;
  cuemm::testing::HandedOver<Block> handed_over;
  std::atomic<int> corrupted{0};
  auto release = [&](std::shared_ptr<MemoryPointer>& memory, std::uint32_t mark) {
    std::uint32_t words[2] = {};
    CUEMM_CU(cuMemcpyDtoH, &words[0], memory->device_pointer(), 4);
    CUEMM_CU(cuMemcpyDtoH, &words[1], memory->device_pointer() + memory->size() / 4 * 4 - 4, 4);
    if (words[0] != mark || words[1] != mark) corrupted.fetch_add(1);
    live.remove(memory->device_pointer());
    memory.reset();
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(this->context);
      std::mt19937 random(t + 7);
      std::vector<Block> mine;
      for (std::uint32_t step = 0; step < 120; ++step) {
        const unsigned draw = random() % 100;
        if (draw < 3) {
          this->manager->get_memory_info();
        } else if (mine.size() < 6 && draw < 65) {
          const unsigned kind = random() % 10;
          const std::size_t size = kind < 7   ? 256 + random() % (1 << 20)
                                   : kind < 9 ? (std::size_t{1} << 20) + random() % (3 << 20)
                                              : (std::size_t{4} << 20) + random() % (16 << 20);
          auto memory = this->manager->memalloc(size);
          const cuda::CUdeviceptr address = memory->device_pointer();
          live.add(address, size);
          const std::uint32_t mark = t * 100000 + step;
          CUEMM_CU(cuMemsetD32, address, mark, 1);
          CUEMM_CU(cuMemsetD32, address + size / 4 * 4 - 4, mark, 1);
          mine.emplace_back(std::move(memory), mark);
        } else if (!mine.empty()) {
          Block block = cuemm::testing::take_one(mine, random);
          if (random() % 4 == 0) {  // another thread frees it
            handed_over.leave(std::move(block));
          } else {
            release(block.first, block.second);
          }
        }
        if (random() % 8 == 0) {  // a block another thread left
          if (std::optional<Block> theirs = handed_over.take()) release(theirs->first, theirs->second);
        }
      }
      for (auto& [memory, mark] : mine) release(memory, mark);
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& [memory, mark] : handed_over.take_all()) release(memory, mark);
  EXPECT_EQ(live.overlaps(), 0) << "a block was handed out while another overlapped it";
  EXPECT_EQ(corrupted, 0) << "a block lost what was written to it";
}

TYPED_TEST(Conformance, ADriverFailureLeavesTheManagerConsistent) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  this->manager->reset();
  this->flush();
  const auto baseline = simulation::device_bytes_in_use(0);
  for (const cuda::CUresult failure : {cuda::CUDA_ERROR_UNKNOWN, cuda::CUDA_ERROR_OUT_OF_MEMORY}) {
    SCOPED_TRACE(error_name(failure));
    // Every device allocation call fails for a while: the first allocation cannot succeed.
    simulation::inject_fault("cuMemAlloc", 1, failure, 8);
    simulation::inject_fault("cuMemAllocFromPoolAsync", 1, failure, 8);
    simulation::inject_fault("cuMemCreate", 1, failure, 8);
    EXPECT_THROW(this->manager->memalloc(1 << 20), CudaError);
    simulation::clear_faults();
    EXPECT_EQ(simulation::device_bytes_in_use(0), baseline) << "a failed allocation left memory behind";
    auto memory = this->manager->memalloc(1 << 20);
    auto values = this->fill(memory, 3);
    EXPECT_TRUE(this->holds(memory, values));
    memory.reset();
    this->manager->reset();
    this->flush();
    EXPECT_EQ(simulation::device_bytes_in_use(0), baseline) << "reset left memory behind";
  }
}

// Each driver call a manager may make fails once, at its first, second or
// third use: whatever the workload then sees, the manager works afterwards
// and nothing leaks (but what a failed free call left with the driver, which
// refused to take it back).
TYPED_TEST(Conformance, AnyDriverCallFailingLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  this->manager.reset();
  this->context.deallocations().flush_all();
  auto baseline = simulation::device_bytes_in_use(0);
  auto host_baseline = simulation::live_allocations(simulation::AllocationKind::PinnedHost);
  for (const std::string function :
       {"cuMemAlloc", "cuMemFree", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemPoolCreate",
        "cuMemPoolSetAttribute", "cuMemGetInfo", "cuEventCreate", "cuEventRecord", "cuEventQuery",
        "cuEventSynchronize", "cuCtxSynchronize", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostGetDevicePointer",
        "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
        "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"}) {
    for (std::uint64_t nth = 1; nth <= 3; ++nth) {
      SCOPED_TRACE(function + " failing at call " + std::to_string(nth));
      {
        auto manager = TypeParam::make(&this->context);
        simulation::inject_fault(function, nth, cuda::CUDA_ERROR_UNKNOWN);
        try {
          manager->initialize();
          std::vector<std::shared_ptr<MemoryPointer>> held;
          for (int i = 0; i < 40; ++i) {
            held.push_back(manager->memalloc(std::size_t{1} << (8 + i % 16)));  // 256 B to 8 MiB
            if (i % 3 == 0) held.erase(held.begin());
          }
          held.push_back(manager->memhostalloc(8192, i_mapped(nth), false, false));
          held.clear();
        } catch (const Error&) {
          // Whatever failed said so with an exception; the checks below matter.
        }
        simulation::clear_faults();
        auto memory = manager->memalloc(1 << 20);
        auto values = this->fill(memory, 5);
        EXPECT_TRUE(this->holds(memory, values));
        memory.reset();
        manager->reset();
      }
      this->context.deallocations().flush_all();
      this->context.synchronize();
      if (function.starts_with("cuMemFree") || function == "cuMemUnmap" || function == "cuMemRelease" ||
          function == "cuMemAddressFree") {  // the driver kept what it refused to free
        baseline = simulation::device_bytes_in_use(0);
        host_baseline = simulation::live_allocations(simulation::AllocationKind::PinnedHost);
        continue;
      }
      EXPECT_EQ(simulation::device_bytes_in_use(0), baseline) << "device memory leaked";
      EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::PinnedHost), host_baseline)
          << "pinned host memory leaked";
    }
  }
}

// Where the manager has stream-ordered calls (StreamOrderedAllocator: the
// pools, and adaptors over one): threads on streams of their own get blocks
// that never overlap and keep what was written to them, and the adaptors
// count nothing in use after. Where it has none, stream_ordered_allocator()
// says so and a call through an adaptor is NotSupported, not a crash.
TYPED_TEST(Conformance, StreamOrderedBlocksKeepTheirContentsOrTheCallsSayWhyNot) {
  StreamOrderedAllocator* ordered = stream_ordered_allocator(*this->manager);
  if (!ordered) {
    if (auto* adaptor = dynamic_cast<ManagerAdaptor*>(this->manager.get())) {
      EXPECT_TRUE(throws<NotSupported>([&] { adaptor->allocate(4096, cuda::CU_STREAM_PER_THREAD); },
                                       "no stream-ordered calls"));
    }
    EXPECT_EQ(dynamic_cast<PoolMemoryManager*>(this->manager.get()), nullptr) << "the pool has them";
    return;
  }
  cuemm::testing::LiveRanges live;
  std::atomic<int> lost{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(this->context);
      Stream stream = this->context.create_stream();
      std::mt19937 random(t + 11);
      std::vector<std::tuple<cuda::CUdeviceptr, std::size_t, unsigned char>> held;
      auto release = [&](std::size_t index) {
        const auto [block, size, mark] = held[index];
        std::vector<unsigned char> back(size);
        CUEMM_CU(cuMemcpyDtoHAsync, back.data(), block, size, stream.handle());
        stream.synchronize();
        if (std::count(back.begin(), back.end(), mark) != static_cast<long>(size)) ++lost;
        live.remove(block);
        ordered->deallocate(block, size, stream.handle());
        held.erase(held.begin() + static_cast<long>(index));
      };
      for (std::uint32_t step = 0; step < 100; ++step) {
        if (held.size() < 6 && random() % 3) {
          const std::size_t size =
              random() % 8 ? 256 + random() % (1 << 20) : (std::size_t{4} << 20) + random() % (8 << 20);
          const cuda::CUdeviceptr block = ordered->allocate(size, stream.handle());
          live.add(block, size);
          const auto mark = static_cast<unsigned char>(t * 40 + step);
          CUEMM_CU(cuMemsetD8Async, block, mark, size, stream.handle());
          held.emplace_back(block, size, mark);
        } else if (!held.empty()) {
          release(random() % held.size());
        }
      }
      while (!held.empty()) release(0);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(live.overlaps(), 0) << "a block was handed out while another overlapped it";
  EXPECT_EQ(lost, 0) << "a block lost what was written to it";
  this->expect_adaptors_count_nothing_in_use("after every stream-ordered block was freed");
}

// Each driver call failing once on the stream-ordered path, at its first,
// second or third use: the manager works after, the adaptors count only
// what is held, and a reset leaves nothing with the driver.
TYPED_TEST(Conformance, AnyDriverCallFailingOnTheStreamOrderedPathLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  if (!stream_ordered_allocator(*this->manager))
    GTEST_SKIP() << "this manager has no stream-ordered calls (the test before checks that a call says so)";
  this->manager.reset();
  this->context.deallocations().flush_all();
  this->context.synchronize();
  auto baseline = simulation::device_bytes_in_use(0);
  for (const std::string function :
       {"cuMemAlloc", "cuMemFree", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemPoolCreate",
        "cuEventCreate", "cuEventRecord", "cuEventQuery", "cuStreamWaitEvent", "cuCtxSynchronize", "cuMemCreate",
        "cuMemMap", "cuMemSetAccess"}) {
    for (std::uint64_t nth = 1; nth <= 3; ++nth) {
      SCOPED_TRACE(function + " failing at call " + std::to_string(nth));
      {
        auto manager = TypeParam::make(&this->context);
        StreamOrderedAllocator* ordered = stream_ordered_allocator(*manager);
        ASSERT_NE(ordered, nullptr);
        Stream stream = this->context.create_stream();
        std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> held;
        simulation::inject_fault(function, nth, cuda::CUDA_ERROR_UNKNOWN);
        try {
          manager->initialize();
          for (int i = 0; i < 40; ++i) {
            const std::size_t size = std::size_t{1} << (8 + i % 16);  // 256 B to 8 MiB
            held.emplace_back(ordered->allocate(size, stream.handle()), size);
            if (i % 3 == 0) {
              ordered->deallocate(held.front().first, held.front().second, stream.handle());
              held.erase(held.begin());
            }
          }
        } catch (const Error&) {
          // Whatever failed said so with an exception; the checks below matter.
        }
        simulation::clear_faults();
        for (const auto& [block, size] : held) ordered->deallocate(block, size, stream.handle());
        held.clear();
        this->manager.swap(manager);  // (for the adaptors' counts)
        this->expect_adaptors_count_nothing_in_use("after the blocks held were freed");
        this->manager.swap(manager);
        const cuda::CUdeviceptr block = ordered->allocate(1 << 20, stream.handle());
        CUEMM_CU(cuMemsetD8Async, block, 0x5a, 1 << 20, stream.handle());
        unsigned char last = 0;
        CUEMM_CU(cuMemcpyDtoHAsync, &last, block + (1 << 20) - 1, 1, stream.handle());
        stream.synchronize();
        EXPECT_EQ(last, 0x5a);
        ordered->deallocate(block, 1 << 20, stream.handle());
        stream.synchronize();
        manager->reset();
      }
      this->context.deallocations().flush_all();
      this->context.synchronize();
      if (function.starts_with("cuMemFree")) {  // the driver kept what it refused to free
        baseline = simulation::device_bytes_in_use(0);
        continue;
      }
      EXPECT_EQ(simulation::device_bytes_in_use(0), baseline) << "device memory leaked";
    }
  }
}

// Each host allocation that the manager makes on a short workload fails in
// turn with std::bad_alloc, as where the process runs out of memory: each
// call throws or completes (none ends the program from a noexcept path),
// and after it the manager works, the adaptors count only what is held, and
// a reset leaves nothing with the driver.
TYPED_TEST(Conformance, AnyHostAllocationFailingLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");  // (the leak checks read the driver's counts; the fault spares its own allocations)
  this->manager.reset();
  const auto before = this->driver_holdings();
  std::uint64_t nth = 1;
  for (bool struck = true; struck; ++nth) {
    ASSERT_LT(nth, 20000u) << "the workload makes more allocations than a run of this test can fail in turn";
    SCOPED_TRACE("host allocation " + std::to_string(nth) + " failing");
    {
      auto manager = TypeParam::make(&this->context);
      StreamOrderedAllocator* ordered = stream_ordered_allocator(*manager);
      std::vector<std::shared_ptr<MemoryPointer>> held;
      held.reserve(48);
      std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> ordered_held;
      ordered_held.reserve(16);
      auto buffer = std::make_shared<std::vector<char>>(std::size_t{64} << 10);
      std::string failed;
      // (Longer than a short string holds: the log's releases copy it.)
      ScopedCallSite site("AnyHostAllocationFailingLeavesNothingBehind, test_manager_conformance.cpp");
      {
        cuemm::testing::HostAllocationFault fault(nth);
        try {
          manager->initialize();
          for (int i = 0; i < 40; ++i) {  // 256 B to 8 MiB, and 20 MiB; freed oldest first and from the middle
            held.push_back(manager->memalloc(i % 9 == 8 ? std::size_t{20} << 20 : std::size_t{1} << (8 + i * 5 % 16)));
            if (i % 3 == 2) held.erase(held.begin());
            if (i % 7 == 6) held.erase(held.begin() + static_cast<long>(held.size() / 2));
          }
          {  // Small blocks past what a thread keeps, freed at once (its caches spill to the shared index).
            std::vector<std::shared_ptr<MemoryPointer>> burst;
            burst.reserve(300);
            for (int i = 0; i < 300; ++i) burst.push_back(manager->memalloc(std::size_t{256} << (i % 9)));
          }
          held.push_back(manager->memhostalloc(8192, nth % 2 == 1, false, false));
          for (int pinned = 0; pinned < 2; ++pinned) {  // (the second finds the first's range where a pool keeps it)
            manager->mempin(buffer, buffer->data(), buffer->size(), nth % 2 == 0).reset();
          }
          if (ordered) {
            for (int round = 0; round < 3; ++round) {
              for (std::size_t size : {std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20,
                                       std::size_t{6} << 20, std::size_t{20} << 20}) {
                ordered_held.emplace_back(ordered->allocate(size, cuda::CU_STREAM_PER_THREAD), size);
              }
              for (int freed = 0; freed < 4; ++freed) {
                const auto [block, size] = ordered_held[ordered_held.size() / 2];
                ordered_held.erase(ordered_held.begin() + static_cast<long>(ordered_held.size() / 2));
                ordered->deallocate(block, size, cuda::CU_STREAM_PER_THREAD);
              }
            }
          }
          (void)manager->get_memory_info();
          try {
            (void)manager->get_ipc_handle(held.front());
          } catch (const NotSupported&) {  // (the async manager's pool, unless made exportable)
          }
          // Blocks of another thread, freed here (a pool's frees for other threads).
          std::vector<std::shared_ptr<MemoryPointer>> theirs;
          std::thread([&] {
            ScopedContext scope(this->context);
            for (std::size_t size : {512, 4096, 65536, 2 << 20}) theirs.push_back(manager->memalloc(size));
          }).join();
          theirs.clear();
          held.erase(held.begin(), held.begin() + 2);
          held.clear();
          manager->reset();
        } catch (const std::bad_alloc&) {
          failed = "std::bad_alloc";
        } catch (const Error& error) {
          failed = error.what();  // (a message that could not be made is still an Error)
        }
        struck = fault.struck();
      }
      if (!struck) {
        EXPECT_EQ(failed, "") << "the workload failed though no allocation did";
      }
      for (const auto& [block, size] : ordered_held) ordered->deallocate(block, size, cuda::CU_STREAM_PER_THREAD);
      held.clear();
      this->expect_intact_once_all_freed(manager);
    }
    this->expect_nothing_left_since(before);
    if (::testing::Test::HasFailure()) break;  // (one allocation's failures say enough)
  }
  std::printf("[          ] %llu host allocations failed in turn\n", static_cast<unsigned long long>(nth - 2));
}

// The same on a thread other than the one that made the manager: each host
// allocation of that thread fails in turn, up to and through its end, where
// its caches go back to their owners. It allocates, frees its own blocks and
// the first thread's, hands blocks back, and pins; afterwards the first
// thread finds the manager working and nothing left with the driver.
TYPED_TEST(Conformance, AnyHostAllocationFailingOnAnotherThreadLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");  // (as the test before)
  this->manager.reset();
  const auto before = this->driver_holdings();
  std::uint64_t nth = 1;
  for (std::atomic<bool> struck{true}; struck; ++nth) {
    ASSERT_LT(nth, 20000u) << "the workload makes more allocations than a run of this test can fail in turn";
    SCOPED_TRACE("host allocation " + std::to_string(nth) + " of the other thread failing");
    {
      auto manager = TypeParam::make(&this->context);
      manager->initialize();
      StreamOrderedAllocator* ordered = stream_ordered_allocator(*manager);
      // The first thread's blocks, freed by the other; the other's, handed back.
      std::vector<std::shared_ptr<MemoryPointer>> given;
      for (std::size_t size : {256, 4096, 65536, 1 << 20, 3 << 20, 20 << 20}) given.push_back(manager->memalloc(size));
      std::vector<std::shared_ptr<MemoryPointer>> handed_back;
      handed_back.reserve(8);
      auto buffer = std::make_shared<std::vector<char>>(std::size_t{64} << 10);
      std::string failed;
      std::thread([&] {
        cuemm::testing::fail_host_allocation_until_thread_exit(nth, struck);
        std::vector<std::shared_ptr<MemoryPointer>> held;
        std::vector<std::pair<cuda::CUdeviceptr, std::size_t>> ordered_held;
        try {
          ScopedContext scope(this->context);
          ScopedCallSite site(
              "AnyHostAllocationFailingOnAnotherThreadLeavesNothingBehind, test_manager_conformance.cpp");
          held.reserve(48);
          ordered_held.reserve(16);
          for (int i = 0; i < 30; ++i) {  // 256 B to 8 MiB, and 20 MiB; freed oldest first and from the middle
            held.push_back(manager->memalloc(i % 9 == 8 ? std::size_t{20} << 20 : std::size_t{1} << (8 + i * 5 % 16)));
            if (i % 3 == 2) held.erase(held.begin());
            if (i % 7 == 6) held.erase(held.begin() + static_cast<long>(held.size() / 2));
          }
          {  // Past what a thread keeps, freed at once.
            std::vector<std::shared_ptr<MemoryPointer>> burst;
            burst.reserve(300);
            for (int i = 0; i < 300; ++i) burst.push_back(manager->memalloc(std::size_t{256} << (i % 9)));
          }
          given.clear();  // (the first thread's blocks, freed here)
          held.push_back(manager->memhostalloc(8192, nth % 2 == 1, false, false));
          manager->mempin(buffer, buffer->data(), buffer->size(), nth % 2 == 0).reset();
          if (ordered) {
            for (std::size_t size : {std::size_t{4096}, std::size_t{1} << 20, std::size_t{20} << 20})
              ordered_held.emplace_back(ordered->allocate(size, cuda::CU_STREAM_PER_THREAD), size);
          }
          for (std::size_t size : {512, 65536, 2 << 20}) handed_back.push_back(manager->memalloc(size));
          (void)manager->get_memory_info();
        } catch (const std::bad_alloc&) {
          failed = "std::bad_alloc";
        } catch (const Error& error) {
          failed = error.what();
        }
        // Still on this thread, the fault armed where it has not struck.
        for (const auto& [block, size] : ordered_held) ordered->deallocate(block, size, cuda::CU_STREAM_PER_THREAD);
        held.clear();
      }).join();  // (and the thread's end: its caches go back to their owners)
      if (!struck) {
        EXPECT_EQ(failed, "") << "the workload failed though no allocation did";
      }
      given.clear();
      handed_back.clear();
      this->expect_intact_once_all_freed(manager);
    }
    this->expect_nothing_left_since(before);
    if (::testing::Test::HasFailure()) break;  // (one allocation's failures say enough)
  }
  std::printf("[          ] %llu host allocations of the other thread failed in turn\n",
              static_cast<unsigned long long>(nth - 2));
}

TYPED_TEST(Conformance, DestroyingTheManagerReturnsItsMemory) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated");
  this->manager.reset();
  const auto baseline = simulation::device_bytes_in_use(0);
  {
    auto manager = TypeParam::make(&this->context);
    manager->initialize();
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 10; ++i) blocks.push_back(manager->memalloc(3 << 20));
    blocks.clear();
    manager->reset();
  }
  EXPECT_EQ(simulation::device_bytes_in_use(0), baseline);
}
