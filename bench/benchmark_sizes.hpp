// The sizes and thread counts every allocate+free benchmark runs, so that
// cuemm's managers and the anchors (bench_torch_allocator) line up.
#pragma once

#include <benchmark/benchmark.h>

inline void set_sizes(benchmark::internal::Benchmark* benchmark) {
  for (long size : {256L, 64L << 10, 1L << 20, 4L << 20, 64L << 20}) benchmark->Arg(size);
  benchmark->ThreadRange(1, 16)->UseRealTime();
}
