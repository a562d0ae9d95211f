// The sizes, thread counts and workloads every allocator's benchmarks run, so
// that cuemm's managers and the anchors (bench_torch_allocator) line up. Thread
// counts are the ones RESULTS.md reports; 2 and 8 would add a third to the
// GPU check's time (which must fit one 10-minute call) and appear nowhere.
#pragma once

#include <benchmark/benchmark.h>

#include <array>
#include <map>
#include <vector>

#include "random_workload.hpp"

// The sizes of the allocate+free pairs.
inline constexpr std::array<long, 5> kPairSizes{256L, 64L << 10, 1L << 20, 4L << 20, 64L << 20};

inline void set_sizes(benchmark::internal::Benchmark* benchmark) {
  for (long size : kPairSizes) benchmark->Arg(size);
  benchmark->Threads(1)->Threads(4)->Threads(16)->UseRealTime();
}

// RMM's random-allocations workload, as `cuemm random` and scripts/gpu-check.sh
// run it for fragmentation: sizes up to 4 MiB within 512 MiB live, and up to
// 64 MiB within 1 GiB; 10,000 operations an iteration, one thread. Then the
// training-like workloads of `cuemm random --pattern training` (its default
// layers and steps; round sizes, and each layer's sizes its own), whose
// arguments are 0 and the shapes (cuemm::workload::TrainingShapes).
inline constexpr std::size_t kRandomOperations = 10'000;

inline void set_random_workloads(benchmark::internal::Benchmark* benchmark) {
  using cuemm::workload::TrainingShapes;
  benchmark->Args({4L << 20, 512L << 20})->Args({64L << 20, 1L << 30});
  benchmark->Args({0, static_cast<long>(TrainingShapes::varied)})->Args({0, static_cast<long>(TrainingShapes::per_layer)});
  benchmark->UseRealTime();
}

// The operations of that workload (seed 1).
inline const std::vector<cuemm::workload::RandomOperation>& random_workload_of(const benchmark::State& state) {
  namespace workload = cuemm::workload;
  static std::map<std::pair<long, long>, std::vector<workload::RandomOperation>> workloads;
  auto& operations = workloads[{state.range(0), state.range(1)}];
  if (!operations.empty()) return operations;
  if (state.range(0) == 0) {
    operations = workload::training_operations(workload::kTrainingLayers, workload::kTrainingSteps, 1,
                                               static_cast<workload::TrainingShapes>(state.range(1)));
  } else {
    operations = workload::random_operations(static_cast<std::size_t>(state.range(0)), kRandomOperations,
                                             static_cast<std::size_t>(state.range(1)), 1);
  }
  return operations;
}

// The price of an allocator's speed on the workload: the most bytes it held
// from the driver over the most bytes live ("peak_reserved_over_live").
inline void report_peak_reserved(benchmark::State& state, std::size_t peak_reserved) {
  const std::size_t peak_live = cuemm::workload::peak_live_bytes(random_workload_of(state));
  state.counters["peak_reserved_over_live"] =
      peak_live ? static_cast<double>(peak_reserved) / static_cast<double>(peak_live) : 0.0;
}

// One pass of `operations`: `allocate(size)` gives a Handle, `release(handle)`
// frees it; `live` then says which handles are still out.
template <typename Handle, typename Allocate, typename Release>
void run_operations(const std::vector<cuemm::workload::RandomOperation>& operations, std::vector<Handle>& handles,
                    std::vector<bool>& live, Allocate& allocate, Release& release) {
  for (const auto& operation : operations) {
    if (operation.allocate)
      handles[operation.id] = allocate(operation.size);
    else
      release(handles[operation.id]);
    live[operation.id] = operation.allocate;
  }
}

// Releases what a pass left out.
template <typename Handle, typename Release>
void release_live(std::vector<Handle>& handles, std::vector<bool>& live, Release& release) {
  for (std::size_t id = 0; id < handles.size(); ++id) {
    if (live[id]) release(handles[id]);
    live[id] = false;
  }
}

// One untimed pass of the workload of state.range(0) (largest size) and
// range(1) (live cap), after `empty()`; what it leaves live is released.
template <typename Handle, typename Allocate, typename Release, typename Empty>
void run_untimed_pass(const benchmark::State& state, Allocate&& allocate, Release&& release, Empty&& empty) {
  const auto& operations = random_workload_of(state);
  std::vector<Handle> handles(operations.size());
  std::vector<bool> live(operations.size());
  empty();
  run_operations(operations, handles, live, allocate, release);
  release_live(handles, live, release);
}

// The timed passes, one an iteration; what is still live at the end of each
// is released untimed.
template <typename Handle, typename Allocate, typename Release>
void time_random_workload(benchmark::State& state, Allocate&& allocate, Release&& release) {
  const auto& operations = random_workload_of(state);
  std::vector<Handle> handles(operations.size());
  std::vector<bool> live(operations.size());
  for (auto _ : state) {
    run_operations(operations, handles, live, allocate, release);
    state.PauseTiming();
    release_live(handles, live, release);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(operations.size()));
}

// The workload timed as a program that runs it again and again meets the
// allocator: `empty()` gives back what the benchmarks before left cached
// (their blocks, or the footprint they reached, would spare this workload
// driver calls that it makes on its own: for the pool, 0.44 against 0.0002 an
// operation up to 64 MiB, simulated), one untimed pass warms it on this
// workload alone, then the timed passes.
template <typename Handle, typename Allocate, typename Release, typename Empty>
void run_random_workload(benchmark::State& state, Allocate&& allocate, Release&& release, Empty&& empty) {
  run_untimed_pass<Handle>(state, allocate, release, empty);
  time_random_workload<Handle>(state, allocate, release);
}

// After the timed runs, once a workload and allocator, untimed: `empty()`
// gives the allocator's cached memory back and resets its high-water mark,
// one pass of the workload runs, and `peak()` reads the mark, reported as
// peak_reserved_over_live. (Emptying before the timed runs would time the
// first pass's driver allocations too.)
template <typename Handle, typename Allocate, typename Release, typename Empty, typename Peak>
void report_random_workload_memory(benchmark::State& state, Allocate&& allocate, Release&& release, Empty&& empty,
                                   Peak&& peak) {
  static std::map<const void*, std::size_t> measured;  // workload -> peak reserved (one per instantiation)
  const auto& operations = random_workload_of(state);
  auto known = measured.find(&operations);
  if (known == measured.end()) {
    run_untimed_pass<Handle>(state, allocate, release, empty);
    known = measured.emplace(&operations, peak()).first;
  }
  report_peak_reserved(state, known->second);
}
