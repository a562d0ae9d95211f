// The anchor cuemm's pool is measured against: PyTorch's CUDACachingAllocator
// through its C++ raw_alloc/raw_delete, with the same sizes and threads as
// bench_allocators. Built only where torch's C++ headers and libraries are
// (CUEMM_TORCH_DIR); scripts/gpu-check.sh runs it beside bench_allocators.
#include <benchmark/benchmark.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include "benchmark_sizes.hpp"
#include "hand_over.hpp"

namespace {

void TorchRawAllocFree(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* pointer = c10::cuda::CUDACachingAllocator::raw_alloc(size);
    benchmark::DoNotOptimize(pointer);
    c10::cuda::CUDACachingAllocator::raw_delete(pointer);
  }
  state.SetItemsProcessed(state.iterations());
}

// RMM's random-allocations workload (benchmark_sizes.hpp), then the
// allocator's own high-water mark of reserved bytes over one pass from empty.
void TorchRandomAllocations(benchmark::State& state) {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  auto allocate = [](std::size_t size) { return allocator::raw_alloc(size); };
  auto release = [](void* pointer) { allocator::raw_delete(pointer); };
  run_random_workload<void*>(state, allocate, release, [] { allocator::emptyCache(); });
  report_random_workload_memory<void*>(
      state, allocate, release,
      [] {
        allocator::emptyCache();
        allocator::resetPeakStats(0);
      },
      // reserved_bytes[0]: all pools together (StatType::AGGREGATE).
      [] { return static_cast<std::size_t>(allocator::getDeviceStats(0).reserved_bytes[0].peak); });
}

// Blocks one thread allocates and another frees (hand_over.hpp).
void TorchRawHandOver(benchmark::State& state) {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  const auto size = static_cast<std::size_t>(state.range(0));
  hand_over_blocks<void*>(
      state, [&] { return allocator::raw_alloc(size); }, [](void* pointer) { allocator::raw_delete(pointer); },
      [] { c10::cuda::set_device(0); return 0; });
}

}  // namespace

BENCHMARK(TorchRawAllocFree)->Apply(set_sizes);
BENCHMARK(TorchRawHandOver)->Apply(set_hand_over_sizes);
BENCHMARK(TorchRandomAllocations)->Apply(set_random_workloads);

int main(int argc, char** argv) {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  allocator::init(c10::cuda::device_count());
  // PyTorch makes its CUDA context and its pools' first segments at first
  // use: here, not in the first timed run (one repetition of 256-byte pairs
  // took about 0.1 s an iteration, and their median read 3.4-5.1 us).
  for (long size : kPairSizes) {
    for (int i = 0; i < 1000; ++i) allocator::raw_delete(allocator::raw_alloc(static_cast<std::size_t>(size)));
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
