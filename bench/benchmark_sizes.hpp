// The sizes and thread counts every allocate+free benchmark runs, so that
// cuemm's managers and the anchors (bench_torch_allocator) line up. Thread
// counts are the ones RESULTS.md reports; 2 and 8 would add a third to the
// GPU check's time (which must fit one 10-minute call) and appear nowhere.
#pragma once

#include <benchmark/benchmark.h>

inline void set_sizes(benchmark::internal::Benchmark* benchmark) {
  for (long size : {256L, 64L << 10, 1L << 20, 4L << 20, 64L << 20}) benchmark->Arg(size);
  benchmark->Threads(1)->Threads(4)->Threads(16)->UseRealTime();
}
