// Blocks handed over between threads, for every allocator's benchmarks
// (bench_allocators, bench_torch_allocator): the benchmark's thread allocates
// and a second thread frees each block it is handed (a loader thread feeding
// a compute thread, or Python's collector freeing on whichever thread it
// runs). The blocks go in batches of kHandOverBatch through two buffers, so
// that the threads' hand-over costs little beside the allocator's work; at
// most two batches are in flight. ns a block, the pipeline's throughput.
#pragma once

#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <thread>
#include <utility>

inline constexpr std::size_t kHandOverBatch = 16;
// Up to 1 MiB the size classes; 2 MiB a large block of the shared segments;
// 4 and 64 MiB segments of their own (the pool's default dedicated size).
inline constexpr long kHandOverSizes[] = {256L, 1L << 20, 2L << 20, 4L << 20, 64L << 20};

inline void set_hand_over_sizes(benchmark::internal::Benchmark* benchmark) {
  for (long size : kHandOverSizes) benchmark->Arg(size);
  benchmark->UseRealTime();
}

inline void spin_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// allocate() returns a Pointer: an address, or an owner such as a
// shared_ptr, which release() takes by value and drops. release(pointer)
// frees it on the other thread, which first keeps what prepare() returns
// (a current context, say) for as long as it runs.
// The pipeline itself: allocates while more() says so. Untimed, it warms
// an allocator up (see hand_over_blocks_untimed()).
template <typename Pointer, typename More, typename Allocate, typename Release, typename Prepare>
void hand_over_pipeline(More more, Allocate allocate, Release release, Prepare prepare) {
  struct alignas(64) Batch {
    std::atomic<std::size_t> count{0};  // 0: empty, the allocating thread's to fill
    std::array<Pointer, kHandOverBatch> blocks{};
  };
  std::array<Batch, 2> batches;
  std::atomic<bool> done{false};
  std::thread freer([&] {
    [[maybe_unused]] const auto kept = prepare();
    for (std::size_t next = 0;; next ^= 1) {
      std::size_t count;
      while ((count = batches[next].count.load(std::memory_order_acquire)) == 0) {
        // (done is set after the last batch: seen done, the count is read again.)
        if (done.load(std::memory_order_acquire) && batches[next].count.load(std::memory_order_acquire) == 0) return;
        spin_pause();
      }
      for (std::size_t i = 0; i < count; ++i) release(std::move(batches[next].blocks[i]));
      batches[next].count.store(0, std::memory_order_release);
    }
  });
  std::size_t next = 0, filled = 0;
  std::array<Pointer, kHandOverBatch> pending{};
  auto hand_over = [&] {
    while (batches[next].count.load(std::memory_order_acquire) != 0) spin_pause();
    batches[next].blocks = std::move(pending);  // (an owning Pointer leaves pending empty)
    batches[next].count.store(filled, std::memory_order_release);
    next ^= 1;
    filled = 0;
  };
  while (more()) {
    pending[filled++] = allocate();
    if (filled == kHandOverBatch) hand_over();
  }
  if (filled) hand_over();
  done.store(true, std::memory_order_release);
  freer.join();
}

template <typename Pointer, typename Allocate, typename Release, typename Prepare>
void hand_over_blocks(benchmark::State& state, Allocate allocate, Release release, Prepare prepare) {
  hand_over_pipeline<Pointer>([&] { return state.KeepRunning(); }, allocate, release, prepare);
  state.SetItemsProcessed(state.iterations());
}

// `blocks` handed over untimed.
template <typename Pointer, typename Allocate, typename Release, typename Prepare>
void hand_over_blocks_untimed(std::size_t blocks, Allocate allocate, Release release, Prepare prepare) {
  hand_over_pipeline<Pointer>([&] { return blocks-- > 0; }, allocate, release, prepare);
}
