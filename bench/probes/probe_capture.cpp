// What the pools' seals do to a CUDA graph being captured on another stream:
// a seal queries the legacy stream or records an event for the whole context
// (cuCtxRecordEvent), and CUDA may refuse such calls during a capture and
// invalidate it. For each capture mode and kind of capturing stream: begin a
// capture, capture a kernel, make the call (from the capturing thread or
// another one), end the capture, and print the call's result and whether
// the capture survived. Growth and give-backs (cuMemAlloc, cuMemFree) and the
// fallback of a failed seal (cuCtxSynchronize) too.
//   g++ -O2 -std=c++17 -pthread -I/usr/local/cuda/include -o /tmp/probe_capture bench/probes/probe_capture.cpp
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_capture
#include <cstdio>
#include <functional>
#include <thread>
#include <utility>

#include "spin_kernel.hpp"

// cuMemAlloc's block, freed once the capture has ended; cuMemFree's, made
// before the capture began (and kept for the next where the free was refused).
static CUdeviceptr spare_after_capture = 0;
static CUdeviceptr spare_before_capture = 0;

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
      {"cuCtxSynchronize", [] { return cuCtxSynchronize(); }},
      {"cuMemAlloc (2 MiB)",
       [] {
         CUdeviceptr block = 0;
         const CUresult result = cuMemAlloc(&block, 2 << 20);
         if (result == CUDA_SUCCESS) spare_after_capture = block;
         return result;
       }},
      {"cuMemFree (of a block from before)",
       [] {
         const CUresult result = cuMemFree(spare_before_capture);
         if (result == CUDA_SUCCESS) spare_before_capture = 0;
         return result;
       }},
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
        for (const bool relax_this_thread : {false, true})
        for (const bool other_thread : {false, true}) {
          CUstream stream;
          CHECK(cuStreamCreate(&stream, flags));
          CHECK(cuEventRecord(event, CU_STREAM_LEGACY));  // (for the query: recorded outside the capture)
          if (!spare_before_capture) CHECK(cuMemAlloc(&spare_before_capture, 2 << 20));
          CHECK(cuCtxSynchronize());
          CHECK(cuStreamBeginCapture(stream, mode.mode));
          kernel.launch(1000, stream);
          CUresult result = CUDA_SUCCESS;
          auto make_call = [&] {
            CUstreamCaptureMode previous = CU_STREAM_CAPTURE_MODE_RELAXED;
            if (relax_this_thread) CHECK(cuThreadExchangeStreamCaptureMode(&previous));
            result = call.run();
            if (relax_this_thread) CHECK(cuThreadExchangeStreamCaptureMode(&previous));
          };
          if (other_thread) {
            std::thread([&] {
              CHECK(cuCtxSetCurrent(kernel.context));
              make_call();
            }).join();
          } else {
            make_call();
          }
          CUgraph graph = nullptr;
          const CUresult ended = cuStreamEndCapture(stream, &graph);
          std::printf("%-12s capture on a %-12s stream, %-12s%s: %-44s -> %-40s capture ends %s\n", mode.name,
                      flags ? "non-blocking" : "blocking", other_thread ? "other thread" : "same thread",
                      relax_this_thread ? " (relaxed)" : "", call.name, name_of(result), name_of(ended));
          if (graph) CHECK(cuGraphDestroy(graph));
          (void)cuCtxSynchronize();
          if (spare_after_capture) CHECK(cuMemFree(std::exchange(spare_after_capture, 0)));
          (void)cuStreamDestroy(stream);
        }
      }
    }
  }
  return 0;
}
