// How a capture spreads to other streams, for the simulated driver to do the
// same: a stream that waits for an event recorded on a capturing stream joins
// the capture (a fork), and an event recorded on it that the first stream
// waits for joins it back. For each case: what the calls return, and whether
// the capture survives (its end's result).
//   g++ -O2 -std=c++17 -pthread -I/usr/local/cuda/include -o /tmp/probe_capture_fork
//     bench/probes/probe_capture_fork.cpp -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_capture_fork
#include <cstdio>
#include <functional>

#include "spin_kernel.hpp"

static const char* name_of(CUresult r) {
  const char* name = "?";
  cuGetErrorName(r, &name);
  return name;
}

static const char* status_name(CUstream stream) {
  CUstreamCaptureStatus status;
  const CUresult r = cuStreamIsCapturing(stream, &status);
  if (r != CUDA_SUCCESS) return name_of(r);
  return status == CU_STREAM_CAPTURE_STATUS_NONE     ? "none"
         : status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active"
                                                     : "invalidated";
}

int main() {
  const probe::SpinKernel kernel;
  CUstream origin, side, other;
  CHECK(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent fork, join, before;
  CHECK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&before, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(before, other));
  CHECK(cuCtxSynchronize());

  // Begins a capture on `origin`, forks `side` from it, runs `body`, and
  // ends the capture on `origin`, printing what each step returned.
  auto scenario = [&](const char* name, const std::function<void()>& body) {
    std::printf("\n%s\n", name);
    CHECK(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
    kernel.launch(1000, origin);
    CHECK(cuEventRecord(fork, origin));
    std::printf("  fork: cuStreamWaitEvent(side, fork) %s; side %s\n", name_of(cuStreamWaitEvent(side, fork, 0)),
                status_name(side));
    body();
    CUgraph graph = nullptr;
    const CUresult ended = cuStreamEndCapture(origin, &graph);
    std::printf("  end on origin: %s, graph %s; origin %s, side %s\n", name_of(ended), graph ? "made" : "none",
                status_name(origin), status_name(side));
    if (graph) CHECK(cuGraphDestroy(graph));
    // Whatever is left of a capture on `side` (where the end above left it capturing).
    CUgraph left = nullptr;
    if (cuStreamEndCapture(side, &left) == CUDA_SUCCESS && left) cuGraphDestroy(left);
    cuCtxSynchronize();
  };
  auto join_back = [&] {
    const CUresult recorded = cuEventRecord(join, side);
    const CUresult waited = cuStreamWaitEvent(origin, join, 0);
    std::printf("  join: cuEventRecord(join, side) %s, cuStreamWaitEvent(origin, join) %s\n", name_of(recorded),
                name_of(waited));
  };
  auto relaxed = [](const std::function<CUresult()>& call) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cuThreadExchangeStreamCaptureMode(&mode);
    const CUresult result = call();
    cuThreadExchangeStreamCaptureMode(&mode);
    return result;
  };

  scenario("work on side, joined back", [&] {
    kernel.launch(1000, side);
    join_back();
  });
  scenario("work on side, not joined back", [&] { kernel.launch(1000, side); });
  scenario("no work on side, not joined back", [] {});
  scenario("joined back, then more work on side", [&] {
    kernel.launch(1000, side);
    join_back();
    kernel.launch(1000, side);
  });
  scenario("the end on side first", [&] {
    kernel.launch(1000, side);
    CUgraph graph = nullptr;
    const CUresult ended = cuStreamEndCapture(side, &graph);
    std::printf("  end on side: %s; origin %s, side %s\n", name_of(ended), status_name(origin), status_name(side));
    if (ended == CUDA_SUCCESS && graph) cuGraphDestroy(graph);
    join_back();
  });
  scenario("cuEventQuery(fork), the caller relaxed", [&] {
    std::printf("  cuEventQuery(fork): %s; origin %s\n", name_of(relaxed([&] { return cuEventQuery(fork); })),
                status_name(origin));
    join_back();
  });
  scenario("cuEventSynchronize(fork), the caller relaxed", [&] {
    std::printf("  cuEventSynchronize(fork): %s; origin %s\n",
                name_of(relaxed([&] { return cuEventSynchronize(fork); })), status_name(origin));
    join_back();
  });
  scenario("the capturing stream waits for an event recorded before the capture", [&] {
    std::printf("  cuStreamWaitEvent(origin, before): %s; origin %s\n", name_of(cuStreamWaitEvent(origin, before, 0)),
                status_name(origin));
    join_back();
  });
  scenario("the legacy stream waits for the fork", [&] {
    std::printf("  cuStreamWaitEvent(legacy, fork): %s; origin %s\n",
                name_of(relaxed([&] { return cuStreamWaitEvent(CU_STREAM_LEGACY, fork, 0); })), status_name(origin));
    join_back();
  });
  scenario("the join recorded on side, waited for by a third stream only", [&] {
    kernel.launch(1000, side);
    cuEventRecord(join, side);
    std::printf("  cuStreamWaitEvent(other, join): %s; other %s\n", name_of(cuStreamWaitEvent(other, join, 0)),
                status_name(other));
    CUgraph left = nullptr;
    if (cuStreamEndCapture(other, &left) == CUDA_SUCCESS && left) cuGraphDestroy(left);
  });
  return 0;
}
