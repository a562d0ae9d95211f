// What a seal that covers every stream costs where the caller will wait for
// it anyway (a large pinned block, say): an event recorded for the whole
// context and queried (two calls) against one cuCtxSynchronize, and against
// the legacy stream's query and event for scale. The GPU idle, with a few
// non-blocking streams that have run kernels; rounds alternate the calls, so
// that the host's fast and slow modes reach each of them alike.
// Part 2: that cuCtxSynchronize waits for a kernel on a non-blocking stream
// (as the context's event does), and what it costs while other threads seal.
// Build and run on the GPU machine:
//   g++ -O2 -std=c++17 -pthread -I/usr/local/cuda/include -o /tmp/probe_context_seal \
//     bench/probes/probe_context_seal.cpp -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_context_seal
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "spin_kernel.hpp"

using probe::Clock;
using probe::us_since;

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// Median ns of one call of `step`, timed in batches of 100.
double ns_per_call(const std::function<void()>& step) {
  std::vector<double> batches;
  for (int batch = 0; batch < 100; ++batch) {
    const auto start = Clock::now();
    for (int i = 0; i < 100; ++i) step();
    batches.push_back(us_since(start) * 1000.0 / 100);
  }
  return median(batches);
}

}  // namespace

int main() {
  const probe::SpinKernel kernel;
  const CUcontext context = kernel.context;
  std::vector<CUstream> streams(4);
  for (CUstream& stream : streams) {
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    kernel.launch(1000, stream);
  }
  CHECK(cuCtxSynchronize());
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));

  struct Way {
    const char* name;
    std::function<void()> step;
    std::vector<double> rounds;
  };
  std::vector<Way> ways = {
      {"cuStreamQuery(legacy)", [] { (void)cuStreamQuery(CU_STREAM_LEGACY); }, {}},
      {"cuEventRecord(legacy) + cuEventQuery",
       [&] {
         CHECK(cuEventRecord(event, CU_STREAM_LEGACY));
         CHECK(cuEventQuery(event));
       },
       {}},
      {"cuCtxRecordEvent + cuEventQuery",
       [&] {
         CHECK(cuCtxRecordEvent(context, event));
         CHECK(cuEventQuery(event));
       },
       {}},
      {"cuCtxSynchronize", [] { CHECK(cuCtxSynchronize()); }, {}},
      {"cuStreamSynchronize(legacy)", [] { CHECK(cuStreamSynchronize(CU_STREAM_LEGACY)); }, {}},
  };
  constexpr int kRounds = 15;
  for (int round = 0; round < kRounds; ++round)
    for (Way& way : ways) way.rounds.push_back(ns_per_call(way.step));
  std::printf("part 1: idle GPU, 4 non-blocking streams; ns a call, median of %d rounds (lowest-highest)\n",
              kRounds);
  for (Way& way : ways) {
    const auto [low, high] = std::minmax_element(way.rounds.begin(), way.rounds.end());
    std::printf("  %-40s %7.0f (%.0f-%.0f)\n", way.name, median(way.rounds), *low, *high);
  }

  std::printf("part 2: cuCtxSynchronize behind a 50 ms kernel on a non-blocking stream\n");
  for (int round = 0; round < 2; ++round) {
    kernel.launch_fifty_ms(streams[0]);
    const auto start = Clock::now();
    CHECK(cuCtxSynchronize());
    std::printf("  waited %.0f us\n", us_since(start));
  }

  std::printf("part 3: 8 threads, each its own event, sealing in a loop (ns a seal, all threads together)\n");
  for (const bool by_sync : {false, true}) {
    constexpr int kThreads = 8, kSeals = 20000;
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        CHECK(cuCtxSetCurrent(context));
        CUevent own;
        CHECK(cuEventCreate(&own, CU_EVENT_DISABLE_TIMING));
        while (!go) {
        }
        for (int i = 0; i < kSeals; ++i) {
          if (by_sync) {
            CHECK(cuCtxSynchronize());
          } else {
            CHECK(cuCtxRecordEvent(context, own));
            CHECK(cuEventQuery(own));
          }
        }
        CHECK(cuEventDestroy(own));
      });
    const auto start = Clock::now();
    go = true;
    for (std::thread& thread : threads) thread.join();
    std::printf("  %-34s %7.0f\n", by_sync ? "cuCtxSynchronize" : "cuCtxRecordEvent + cuEventQuery",
                us_since(start) * 1000.0 / (kThreads * kSeals));
  }
  return 0;
}
