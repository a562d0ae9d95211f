// Allocate+free pairs through each manager, side by side with the driver's own
// cuMemAlloc/cuMemFree, from 1, 4 and 16 threads; and the pool with 64k free
// blocks against an empty one. Times are wall clock; with several threads,
// items_per_second is the aggregate throughput of all threads together.
//
//   bench_allocators --benchmark_filter=Pool --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <memory>
#include <mutex>

#include "cuemm/cuemm.hpp"

namespace {

cuemm::Context& context() {
  static cuemm::Context& current = cuemm::current_context();
  return current;
}

template <typename Manager>
Manager& shared_manager() {
  static Manager* manager = [] {
    auto* made = new Manager(&context());  // shared by every thread of a run; lives until exit
    made->initialize();
    return made;
  }();
  return *manager;
}

void set_sizes(benchmark::internal::Benchmark* benchmark) {
  for (long size : {256L, 64L << 10, 1L << 20, 4L << 20, 64L << 20}) benchmark->Arg(size);
  benchmark->ThreadRange(1, 16)->UseRealTime();
}

template <typename Manager>
void AllocateFree(benchmark::State& state) {
  Manager& manager = shared_manager<Manager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    auto memory = manager.memalloc(size);
    benchmark::DoNotOptimize(memory->device_pointer());
  }
  state.SetItemsProcessed(state.iterations());
}

// The pool's raw interface (no MemoryPointer), comparable to PyTorch's
// raw_alloc/raw_delete and RMM's allocate/deallocate.
void PoolRawAllocateFree(benchmark::State& state) {
  auto& pool = shared_manager<cuemm::PoolMemoryManager>();
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    const cuemm::cuda::CUdeviceptr pointer = pool.allocate(size);
    benchmark::DoNotOptimize(pointer);
    pool.deallocate(pointer, size);
  }
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

// Page-locked host memory: the pinned host pool against cuMemHostAlloc/cuMemFreeHost.
void PinnedHostPoolAllocateFree(benchmark::State& state) {
  static auto* pool = new cuemm::PinnedHostPool(context());
  cuemm::ScopedContext scope(context());
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    auto memory = pool->allocate(size, false, false, false);
    benchmark::DoNotOptimize(memory->host_pointer());
  }
  state.SetItemsProcessed(state.iterations());
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

}  // namespace

BENCHMARK(DriverMemHostAllocFree)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(PinnedHostPoolAllocateFree)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(DriverMemAllocFree)->Arg(256)->Arg(1 << 20)->Arg(64 << 20)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK_TEMPLATE(AllocateFree, cuemm::DefaultMemoryManager)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, cuemm::PoolMemoryManager)->Apply(set_sizes);
BENCHMARK_TEMPLATE(AllocateFree, cuemm::AsyncMemoryManager)->Apply(set_sizes);
BENCHMARK(PoolRawAllocateFree)->Apply(set_sizes);
BENCHMARK(PoolWithFreeBlocks)->Arg(0)->Arg(65536);

BENCHMARK_MAIN();
