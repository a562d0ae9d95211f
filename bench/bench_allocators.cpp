// Allocate+free pairs through each manager, side by side with the driver's own
// cuMemAlloc/cuMemFree and its stream-ordered pool, from 1, 4 and 16 threads;
// and the pool with 64k free blocks against an empty one. (PyTorch's caching
// allocator is in bench_torch_allocator.cpp, built where torch is.) Times are wall clock; with several threads,
// items_per_second is the aggregate throughput of all threads together.
//
//   bench_allocators --benchmark_filter=Pool --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>
#include <vector>

#include "benchmark_sizes.hpp"
#include "hand_over.hpp"
#include "cuemm/cuemm.hpp"

namespace {

cuemm::Context& context() {
  static cuemm::Context& current = cuemm::current_context();
  return current;
}

// The managers that live for the whole process keep what their last run left
// (16 threads of 64 MiB pairs leave up to 2 GiB each in a pool), which another
// manager's benchmarks cannot take: on a 16 GiB simulated device the async
// manager's ran out after the pool's. So whenever the benchmarks move on to
// another manager (each registration's Setup names its own), every one of
// them gives back the memory it holds idle.
std::vector<std::function<void()>>& idle_memory_givers() {
  static auto* givers = new std::vector<std::function<void()>>();  // lives until exit
  return *givers;
}
const void* current_manager_kind = nullptr;
struct NoSharedManager {};  // the driver alone, or a manager of the benchmark's own
struct DriverPool {};       // the driver's stream-ordered pool, driver_pool()

template <typename Kind>
void benchmarks_of(const benchmark::State&) {
  static const char kind = 0;  // one address per kind
  if (current_manager_kind == &kind) return;
  current_manager_kind = &kind;
  for (const auto& give_back : idle_memory_givers()) give_back();
}

// The pool inside a manager that is one or wraps one (an adaptor over the pool), or null.
template <typename Manager>
cuemm::PoolMemoryManager* pool_of(Manager& manager) {
  if constexpr (std::is_base_of_v<cuemm::PoolMemoryManager, Manager>)
    return &manager;
  else if constexpr (std::is_base_of_v<cuemm::ManagerAdaptor, Manager>)
    return dynamic_cast<cuemm::PoolMemoryManager*>(&manager.upstream());
  else
    return nullptr;
}

template <typename Manager>
Manager& shared_manager() {
  static Manager* manager = [] {
    auto* made = new Manager(&context());  // shared by every thread of a run; lives until exit
    made->initialize();
    if constexpr (std::is_same_v<Manager, cuemm::AsyncMemoryManager>)
      idle_memory_givers().push_back([made] { made->trim(); });
    else if (cuemm::PoolMemoryManager* pool = pool_of(*made))
      idle_memory_givers().push_back([pool] { pool->trim(); });
    return made;
  }();
  return *manager;
}

// Stream queries (seals) per 1000 pairs of all threads, as the pool's
// statistics count them: what its stream-less interface pays for reuse.
// Counted by the first thread around its own loop.
void count_seals(benchmark::State& state, std::size_t seals_before, std::size_t seals_after) {
  if (state.thread_index() != 0 || state.iterations() == 0) return;
  const double pairs = static_cast<double>(state.iterations()) * state.threads();
  state.counters["seals_per_1000_pairs"] = 1000.0 * static_cast<double>(seals_after - seals_before) / pairs;
}

// Runs `round` (`per_round` operations each) untimed until `purchases()`, a
// count of what the allocator bought, has stayed the same for `window`
// operations, or `limit` has passed; returns the operations run.
template <typename Purchases, typename Round>
std::size_t warm_up_until_still(Purchases purchases, Round round, std::size_t per_round, std::size_t window,
                                std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::size_t operations = 0, since_purchase = 0;
  for (auto bought = purchases(); since_purchase < window && std::chrono::steady_clock::now() < deadline;) {
    round();
    operations += per_round;
    since_purchase += per_round;
    if (const auto now = purchases(); now != bought) {
      bought = now;
      since_purchase = 0;
    }
  }
  return operations;
}

// Untimed pairs from each thread before its timed loop, until the pool bought
// no block from the driver while this thread ran a window of them (at most
// 10 s): a thread's rotation of large blocks grows by a block as its seals
// pay for one, and its rings' share of the index by a segment, so a short
// timed loop would otherwise hold purchases (a 64 MiB cuMemAlloc: 0.1-0.2 ms,
// one at a time in the driver) beside the pairs. Google Benchmark starts new
// threads for every run; they take over the blocks the last run's gave back.
// (`cuemm bench` warms its cells up the same way.)
template <typename Pair>
void warm_up_until_the_pool_stops_buying(const cuemm::PoolMemoryManager& pool, Pair&& pair) {
  constexpr std::size_t kChunk = 1'000;
  constexpr std::size_t kWindow = 50'000;  // more pairs than one purchase's worth of seals at 1 MiB
  warm_up_until_still(
      [&] { return pool.statistics().driver_allocations; },
      [&] {
        for (std::size_t i = 0; i < kChunk; ++i) pair();
      },
      kChunk, kWindow, std::chrono::seconds(10));
}

template <typename Manager>
void AllocateFree(benchmark::State& state) {
  Manager& manager = shared_manager<Manager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  const cuemm::PoolMemoryManager* pool = pool_of(manager);
  if (pool) warm_up_until_the_pool_stops_buying(*pool, [&] { benchmark::DoNotOptimize(manager.memalloc(size)); });
  const std::size_t seals_before = pool ? pool->statistics().seals : 0;
  for (auto _ : state) {
    auto memory = manager.memalloc(size);
    benchmark::DoNotOptimize(memory->device_pointer());
  }
  // (So that a cell slower than usual shows whether its pool sealed more.)
  if (pool) count_seals(state, seals_before, pool->statistics().seals);
  state.SetItemsProcessed(state.iterations());
}

// A dedicated size larger than any request (`CUEMM_POOL_DEDICATED_SIZE=1T`):
// large blocks in the shared segments, the pool's choice for speed where
// large sizes vary.
constexpr std::size_t kNoDedicatedSegments = std::size_t{1} << 40;

// The pool's options from the environment, with `Dedicated` as its dedicated
// size where that is not 0.
template <std::size_t Dedicated>
cuemm::PoolOptions pool_options() {
  cuemm::PoolOptions options = cuemm::PoolOptions::from_environment();
  if (Dedicated != 0) options.dedicated_size = Dedicated;
  return options;
}

// RMM's random-allocations workload through a manager's memalloc (ns per
// allocation or free). The pool is one of its own (`Dedicated`: its
// dedicated size; 0, the default), since no trim() lowers the peak footprint
// up to which it keeps spares; with its driver calls an operation and its
// peak reserved over peak live.
template <typename Manager, std::size_t Dedicated = 0>
void RandomAllocations(benchmark::State& state) {
  cuemm::ScopedContext scope(context());
  auto release = [](std::shared_ptr<cuemm::MemoryPointer>& memory) { memory.reset(); };
  if constexpr (!std::is_same_v<Manager, cuemm::PoolMemoryManager>) {
    static_assert(Dedicated == 0, "a dedicated size is the pool's");
    Manager& manager = shared_manager<Manager>();
    run_random_workload<std::shared_ptr<cuemm::MemoryPointer>>(
        state, [&](std::size_t size) { return manager.memalloc(size); }, release, [&] {
          if constexpr (std::is_same_v<Manager, cuemm::AsyncMemoryManager>) manager.trim();
        });
  } else {
    cuemm::PoolMemoryManager pool(&context(), pool_options<Dedicated>());
    pool.initialize();
    auto allocate = [&](std::size_t size) { return pool.memalloc(size); };
    auto driver_calls = [&] {
      const cuemm::PoolStatistics statistics = pool.statistics();
      return statistics.driver_allocations + statistics.driver_frees;
    };
    run_untimed_pass<std::shared_ptr<cuemm::MemoryPointer>>(state, allocate, release, [] {});  // the warm-up
    const std::size_t calls_before = driver_calls();
    time_random_workload<std::shared_ptr<cuemm::MemoryPointer>>(state, allocate, release);
    state.counters["driver_calls_per_operation"] =
        static_cast<double>(driver_calls() - calls_before) /
        static_cast<double>(state.iterations() * random_workload_of(state).size());
    // A new pool, sampled after every operation (as `cuemm random`): the pool keeps no high-water mark.
    std::optional<cuemm::PoolMemoryManager> fresh;
    std::size_t peak = 0;
    report_random_workload_memory<std::shared_ptr<cuemm::MemoryPointer>>(
        state,
        [&](std::size_t size) {
          auto memory = fresh->memalloc(size);
          peak = std::max(peak, fresh->statistics().reserved_bytes);
          return memory;
        },
        [&](std::shared_ptr<cuemm::MemoryPointer>& memory) {
          memory.reset();
          peak = std::max(peak, fresh->statistics().reserved_bytes);
        },
        [&] {
          fresh.emplace(&context(), pool_options<Dedicated>());
          fresh->initialize();
        },
        [&] {
          fresh.reset();
          return peak;
        });
  }
}

// The pool under the statistics adaptor, as the Numba bridge runs it: what
// leaving statistics on costs.
struct PoolWithStatistics : cuemm::StatisticsAdaptor {
  explicit PoolWithStatistics(cuemm::Context* context)
      : StatisticsAdaptor(context, std::make_unique<cuemm::PoolMemoryManager>(context)) {}
};

// The pool under the limit adaptor (a cap it never reaches) and under the
// tracking adaptor: what a cap, and a record of every live block, cost, and
// how they scale with threads (docs/pool-measurements.md, "Threads without
// the caches, and the adaptors' shared counts").
struct PoolWithLimit : cuemm::LimitingAdaptor {
  explicit PoolWithLimit(cuemm::Context* context)
      : LimitingAdaptor(context, std::make_unique<cuemm::PoolMemoryManager>(context), std::size_t{1} << 40) {}
};
struct PoolWithTracking : cuemm::TrackingAdaptor {
  explicit PoolWithTracking(cuemm::Context* context)
      : TrackingAdaptor(context, std::make_unique<cuemm::PoolMemoryManager>(context)) {}
};

// The pool's raw interface (no MemoryPointer), comparable to PyTorch's
// raw_alloc/raw_delete and RMM's allocate/deallocate.
void PoolRawAllocateFree(benchmark::State& state) {
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  warm_up_until_the_pool_stops_buying(pool, [&] { pool.deallocate(pool.allocate(size), size); });
  const std::size_t seals_before = pool.statistics().seals;
  for (auto _ : state) {
    const cuemm::cuda::CUdeviceptr pointer = pool.allocate(size);
    benchmark::DoNotOptimize(pointer);
    pool.deallocate(pointer, size);
  }
  count_seals(state, seals_before, pool.statistics().seals);
  state.SetItemsProcessed(state.iterations());
}

// 16 threads over one, alternated: rounds in which the first of 16 threads
// runs pairs alone and then all 16 run them at once, on one pool, and the
// median over the rounds of the ratio of their aggregate throughput to the
// lone thread's. The H100 host's pair is bimodal over time
// (docs/pool-measurements.md), so cells timed minutes apart (the 1- and
// 16-thread runs of PoolRawAllocateFree) may catch it in different modes;
// rounds side by side see both. Counters: the ratio's median, lowest and
// highest; the lone thread's and the 16 threads' ns a pair (medians).
void PoolScalingAlternated(benchmark::State& state) {
  constexpr int kThreads = 16;
  constexpr int kRounds = 9;
  constexpr std::size_t kPairs = 500'000;  // each thread's, each phase: milliseconds on the H100
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  const auto size = static_cast<std::size_t>(state.range(0));
  auto pairs = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) pool.deallocate(pool.allocate(size), size);
  };
  // Phases: the workers wait at `start`; `alone` says whether only the
  // first runs; each arrives at `finished` when done (the rest at once).
  std::barrier start(kThreads + 1), finished(kThreads + 1);
  bool alone = false, stop = false;
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      cuemm::ScopedContext scope(context());
      warm_up_until_the_pool_stops_buying(pool, [&] { pairs(1); });
      for (;;) {
        start.arrive_and_wait();
        if (stop) return;
        if (!alone || t == 0) pairs(kPairs);
        finished.arrive_and_wait();
      }
    });
  }
  // The time of one phase, ns a pair in aggregate.
  auto phase = [&](bool only_the_first) {
    alone = only_the_first;
    start.arrive_and_wait();
    const auto began = std::chrono::steady_clock::now();
    finished.arrive_and_wait();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - began).count();
    return ns / static_cast<double>(kPairs * (only_the_first ? 1 : kThreads));
  };
  std::vector<double> ratios, lone, together;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      lone.push_back(phase(true));
      together.push_back(phase(false));
      ratios.push_back(lone.back() / together.back());
    }
  }
  stop = true;
  start.arrive_and_wait();
  for (auto& worker : workers) worker.join();
  auto median = [](std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  };
  state.counters["ratio_median"] = median(ratios);
  state.counters["ratio_lowest"] = *std::min_element(ratios.begin(), ratios.end());
  state.counters["ratio_highest"] = *std::max_element(ratios.begin(), ratios.end());
  state.counters["one_thread_ns"] = median(lone);
  state.counters["sixteen_threads_ns"] = median(together);
}

// The same, stream-ordered on `stream`: each thread's per-thread default
// stream (PoolStreamOrderedAllocateFree, as the driver's pool below, and
// PyTorch's on its current stream), or a stream of its own
// (PoolOwnStreamAllocateFree): a freed block is reused at once by the same
// stream.
void pool_stream_ordered_pairs(benchmark::State& state, cuemm::cuda::CUstream stream) {
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  warm_up_until_the_pool_stops_buying(pool, [&] { pool.deallocate(pool.allocate(size, stream), size, stream); });
  for (auto _ : state) {
    const cuemm::cuda::CUdeviceptr pointer = pool.allocate(size, stream);
    benchmark::DoNotOptimize(pointer);
    pool.deallocate(pointer, size, stream);
  }
  CUEMM_CU(cuStreamSynchronize, stream);
  state.SetItemsProcessed(state.iterations());
}

void PoolStreamOrderedAllocateFree(benchmark::State& state) {
  pool_stream_ordered_pairs(state, cuemm::cuda::CU_STREAM_PER_THREAD);
}

// The same through an adaptor over the pool: what observing a stream-ordered
// pair costs (the adaptor's record of its blocks, Note [Stream-ordered blocks
// of an adaptor], and its observer), beside the pool's own row.
template <typename Adaptor>
void AdaptorStreamOrderedAllocateFree(benchmark::State& state) {
  auto& adaptor = shared_manager<Adaptor>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  const auto stream = cuemm::cuda::CU_STREAM_PER_THREAD;
  warm_up_until_the_pool_stops_buying(*pool_of(adaptor), [&] {
    adaptor.deallocate(adaptor.allocate(size, stream), size, stream);
  });
  for (auto _ : state) {
    const cuemm::cuda::CUdeviceptr pointer = adaptor.allocate(size, stream);
    benchmark::DoNotOptimize(pointer);
    adaptor.deallocate(pointer, size, stream);
  }
  state.SetItemsProcessed(state.iterations());
}

// What one seal costs on this host: the pools make a freed block reusable
// after a query of the legacy stream (Note [Stream-safe reuse]), one per
// batch of frees, so it sets their large pairs' cost. From 16 threads at
// once: whether the driver answers queries side by side (the time is per
// query of all threads together).
void DriverLegacyStreamQuery(benchmark::State& state) {
  cuemm::ScopedContext scope(context());
  for (auto _ : state) benchmark::DoNotOptimize(CUEMM_CU_RESULT(cuStreamQuery, cuemm::cuda::CU_STREAM_LEGACY));
  state.SetItemsProcessed(state.iterations());
}

// The same query once this many threads have used their per-thread default
// stream and ended, 1 then 1000 (registered last, as it may leave the driver
// slower for whatever runs after it). If the driver kept such streams, every
// seal would pay for threads long gone, as the simulated driver's queries
// once did. (1, not 0: a process that has never started a thread runs
// libstdc++'s single-threaded paths, 2.3x faster queries on the simulated driver.)
void DriverLegacyStreamQueryAfterThreadsEnded(benchmark::State& state) {
  static std::int64_t ended = 0;  // in this process so far
  for (; ended < state.range(0); ++ended) {
    std::thread([] {
      cuemm::ScopedContext scope(context());
      CUEMM_CU_RESULT(cuStreamQuery, cuemm::cuda::CU_STREAM_PER_THREAD);
    }).join();
  }
  cuemm::ScopedContext scope(context());
  for (auto _ : state) benchmark::DoNotOptimize(CUEMM_CU_RESULT(cuStreamQuery, cuemm::cuda::CU_STREAM_LEGACY));
  state.SetItemsProcessed(state.iterations());
}

void DriverMemAllocFree(benchmark::State& state) {
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    cuemm::cuda::CUdeviceptr pointer = 0;
    CUEMM_CU(cuMemAlloc, &pointer, size);
    CUEMM_CU(cuMemFree, pointer);
  }
  state.SetItemsProcessed(state.iterations());
}

// The driver's stream-ordered pool as CUDA programs use it: release threshold
// at its maximum (nothing goes back to the driver), each thread on its
// per-thread default stream.
cuemm::cuda::CUmemoryPool driver_pool() {
  static cuemm::cuda::CUmemoryPool pool = [] {
    cuemm::ScopedContext scope(context());
    cuemm::cuda::CUmemPoolProps properties{};
    properties.alloc_type = cuemm::cuda::CU_MEM_ALLOCATION_TYPE_PINNED;
    properties.location = {cuemm::cuda::CU_MEM_LOCATION_TYPE_DEVICE, context().device().id()};
    cuemm::cuda::CUmemoryPool made = nullptr;
    CUEMM_CU(cuMemPoolCreate, &made, &properties);
    std::uint64_t threshold = UINT64_MAX;
    CUEMM_CU(cuMemPoolSetAttribute, made, cuemm::cuda::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    idle_memory_givers().push_back([made] {
      cuemm::ScopedContext scope(context());
      CUEMM_CU(cuMemPoolTrimTo, made, 0);
    });
    return made;  // lives until exit
  }();
  return pool;
}

void driver_pool_pairs(benchmark::State& state, cuemm::cuda::CUstream stream) {
  const cuemm::cuda::CUmemoryPool pool = driver_pool();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    cuemm::cuda::CUdeviceptr pointer = 0;
    CUEMM_CU(cuMemAllocFromPoolAsync, &pointer, size, pool, stream);
    CUEMM_CU(cuMemFreeAsync, pointer, stream);
  }
  CUEMM_CU(cuStreamSynchronize, stream);
  state.SetItemsProcessed(state.iterations());
}

void DriverPoolAllocateFree(benchmark::State& state) { driver_pool_pairs(state, cuemm::cuda::CU_STREAM_PER_THREAD); }

// The async manager's stream-ordered pairs on the same stream: beside the
// row above, what its record of live blocks (which checks every free) adds
// to the driver's pool.
void AsyncStreamOrderedAllocateFree(benchmark::State& state) {
  auto& manager = shared_manager<cuemm::AsyncMemoryManager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    const cuemm::cuda::CUdeviceptr pointer = manager.allocate(size, cuemm::cuda::CU_STREAM_PER_THREAD);
    benchmark::DoNotOptimize(pointer);
    manager.deallocate(pointer, size, cuemm::cuda::CU_STREAM_PER_THREAD);
  }
  CUEMM_CU(cuStreamSynchronize, cuemm::cuda::CU_STREAM_PER_THREAD);
  state.SetItemsProcessed(state.iterations());
}

// On the legacy stream, where the async manager's stream-less requests go:
// beside the manager's row, what the manager itself adds to the driver's pool.
void DriverPoolLegacyStreamAllocateFree(benchmark::State& state) {
  driver_pool_pairs(state, cuemm::cuda::CU_STREAM_LEGACY);
}

// A stream the benchmark's thread made (each thread its own, as a program's
// worker threads), kept for the thread's later benchmarks.
cuemm::cuda::CUstream stream_of_this_thread() {
  thread_local cuemm::Stream made = [] {
    cuemm::ScopedContext scope(context());
    return context().create_stream(true);
  }();
  return made.handle();
}

// Stream-ordered pairs on a stream of the program's rather than a default
// one: the driver's pool, and the pool, whose thread keeps its frees on the
// stream for its next requests there (Note [Same-stream reuse]; each request
// and free asks the driver for the stream's id and whether it is captured).
void DriverPoolOwnStreamAllocateFree(benchmark::State& state) { driver_pool_pairs(state, stream_of_this_thread()); }

void PoolOwnStreamAllocateFree(benchmark::State& state) { pool_stream_ordered_pairs(state, stream_of_this_thread()); }

// The same workload through the driver's pool, on the thread's per-thread
// default stream, from an empty pool, with the pool's high-water mark of
// reserved bytes.
void DriverPoolRandomAllocations(benchmark::State& state) {
  const cuemm::cuda::CUmemoryPool pool = driver_pool();
  cuemm::ScopedContext scope(context());
  auto allocate = [&](std::size_t size) {
    cuemm::cuda::CUdeviceptr pointer = 0;
    CUEMM_CU(cuMemAllocFromPoolAsync, &pointer, size, pool, cuemm::cuda::CU_STREAM_PER_THREAD);
    return pointer;
  };
  auto release = [](cuemm::cuda::CUdeviceptr pointer) {
    CUEMM_CU(cuMemFreeAsync, pointer, cuemm::cuda::CU_STREAM_PER_THREAD);
  };
  run_random_workload<cuemm::cuda::CUdeviceptr>(state, allocate, release, [&] {
    CUEMM_CU(cuStreamSynchronize, cuemm::cuda::CU_STREAM_PER_THREAD);
    CUEMM_CU(cuMemPoolTrimTo, pool, 0);
  });
  CUEMM_CU(cuStreamSynchronize, cuemm::cuda::CU_STREAM_PER_THREAD);
  report_random_workload_memory<cuemm::cuda::CUdeviceptr>(
      state, allocate, release,
      [&] {
        CUEMM_CU(cuMemPoolTrimTo, pool, 0);
        std::uint64_t zero = 0;  // (setting the mark resets it)
        CUEMM_CU(cuMemPoolSetAttribute, pool, cuemm::cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
      },
      [&] {
        CUEMM_CU(cuStreamSynchronize, cuemm::cuda::CU_STREAM_PER_THREAD);
        std::uint64_t high = 0;
        CUEMM_CU(cuMemPoolGetAttribute, pool, cuemm::cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
        return static_cast<std::size_t>(high);
      });
}

// Allocation between kernels: on each of 4 streams in turn (one per
// iteration), allocate a block, launch a kernel that fills it, free it; the streams run concurrently and
// nothing waits but the allocators. This is where stream safety costs: the
// pool and async managers must not hand a block out again while a kernel may
// still write it; cuMemFree waits for the device.
struct KernelStreams {
  cuemm::Module module = context().load_module(read_file(CUEMM_BENCH_KERNELS_PTX));
  cuemm::Function fill = module.function("cuemm_fill_u32");
  cuemm::Function spin_fill = module.function("cuemm_spin_fill_u32");
  std::vector<cuemm::Stream> streams;
  const cuemm::Stream legacy = cuemm::Stream::legacy_default();
  KernelStreams() {
    for (int i = 0; i < 4; ++i) streams.push_back(context().create_stream());
  }
  static std::string read_file(const char* path) {
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  }
  // Fills the block; with `spin_ns`, first keeps the GPU busy that long (a
  // layer's compute, say). (The simulated driver's kernels write every byte
  // on the host: there, the CI's smoke, only a block's first 4 KiB. A 4 MiB
  // fill took 12.6 ms a step, and the driver's pool's benchmark ran 15,767.)
  void launch(cuemm::cuda::CUdeviceptr pointer, std::size_t size, const cuemm::Stream& stream,
              std::uint64_t spin_ns = 0) const {
    const std::uint64_t count = (cuemm::simulation::active() ? std::min<std::size_t>(size, 4096) : size) / 4;
    const cuemm::Dim3 grid{static_cast<unsigned>(std::min<std::uint64_t>((count + 255) / 256, 1024))};
    if (spin_ns)
      spin_fill.launch(grid, {256}, stream, pointer, 7u, count, spin_ns);
    else
      fill.launch(grid, {256}, stream, pointer, 7u, count);
  }
  void synchronize() {
    for (auto& stream : streams) stream.synchronize();
    legacy.synchronize();
  }
};

KernelStreams& kernel_streams() {
  static auto* made = new KernelStreams();  // lives until exit
  return *made;
}

// One allocate + launch + free a step (`step(work, stream, size)`), on the
// kernel streams in turn, then the wait for them. With `with_legacy`, the
// legacy default stream takes the second stream's turns (after one of the
// program's, whose frees may hold the thread's ordered bins).
template <typename Step>
void on_kernel_streams(benchmark::State& state, Step&& step, bool with_legacy = false) {
  KernelStreams& work = kernel_streams();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  std::vector<const cuemm::Stream*> turns;
  for (const auto& stream : work.streams) turns.push_back(&stream);
  if (with_legacy) turns[1] = &work.legacy;
  std::size_t next = 0;
  for (auto _ : state) step(work, *turns[next++ % turns.size()], size);
  work.synchronize();
  state.SetItemsProcessed(state.iterations());
}

template <typename Manager>
void StreamsWithKernels(benchmark::State& state) {
  Manager& manager = shared_manager<Manager>();
  on_kernel_streams(state, [&](const KernelStreams& work, const cuemm::Stream& stream, std::size_t size) {
    auto memory = manager.memalloc(size);
    work.launch(memory->device_pointer(), size, stream);
  });
}

// The driver's stream-ordered pool used on each kernel's own stream: the
// stream orders reuse, so no allocator needs to wait.
void driver_pool_streams_with_kernels(benchmark::State& state, bool with_legacy) {
  const cuemm::cuda::CUmemoryPool pool = driver_pool();
  on_kernel_streams(
      state,
      [&](const KernelStreams& work, const cuemm::Stream& stream, std::size_t size) {
        cuemm::cuda::CUdeviceptr pointer = 0;
        CUEMM_CU(cuMemAllocFromPoolAsync, &pointer, size, pool, stream.handle());
        work.launch(pointer, size, stream);
        CUEMM_CU(cuMemFreeAsync, pointer, stream.handle());
      },
      with_legacy);
}
void DriverPoolStreamsWithKernels(benchmark::State& state) { driver_pool_streams_with_kernels(state, false); }
// The same with the legacy default stream as one of the four.
void DriverPoolLegacyAndStreamsWithKernels(benchmark::State& state) { driver_pool_streams_with_kernels(state, true); }

// The pool used the same way, stream-ordered (allocate(size, stream), as RMM
// and PyTorch call it): the thread keeps each stream's frees for that
// stream's next request, up to four streams (Note [Same-stream reuse]);
// before CUDA 12.5 they go to the quarantine, which the next seal's event
// covers (Note [Stream-ordered reuse]). Counts its seals.
void pool_stream_ordered_streams_with_kernels(benchmark::State& state, bool with_legacy) {
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  const std::size_t seals_before = pool.statistics().seals;
  on_kernel_streams(
      state,
      [&](const KernelStreams& work, const cuemm::Stream& stream, std::size_t size) {
        const cuemm::cuda::CUdeviceptr pointer = pool.allocate(size, stream.handle());
        work.launch(pointer, size, stream);
        pool.deallocate(pointer, size, stream.handle());
      },
      with_legacy);
  count_seals(state, seals_before, pool.statistics().seals);
}
void PoolStreamOrderedStreamsWithKernels(benchmark::State& state) { pool_stream_ordered_streams_with_kernels(state, false); }
// The same with the legacy default stream as one of the four (a thread's
// default-stream work beside streams of its own: Note [Same-stream reuse]).
void PoolStreamOrderedLegacyAndStreamsWithKernels(benchmark::State& state) {
  pool_stream_ordered_streams_with_kernels(state, true);
}

// A loop on one stream of the program's that keeps the GPU behind: allocate,
// launch a kernel that spins `spin` ns and fills the block, free, on the
// stream; ns an iteration, and the MiB the allocator reserved (a loop whose
// frees wait for the GPU grows while it runs behind, then waits).
template <typename Allocate, typename Release, typename Reserved>
void one_stream_loop(benchmark::State& state, Allocate&& allocate, Release&& release, Reserved&& reserved) {
  KernelStreams& work = kernel_streams();
  cuemm::ScopedContext scope(context());
  const cuemm::Stream& stream = work.streams[0];
  const auto size = static_cast<std::size_t>(state.range(0));
  const auto spin = static_cast<std::uint64_t>(state.range(1));
  for (auto _ : state) {
    const cuemm::cuda::CUdeviceptr pointer = allocate(size, stream.handle());
    work.launch(pointer, size, stream, spin);
    release(pointer, size, stream.handle());
  }
  stream.synchronize();
  state.counters["reserved_mib"] = static_cast<double>(reserved()) / double(1 << 20);
  state.SetItemsProcessed(state.iterations());
}

void PoolOneStreamLoopBesideKernels(benchmark::State& state) {
  cuemm::ScopedContext scope(context());
  cuemm::PoolMemoryManager pool(&context());
  pool.initialize();
  one_stream_loop(
      state, [&](std::size_t size, cuemm::cuda::CUstream stream) { return pool.allocate(size, stream); },
      [&](cuemm::cuda::CUdeviceptr pointer, std::size_t size, cuemm::cuda::CUstream stream) {
        pool.deallocate(pointer, size, stream);
      },
      [&] { return pool.statistics().reserved_bytes; });  // (a new pool: it gave nothing back)
}

void DriverPoolOneStreamLoopBesideKernels(benchmark::State& state) {
  const cuemm::cuda::CUmemoryPool pool = driver_pool();
  cuemm::ScopedContext scope(context());
  CUEMM_CU(cuCtxSynchronize);
  CUEMM_CU(cuMemPoolTrimTo, pool, 0);
  std::uint64_t zero = 0;
  CUEMM_CU(cuMemPoolSetAttribute, pool, cuemm::cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
  one_stream_loop(
      state,
      [&](std::size_t size, cuemm::cuda::CUstream stream) {
        cuemm::cuda::CUdeviceptr pointer = 0;
        CUEMM_CU(cuMemAllocFromPoolAsync, &pointer, size, pool, stream);
        return pointer;
      },
      [](cuemm::cuda::CUdeviceptr pointer, std::size_t, cuemm::cuda::CUstream stream) {
        CUEMM_CU(cuMemFreeAsync, pointer, stream);
      },
      [&] {
        std::uint64_t high = 0;
        CUEMM_CU(cuMemPoolGetAttribute, pool, cuemm::cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
        return static_cast<std::size_t>(high);  // (its high-water mark, reset above)
      });
}

// A workload of random_workload_of() with a kernel filling each new block,
// on 4 streams in turn, through a new manager (as a program meets it, not
// warmed by the benchmarks before): what a manager's driver calls and waits
// cost while kernels are queued, since `cuMemFree` waits for all of them
// (bench/probes/probe_free_stall.cpp). Each iteration is one pass and then
// the wait for its kernels, so a manager that makes the host wait for the
// GPU and one that overlaps them compare in wall time. With `spin_ns`, each
// kernel first keeps the GPU busy that long, so that work is queued ahead
// as in a training step. `Dedicated` is the pool's dedicated size (0: the
// manager's default).
template <typename Manager, std::size_t Dedicated>
void run_beside_kernels(benchmark::State& state, std::uint64_t spin_ns) {
  KernelStreams& work = kernel_streams();
  cuemm::ScopedContext scope(context());
  std::optional<Manager> manager;
  if constexpr (Dedicated != 0)
    manager.emplace(&context(), pool_options<Dedicated>());
  else
    manager.emplace(&context());
  manager->initialize();
  // The simulated driver's kernels write every byte on the host: there (the
  // CI's smoke) only the first operations run.
  const auto& workload = random_workload_of(state);
  const std::vector<cuemm::workload::RandomOperation> operations(
      workload.begin(), workload.begin() + static_cast<std::ptrdiff_t>(cuemm::simulation::active()
                                                                           ? std::min<std::size_t>(50, workload.size())
                                                                           : workload.size()));
  std::vector<std::shared_ptr<cuemm::MemoryPointer>> handles(operations.size());
  std::vector<bool> live(operations.size());
  std::size_t next = 0;
  auto allocate = [&](std::size_t size) {
    auto memory = manager->memalloc(size);
    work.launch(memory->device_pointer(), size, work.streams[next++ % work.streams.size()], spin_ns);
    return memory;
  };
  auto release = [](std::shared_ptr<cuemm::MemoryPointer>& memory) { memory.reset(); };
  for (auto _ : state) {
    run_operations(operations, handles, live, allocate, release);
    work.synchronize();
    state.PauseTiming();
    release_live(handles, live, release);
    state.ResumeTiming();
  }
  work.synchronize();
  if (const cuemm::PoolMemoryManager* pool = pool_of(*manager)) {
    const cuemm::PoolStatistics statistics = pool->statistics();
    state.counters["driver_calls_per_operation"] =
        static_cast<double>(statistics.driver_allocations + statistics.driver_frees) /
        static_cast<double>(state.iterations() * operations.size());
    state.counters["gpu_waits_avoided"] = static_cast<double>(statistics.gpu_waits_avoided);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(operations.size()));
}

template <typename Manager, std::size_t Dedicated = 0>
void RandomSizesBesideKernels(benchmark::State& state) {
  run_beside_kernels<Manager, Dedicated>(state, 0);
}

// Training steps (round sizes) whose every kernel first spins 20 us: the
// GPU has work queued whenever the host allocates, as in training, where a
// wait for the GPU (a `cuMemFree`, say) costs the lead the host had.
template <typename Manager, std::size_t Dedicated = 0>
void TrainingStepsBesideKernels(benchmark::State& state) {
  run_beside_kernels<Manager, Dedicated>(state, 20'000);
}

// The cost of a pair when the pool already holds `holes` free blocks.
void PoolWithFreeBlocks(benchmark::State& state) {
  cuemm::PoolMemoryManager pool(&context());
  pool.initialize();
  cuemm::ScopedContext scope(context());
  std::vector<std::shared_ptr<cuemm::MemoryPointer>> blocks;
  const auto holes = static_cast<std::size_t>(state.range(0));
  for (std::size_t i = 0; i < 2 * holes; ++i) blocks.push_back(pool.memalloc(4096));
  for (std::size_t i = 0; i < blocks.size(); i += 2) blocks[i].reset();  // every other block: not coalescable
  pool.trim();
  for (auto _ : state) {
    auto memory = pool.memalloc(4096);
    benchmark::DoNotOptimize(memory->device_pointer());
  }
  state.counters["free_blocks"] = static_cast<double>(pool.statistics().free_blocks);
  state.SetItemsProcessed(state.iterations());
}

// Untimed pairs of `size` until the pool has stopped buying blocks: a list of
// large blocks grows its rotation only as its seals pay for a block (about
// 100,000 seals at 64 MiB), so without this the timed loop of a short run
// would hold some of those purchases (50 ms each) and time the growth rather
// than a cached pair. Once for each size; the pairs it took are reported.
std::size_t warm_until_pool_stops_growing(cuemm::PinnedHostPool& pool, std::size_t size) {
  constexpr std::size_t kChunk = 10'000;
  constexpr std::size_t kPairsWithoutGrowth = 500'000;  // more than one purchase's worth of seals
  return warm_up_until_still(
      [&] { return pool.statistics().allocated_bytes; },
      [&] {
        for (std::size_t i = 0; i < kChunk; ++i) benchmark::DoNotOptimize(pool.allocate(size, false, false, false));
      },
      kChunk, kPairsWithoutGrowth, std::chrono::seconds(5));
}

// The timed loop of pinned pairs, and the seals they took.
void time_pinned_pairs(benchmark::State& state, cuemm::PinnedHostPool& pool, std::size_t size) {
  const std::size_t seals_before = pool.statistics().seals;
  for (auto _ : state) {
    auto memory = pool.allocate(size, false, false, false);
    benchmark::DoNotOptimize(memory->host_pointer());
  }
  count_seals(state, seals_before, pool.statistics().seals);
  state.SetItemsProcessed(state.iterations());
}

// Page-locked host memory: the pinned host pool against cuMemHostAlloc/cuMemFreeHost,
// in the steady state of a loop (see above).
void PinnedHostPoolAllocateFree(benchmark::State& state) {
  static auto* pool = new cuemm::PinnedHostPool(context());
  static std::map<std::size_t, std::size_t> warm_up_pairs;
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  if (!warm_up_pairs.contains(size)) warm_up_pairs[size] = warm_until_pool_stops_growing(*pool, size);
  state.counters["warm_up_pairs"] = static_cast<double>(warm_up_pairs[size]);
  time_pinned_pairs(state, *pool, size);
}

// The same from 1 and from 16 threads at once, each pairing on its own (as
// loader threads that stage through pinned buffers): whether they wait for
// each other. Each run's threads are new, their caches empty, so each warms
// up before timing. (Up to 1 MiB: 16 threads' rotations of 64 MiB blocks
// would pin gigabytes.)
void PinnedHostPoolScaling(benchmark::State& state) {
  static auto* pool = new cuemm::PinnedHostPool(context());
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  const std::size_t warm_up_pairs = warm_until_pool_stops_growing(*pool, size);
  if (state.thread_index() == 0) state.counters["warm_up_pairs"] = static_cast<double>(warm_up_pairs);
  time_pinned_pairs(state, *pool, size);
}

// Pinned staging buffers that a loader thread fills and another thread
// drops once it has copied them (hand_over.hpp), warmed up as above.
void PinnedHostPoolHandOver(benchmark::State& state) {
  static auto* pool = new cuemm::PinnedHostPool(context());
  static std::map<std::size_t, std::size_t> warm_up_blocks;
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  using Pinned = std::shared_ptr<cuemm::MemoryPointer>;
  const auto allocate = [&] { return pool->allocate(size, false, false, false); };
  const auto release = [](Pinned memory) { memory.reset(); };
  const auto prepare = [] { return cuemm::ScopedContext(context()); };
  // Untimed until a round buys no block: from cold, the pipeline's blocks
  // (up to three batches out, and the threads' fronts) cost 35 ms each at
  // 64 MiB, which a short timed run would take for its steady state.
  if (!warm_up_blocks.contains(size)) {
    constexpr std::size_t kRound = 2'000;
    warm_up_blocks[size] = warm_up_until_still(
        [&] { return pool->statistics().misses; },
        [&] { hand_over_blocks_untimed<Pinned>(kRound, allocate, release, prepare); }, kRound, kRound,
        std::chrono::seconds(5));
  }
  state.counters["warm_up_blocks"] = static_cast<double>(warm_up_blocks[size]);
  const cuemm::PinnedHostPoolStatistics before = pool->statistics();
  hand_over_blocks<Pinned>(state, allocate, release, prepare);
  const cuemm::PinnedHostPoolStatistics after = pool->statistics();
  count_seals(state, before.seals, after.seals);
  // Blocks bought (cuMemHostAlloc): 0.1-35 ms each on the GPU machines.
  state.counters["driver_allocations_per_1000_blocks"] =
      1000.0 * static_cast<double>(after.misses - before.misses) /
      static_cast<double>(std::max<std::int64_t>(state.iterations(), 1));
}

void DriverMemHostAllocFree(benchmark::State& state) {
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* pointer = nullptr;
    CUEMM_CU(cuMemHostAlloc, &pointer, size, 0u);
    CUEMM_CU(cuMemFreeHost, pointer);
  }
  state.SetItemsProcessed(state.iterations());
}

void PoolRawHandOver(benchmark::State& state) {
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  const cuemm::PoolStatistics before = pool.statistics();
  hand_over_blocks<cuemm::cuda::CUdeviceptr>(
      state, [&] { return pool.allocate(size); }, [&](cuemm::cuda::CUdeviceptr pointer) { pool.deallocate(pointer, size); },
      [] { return cuemm::ScopedContext(context()); });
  const cuemm::PoolStatistics after = pool.statistics();
  count_seals(state, before.seals, after.seals);
  state.counters["driver_calls_per_1000_blocks"] =
      1000.0 * static_cast<double>(after.driver_allocations + after.driver_frees - before.driver_allocations -
                                   before.driver_frees) / static_cast<double>(std::max<std::int64_t>(state.iterations(), 1));
}

// The same through memalloc, as Numba's arrays are made and dropped (their
// pointer objects too go from one thread to the other).
void PoolMemallocHandOver(benchmark::State& state) {
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  using Memory = std::shared_ptr<cuemm::MemoryPointer>;
  hand_over_blocks<Memory>(
      state, [&] { return pool.memalloc(size); }, [](Memory memory) { memory.reset(); },
      [] { return cuemm::ScopedContext(context()); });
}

// The driver's pool: each thread's per-thread default stream, so that the
// pool orders a block's reuse after the freeing stream's work itself.
void DriverPoolHandOver(benchmark::State& state) {
  const cuemm::cuda::CUmemoryPool pool = driver_pool();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  hand_over_blocks<cuemm::cuda::CUdeviceptr>(
      state,
      [&] {
        cuemm::cuda::CUdeviceptr pointer = 0;
        CUEMM_CU(cuMemAllocFromPoolAsync, &pointer, size, pool, cuemm::cuda::CU_STREAM_PER_THREAD);
        return pointer;
      },
      [](cuemm::cuda::CUdeviceptr pointer) { CUEMM_CU(cuMemFreeAsync, pointer, cuemm::cuda::CU_STREAM_PER_THREAD); },
      [] { return cuemm::ScopedContext(context()); });
  CUEMM_CU(cuStreamSynchronize, cuemm::cuda::CU_STREAM_PER_THREAD);
}

// No allocator: a loop over thread-private data only (xorshift into a small
// ring). 16 threads of it over one is the most that any allocator's scaling
// can reach on this host (a virtual machine's cores share more than they say).
void ThreadPrivateLoop(benchmark::State& state) {
  std::uint64_t x = 88172645463325252ull + static_cast<std::uint64_t>(state.thread_index());
  std::uint64_t ring[64] = {};
  std::size_t i = 0;
  for (auto _ : state) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ring[i++ & 63] += x;
    benchmark::DoNotOptimize(ring);
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(DriverMemHostAllocFree)->Setup(benchmarks_of<NoSharedManager>)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(PinnedHostPoolAllocateFree)->Setup(benchmarks_of<cuemm::PinnedHostPool>)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
// (Every size's lone thread first: on the simulated driver, a seal costs more once other threads have been.)
BENCHMARK(PinnedHostPoolScaling)->Setup(benchmarks_of<cuemm::PinnedHostPool>)->Arg(4096)->Arg(1 << 20)->UseRealTime()->Threads(1);
BENCHMARK(PinnedHostPoolScaling)->Setup(benchmarks_of<cuemm::PinnedHostPool>)->Arg(4096)->Arg(1 << 20)->UseRealTime()->Threads(16);
BENCHMARK(PinnedHostPoolHandOver)->Setup(benchmarks_of<cuemm::PinnedHostPool>)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(DriverMemAllocFree)->Setup(benchmarks_of<NoSharedManager>)->Arg(256)->Arg(1 << 20)->Arg(64 << 20)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK(DriverPoolAllocateFree)->Setup(benchmarks_of<DriverPool>)->Apply(set_sizes);
BENCHMARK(DriverPoolLegacyStreamAllocateFree)->Setup(benchmarks_of<DriverPool>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, cuemm::DefaultMemoryManager)->Setup(benchmarks_of<cuemm::DefaultMemoryManager>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, cuemm::PoolMemoryManager)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, cuemm::AsyncMemoryManager)->Setup(benchmarks_of<cuemm::AsyncMemoryManager>)->Apply(set_sizes);
BENCHMARK(AsyncStreamOrderedAllocateFree)->Setup(benchmarks_of<cuemm::AsyncMemoryManager>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, PoolWithStatistics)->Setup(benchmarks_of<PoolWithStatistics>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, PoolWithLimit)->Setup(benchmarks_of<PoolWithLimit>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, PoolWithTracking)->Setup(benchmarks_of<PoolWithTracking>)->Apply(set_sizes);
BENCHMARK(DriverLegacyStreamQuery)->Setup(benchmarks_of<NoSharedManager>)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(ThreadPrivateLoop)->Setup(benchmarks_of<NoSharedManager>)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(PoolRawAllocateFree)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Apply(set_sizes);
BENCHMARK(PoolStreamOrderedAllocateFree)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Apply(set_sizes);
BENCHMARK(DriverPoolOwnStreamAllocateFree)->Setup(benchmarks_of<DriverPool>)->Apply(set_sizes);
BENCHMARK(PoolOwnStreamAllocateFree)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AdaptorStreamOrderedAllocateFree, PoolWithStatistics)->Setup(benchmarks_of<PoolWithStatistics>)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AdaptorStreamOrderedAllocateFree, PoolWithLimit)->Setup(benchmarks_of<PoolWithLimit>)->Apply(set_sizes);
BENCHMARK(PoolScalingAlternated)
    ->Setup(benchmarks_of<cuemm::PoolMemoryManager>)
    ->Apply([](benchmark::internal::Benchmark* benchmark) {
      for (long size : kPairSizes) benchmark->Arg(size);
    })
    ->Iterations(1)
    ->Repetitions(1)  // (its rounds are its repetitions)
    ->UseRealTime();
BENCHMARK(DriverPoolHandOver)->Setup(benchmarks_of<DriverPool>)->Apply(set_hand_over_sizes);
BENCHMARK(PoolRawHandOver)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Apply(set_hand_over_sizes);
BENCHMARK(PoolMemallocHandOver)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Apply(set_hand_over_sizes);
BENCHMARK(PoolWithFreeBlocks)->Setup(benchmarks_of<NoSharedManager>)->Arg(0)->Arg(65536);
BENCHMARK(DriverPoolRandomAllocations)->Setup(benchmarks_of<DriverPool>)->Apply(set_random_workloads);
BENCHMARK_TEMPLATE(RandomAllocations, cuemm::DefaultMemoryManager)->Setup(benchmarks_of<cuemm::DefaultMemoryManager>)->Apply(set_random_workloads);
BENCHMARK_TEMPLATE(RandomAllocations, cuemm::AsyncMemoryManager)->Setup(benchmarks_of<cuemm::AsyncMemoryManager>)->Apply(set_random_workloads);
BENCHMARK_TEMPLATE(RandomAllocations, cuemm::PoolMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Apply(set_random_workloads);
BENCHMARK_TEMPLATE(RandomAllocations, cuemm::PoolMemoryManager, kNoDedicatedSegments)
    ->Setup(benchmarks_of<NoSharedManager>)
    ->Apply(set_random_workloads);
BENCHMARK_TEMPLATE(StreamsWithKernels, cuemm::DefaultMemoryManager)->Setup(benchmarks_of<cuemm::DefaultMemoryManager>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
BENCHMARK_TEMPLATE(StreamsWithKernels, cuemm::PoolMemoryManager)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
BENCHMARK_TEMPLATE(StreamsWithKernels, cuemm::AsyncMemoryManager)->Setup(benchmarks_of<cuemm::AsyncMemoryManager>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
BENCHMARK(DriverPoolStreamsWithKernels)->Setup(benchmarks_of<DriverPool>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
BENCHMARK(PoolStreamOrderedStreamsWithKernels)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
BENCHMARK(DriverPoolLegacyAndStreamsWithKernels)->Setup(benchmarks_of<DriverPool>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
BENCHMARK(PoolStreamOrderedLegacyAndStreamsWithKernels)->Setup(benchmarks_of<cuemm::PoolMemoryManager>)->Arg(64 << 10)->Arg(4 << 20)->UseRealTime();
// 20 us of the GPU's time an iteration: the host runs ahead until the launch queue is full.
BENCHMARK(DriverPoolOneStreamLoopBesideKernels)->Setup(benchmarks_of<DriverPool>)->Args({64 << 10, 20'000})->Args({4 << 20, 20'000})->Iterations(20'000)->UseRealTime();
BENCHMARK(PoolOneStreamLoopBesideKernels)->Setup(benchmarks_of<NoSharedManager>)->Args({64 << 10, 20'000})->Args({4 << 20, 20'000})->Iterations(20'000)->UseRealTime();
// Up to 64 MiB with 1 GiB live, a few passes (each launches about 5,000 kernels).
BENCHMARK_TEMPLATE(RandomSizesBesideKernels, cuemm::PoolMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Args({64L << 20, 1L << 30})->Iterations(2)->UseRealTime();
BENCHMARK_TEMPLATE(RandomSizesBesideKernels, cuemm::PoolMemoryManager, kNoDedicatedSegments)
    ->Setup(benchmarks_of<NoSharedManager>)
    ->Args({64L << 20, 1L << 30})->Iterations(2)->UseRealTime();
BENCHMARK_TEMPLATE(RandomSizesBesideKernels, cuemm::AsyncMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Args({64L << 20, 1L << 30})->Iterations(2)->UseRealTime();
constexpr long kTrainingRoundSizes = static_cast<long>(cuemm::workload::TrainingShapes::varied);
BENCHMARK_TEMPLATE(TrainingStepsBesideKernels, cuemm::PoolMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Args({0, kTrainingRoundSizes})->Iterations(2)->UseRealTime();
BENCHMARK_TEMPLATE(TrainingStepsBesideKernels, cuemm::PoolMemoryManager, kNoDedicatedSegments)
    ->Setup(benchmarks_of<NoSharedManager>)
    ->Args({0, kTrainingRoundSizes})->Iterations(2)->UseRealTime();
BENCHMARK_TEMPLATE(TrainingStepsBesideKernels, cuemm::AsyncMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Args({0, kTrainingRoundSizes})->Iterations(2)->UseRealTime();
// Each layer's sizes its own: the sizes the pool reuses least.
constexpr long kTrainingPerLayer = static_cast<long>(cuemm::workload::TrainingShapes::per_layer);
BENCHMARK_TEMPLATE(TrainingStepsBesideKernels, cuemm::PoolMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Args({0, kTrainingPerLayer})->Iterations(2)->UseRealTime();
BENCHMARK_TEMPLATE(TrainingStepsBesideKernels, cuemm::PoolMemoryManager, kNoDedicatedSegments)
    ->Setup(benchmarks_of<NoSharedManager>)
    ->Args({0, kTrainingPerLayer})->Iterations(2)->UseRealTime();
BENCHMARK_TEMPLATE(TrainingStepsBesideKernels, cuemm::AsyncMemoryManager)->Setup(benchmarks_of<NoSharedManager>)->Args({0, kTrainingPerLayer})->Iterations(2)->UseRealTime();

BENCHMARK(DriverLegacyStreamQueryAfterThreadsEnded)->Setup(benchmarks_of<NoSharedManager>)->Arg(1)->Arg(1000)->UseRealTime();

BENCHMARK_MAIN();
