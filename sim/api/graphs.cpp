// sim/api/graphs.cpp: the simulated driver's stream capture (begin, end,
// status) and the graphs it makes: instantiation and launch. What a capture
// under way makes of other calls is in capture_rules.cpp.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream handle, int mode) {
  SIM_BEGIN(cuStreamBeginCapture);
  if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, handle);
  if (stream == stream->context()->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (capture_of(s, stream)) return CUDA_ERROR_ILLEGAL_STATE;
  auto capture = std::make_shared<Capture>();
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->origin = stream.get();
  s.captures[stream.get()] = std::move(capture);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamEndCapture(CUstream handle, CUgraph* out) {
  SIM_BEGIN(cuStreamEndCapture);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, handle);
  const auto found = s.captures.find(stream.get());
  if (found == s.captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  const std::shared_ptr<Capture> capture = found->second;
  if (capture->origin != stream.get()) {
    capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED && capture->thread != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  *out = nullptr;
  // Ends for every stream of it, whatever the outcome.
  std::erase_if(s.captures, [&](const auto& entry) { return entry.second == capture; });
  if (capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (!capture->unjoined.empty()) return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  auto graph = std::make_unique<Graph>();
  graph->context = stream->context();
  graph->operations = std::move(capture->operations);
  *out = reinterpret_cast<CUgraph>(graph.get());
  s.graphs.emplace(graph.get(), std::move(graph));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamIsCapturing(CUstream handle, int* status) {
  SIM_BEGIN(cuStreamIsCapturing);
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, handle);
  // Of the legacy stream, beside a blocking stream's capture: the error that
  // work there would meet, the capture left intact (as CUDA documents, and
  // the H100 does: Driver.ACaptureRefusesAndEndsOnTheCallsTheH100Refuses).
  if (stream == stream->context()->legacy) {
    for (const auto& [capturing, capture] : s.captures)
      if (capturing->blocking() && capturing->context() == stream->context()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  const auto found = s.captures.find(stream.get());
  *status = found == s.captures.end()      ? CU_STREAM_CAPTURE_STATUS_NONE
            : found->second->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                         : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph handle, unsigned long long flags) {
  SIM_BEGIN(cuGraphInstantiate);
  const auto found = s.graphs.find(reinterpret_cast<Graph*>(handle));
  if (!out || found == s.graphs.end() || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto executable = std::make_unique<Graph>(*found->second);
  *out = reinterpret_cast<CUgraphExec>(executable.get());
  s.executables.emplace(executable.get(), std::move(executable));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle) {
  SIM_BEGIN(cuGraphLaunch);
  const auto found = s.executables.find(reinterpret_cast<Graph*>(handle));
  if (found == s.executables.end()) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, stream_handle);
  if (stream->context() != found->second->context) return CUDA_ERROR_INVALID_CONTEXT;
  // (A copy of the operations: the executable may be destroyed while its launch is queued.)
  return queue_or_capture(s, stream, [operations = found->second->operations] {
    for (const auto& operation : operations) operation();
  });
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec handle) {
  SIM_BEGIN(cuGraphExecDestroy);
  return s.executables.erase(reinterpret_cast<Graph*>(handle)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGraphDestroy(CUgraph handle) {
  SIM_BEGIN(cuGraphDestroy);
  return s.graphs.erase(reinterpret_cast<Graph*>(handle)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
