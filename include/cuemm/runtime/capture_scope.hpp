// cuemm/runtime/capture_scope.hpp: telling the managers that a CUDA graph is
// being captured.
//
// No capture survives an event recorded for the whole context or a
// synchronisation of it, which the pools' seals use (so that a freed block
// waits for the work queued before its free, on every stream); in the
// default (global) capture mode, allocations and frees from any thread end
// it too (bench/probes/probe_capture.cpp). Open a scope before
// cuStreamBeginCapture and close it after cuStreamEndCapture:
//
//   {
//     cuemm::CaptureScope capture(context);
//     cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
//     auto block = context.memalloc(size);   // any thread may allocate and free
//     ... kernels on `stream` that use `block` ...
//     cuStreamEndCapture(stream, &graph);
//   }
//
// Meanwhile the pools seal nothing: blocks freed during the scope are reused
// only after it, and the pools grow rather than wait for the GPU. Their
// driver calls run with the thread's capture mode relaxed (ScopedContext).
// As with cuMemAlloc's memory, blocks that captured work uses must stay
// allocated for as long as the graph may be launched.
#pragma once

#include "cuemm/runtime/context.hpp"

namespace cuemm {

class CaptureScope {
 public:
  explicit CaptureScope(Context& context);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  Context& context_;
};

}  // namespace cuemm
