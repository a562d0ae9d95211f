// What the pools' seals do to a CUDA graph being captured on another stream:
// a seal queries the legacy stream or records an event for the whole context
// (cuCtxRecordEvent), and CUDA may refuse such calls during a capture and
// invalidate it. For each capture mode and kind of capturing stream: begin a
// capture, capture a kernel, make the call, end the capture, and print the
// call's result and whether the capture survived.
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_capture bench/probes/probe_capture.cpp
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_capture
#include <cstdio>
#include <functional>

#include "spin_kernel.hpp"

static const char* name_of(CUresult r) {
  const char* name = "?";
  cuGetErrorName(r, &name);
  return name;
}

int main() {
  const probe::SpinKernel kernel;
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  struct Call {
    const char* name;
    std::function<CUresult()> run;
  } calls[] = {
      {"cuStreamQuery(legacy)", [] { return cuStreamQuery(CU_STREAM_LEGACY); }},
      {"cuEventRecord(legacy)", [&] { return cuEventRecord(event, CU_STREAM_LEGACY); }},
      {"cuCtxRecordEvent", [&] { return cuCtxRecordEvent(kernel.context, event); }},
      {"cuEventQuery (of an event recorded before)", [&] { return cuEventQuery(event); }},
  };
  struct Mode {
    const char* name;
    CUstreamCaptureMode mode;
  } modes[] = {{"global", CU_STREAM_CAPTURE_MODE_GLOBAL},
               {"thread-local", CU_STREAM_CAPTURE_MODE_THREAD_LOCAL},
               {"relaxed", CU_STREAM_CAPTURE_MODE_RELAXED}};
  for (const unsigned flags : {unsigned{CU_STREAM_NON_BLOCKING}, unsigned{CU_STREAM_DEFAULT}}) {
    for (const Mode& mode : modes) {
      for (const Call& call : calls) {
        for (const bool relax_this_thread : {false, true}) {
          CUstream stream;
          CHECK(cuStreamCreate(&stream, flags));
          CHECK(cuEventRecord(event, CU_STREAM_LEGACY));  // (for the query: recorded outside the capture)
          CHECK(cuCtxSynchronize());
          CHECK(cuStreamBeginCapture(stream, mode.mode));
          kernel.launch(1000, stream);
          CUstreamCaptureMode previous = CU_STREAM_CAPTURE_MODE_RELAXED;
          if (relax_this_thread) CHECK(cuThreadExchangeStreamCaptureMode(&previous));
          const CUresult result = call.run();
          if (relax_this_thread) CHECK(cuThreadExchangeStreamCaptureMode(&previous));
          CUgraph graph = nullptr;
          const CUresult ended = cuStreamEndCapture(stream, &graph);
          std::printf("%-12s capture on a %-12s stream%s: %-44s -> %-40s capture ends %s\n", mode.name,
                      flags ? "non-blocking" : "blocking", relax_this_thread ? " (call relaxed)" : "", call.name,
                      name_of(result), name_of(ended));
          if (graph) CHECK(cuGraphDestroy(graph));
          (void)cuCtxSynchronize();
          (void)cuStreamDestroy(stream);
        }
      }
    }
  }
  return 0;
}
