// capture_rules.cpp: what a stream capture under way makes of other calls,
// and how work joins a capture instead of running.
#include "driver_internals.hpp"

namespace cuemm::sim {

// Work queued on a capturing stream is kept for its graph instead of run.
// What a capture under way makes of other calls follows the H100
// (bench/probes/probe_capture.cpp; docs/pool-measurements.md): a call that
// the capture forbids is refused and ends (invalidates) it. An event
// recorded on a capturing stream forks the capture to the streams that wait
// for it, and joins them back where a stream of the capture waits for an
// event recorded on them (Capture; bench/probes/probe_capture_fork.cpp, whose
// H100 results Driver.ACaptureForksToAStreamThatWaitsForItsEventAndEndsOnceJoined
// holds this driver to). Stream-ordered allocations on a capturing stream
// (the driver's graph memory nodes) are refused.

thread_local int thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult check_captures(State& s, DuringCapture call, const Context* context) {
  CUresult result = CUDA_SUCCESS;
  const auto self = std::this_thread::get_id();
  for (auto& [stream, shared] : s.captures) {
    Capture& capture = *shared;
    const bool beside_legacy = stream->blocking() && stream->context() == context;
    CUresult refused = CUDA_SUCCESS;
    switch (call) {
      case DuringCapture::whole_context:
        refused = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        break;
      case DuringCapture::legacy_stream_work:
        if (beside_legacy) refused = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        break;
      case DuringCapture::legacy_stream_query:
        if (beside_legacy) {
          refused = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
          break;
        }
        [[fallthrough]];
      case DuringCapture::potentially_unsafe:
        // The thread's own capture forbids it unless one of the two is
        // relaxed; another thread's, where both are global.
        if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED || capture.mode == CU_STREAM_CAPTURE_MODE_RELAXED)
          break;
        if (capture.thread == self ||
            (capture.mode == CU_STREAM_CAPTURE_MODE_GLOBAL && thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL))
          refused = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        break;
    }
    if (refused != CUDA_SUCCESS) {
      capture.invalidated = true;
      if (result == CUDA_SUCCESS) result = refused;
    }
  }
  return result;
}

Capture* capture_of(State& s, const std::shared_ptr<SimStream>& stream) {
  const auto found = s.captures.find(stream.get());
  return found == s.captures.end() ? nullptr : found->second.get();
}

// The capture under way that `event` was last recorded in; null where it was
// recorded outside one, or its capture has ended (only the map of captures
// under way owns them). Call with the event's mutex held.
std::shared_ptr<Capture> live_capture_of(const SimEvent& event) { return event.capture.lock(); }

// Queues `operation` on `stream`, or keeps it for the stream's capture; work
// on the legacy stream first meets the captures' rules.
CUresult queue_or_capture(State& s, const std::shared_ptr<SimStream>& stream, SimStream::Operation operation,
                          bool marker) {
  if (Capture* capture = capture_of(s, stream)) {
    capture->operations.push_back(std::move(operation));
    if (stream.get() != capture->origin) capture->unjoined[stream.get()] = capture->operations.size();
    return CUDA_SUCCESS;
  }
  if (stream == stream->context()->legacy) {
    if (const CUresult refused = check_captures(s, DuringCapture::legacy_stream_work, stream->context()))
      return refused;
  }
  submit(stream, std::move(operation), marker);
  return CUDA_SUCCESS;
}

// Refuses a call that a capturing `stream` does not take, ending its capture:
// a query or synchronisation of it, and here stream-ordered allocations on it.
CUresult refuse_on_a_capturing_stream(State& s, const std::shared_ptr<SimStream>& stream) {
  Capture* capture = capture_of(s, stream);
  if (!capture) return CUDA_SUCCESS;
  capture->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// A query or synchronisation of `stream`; of the legacy stream it meets the
// captures' rules.
CUresult check_stream_use(State& s, const std::shared_ptr<SimStream>& stream) {
  if (const CUresult refused = refuse_on_a_capturing_stream(s, stream)) return refused;
  if (stream != stream->context()->legacy) return CUDA_SUCCESS;
  return check_captures(s, DuringCapture::legacy_stream_query, stream->context());
}

}  // namespace cuemm::sim

