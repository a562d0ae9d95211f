// What cuemm::Graph::launch costs over the driver's cuGraphLaunch: the event
// it records after each launch on a stream other than the default ones (so
// that a Graph dropped while its launches run orders the legacy stream after
// them). A graph of one small memset node, launched on a non-blocking
// stream; ns per launch, the median of 7 rounds of 2,000 launches (the stream
// synchronised every 500), for: the driver's launch alone, the driver's launch
// and an event record, and Graph::launch.
//   cmake --build build --target probe_graph_launch && build/bin/probe_graph_launch
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "cuemm/cuemm.hpp"

namespace {

double median_ns_per_launch(const cuemm::Stream& stream, const std::function<void()>& launch) {
  constexpr int kRounds = 7, kLaunches = 2000, kBetweenSyncs = 500;
  std::vector<double> rounds;
  for (int round = 0; round < kRounds; ++round) {
    stream.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; i <= kLaunches; ++i) {
      launch();
      if (i % kBetweenSyncs == 0) stream.synchronize();
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    rounds.push_back(took.count() / kLaunches);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace

int main() {
  try {
    cuemm::Context& context = cuemm::current_context();
    cuemm::ScopedContext current(context);
    const cuemm::Stream stream = context.create_stream(/*non_blocking=*/true);
    auto block = context.memalloc(256);
    const cuemm::Graph graph = cuemm::capture_graph(
        stream, [&](const cuemm::Stream& recording) { block->memset(1, std::nullopt, &recording); });
    const cuemm::Event event = context.create_event(/*timing=*/false);
    // Alternated, so that each kind meets the host's modes alike.
    double driver = 0, with_event = 0, cuemm_launch = 0;
    for (int pass = 0; pass < 3; ++pass) {
      driver += median_ns_per_launch(stream, [&] { CUEMM_CU(cuGraphLaunch, graph.executable(), stream.handle()); });
      with_event += median_ns_per_launch(stream, [&] {
        CUEMM_CU(cuGraphLaunch, graph.executable(), stream.handle());
        event.record(stream);
      });
      cuemm_launch += median_ns_per_launch(stream, [&] { graph.launch(stream); });
    }
    std::printf("graph launch, ns per launch (means of 3 alternated medians): cuGraphLaunch %.0f; with cuEventRecord "
                "%.0f (%.2fx); Graph::launch %.0f (%.2fx)\n",
                driver / 3, with_event / 3, with_event / driver, cuemm_launch / 3, cuemm_launch / driver);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "probe_graph_launch: %s\n", error.what());
    return 1;
  }
}
