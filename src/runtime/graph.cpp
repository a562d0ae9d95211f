#include "cuemm/runtime/graph.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"

namespace cuemm {
namespace {

int driver_mode(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::global:
      return cuda::CU_STREAM_CAPTURE_MODE_GLOBAL;
    case CaptureMode::this_thread:
      return cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    case CaptureMode::relaxed:
      return cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
  }
  throw InvalidArgument("capture_graph: unknown CaptureMode " + std::to_string(static_cast<int>(mode)));
}

// Ends the capture on `stream` whatever state it is in, dropping what it
// captured: after a failed recording the stream must take work again.
void abandon_capture(cuda::CUstream stream) noexcept {
  cuda::CUgraph partial = nullptr;
  CUEMM_CU_RESULT(cuStreamEndCapture, stream, &partial);
  if (partial) CUEMM_CU_RESULT(cuGraphDestroy, partial);
}

std::string device_of(const Context* context) {
  return context ? "device " + std::to_string(context->device().id()) : "no context";
}

}  // namespace

struct Graph::Launches {
  std::mutex mutex;
  std::vector<std::pair<cuda::CUstream, Event>> after_latest;
};

Graph::Graph(Context& context, cuda::CUgraph graph, cuda::CUgraphExec executable, std::shared_ptr<GraphMemory> memory)
    : memory_(std::move(memory)),
      graph_(&context, graph, [](void* handle) { CUEMM_CU(cuGraphDestroy, static_cast<cuda::CUgraph>(handle)); }),
      executable_(&context, executable,
                  [](void* handle) { CUEMM_CU(cuGraphExecDestroy, static_cast<cuda::CUgraphExec>(handle)); }),
      launches_(std::make_unique<Launches>()) {}

Graph::Graph(Graph&&) noexcept = default;

Graph::~Graph() { order_the_legacy_stream_after_launches(); }

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    order_the_legacy_stream_after_launches();
    memory_ = std::move(other.memory_);
    graph_ = std::move(other.graph_);
    executable_ = std::move(other.executable_);
    launches_ = std::move(other.launches_);
  }
  return *this;
}

void Graph::order_the_legacy_stream_after_launches() noexcept {
  Context* context = this->context();
  // (Not after a device reset, which destroyed the events with the graph.)
  if (!launches_ || !context || executable_.stale()) return;
  std::lock_guard lock(launches_->mutex);
  if (launches_->after_latest.empty()) return;
  try {
    ScopedContext scope(*context);
    for (const auto& [stream, event] : launches_->after_latest)
      CUEMM_CU_RESULT(cuStreamWaitEvent, cuda::CU_STREAM_LEGACY, event.handle(), 0);
  } catch (...) {
    // (The context could not be made current: nothing more can be ordered.)
  }
}

void Graph::launch(const Stream& stream) const {
  Context* context = this->context();
  if (!executable()) throw StateError("Graph::launch: this Graph was moved from and holds no graph");
  if (stream.context() && stream.context() != context)
    throw InvalidArgument("Graph::launch: the stream is of " + device_of(stream.context()) +
                          "'s context, the graph of " + device_of(context) + "'s");
  ScopedContext scope(*context);
  CUEMM_CU(cuGraphLaunch, executable(), stream.handle());
  if (cuda::is_default_stream(stream.handle())) return;  // (the legacy stream is ordered after those)
  // So that the graph's memory goes back after this launch (~Graph).
  std::lock_guard lock(launches_->mutex);
  auto& after_latest = launches_->after_latest;
  auto found = std::find_if(after_latest.begin(), after_latest.end(),
                            [&](const auto& entry) { return entry.first == stream.handle(); });
  if (found == after_latest.end()) {
    after_latest.emplace_back(stream.handle(), context->create_event(/*timing=*/false));
    found = after_latest.end() - 1;
  }
  found->second.record(stream);
}

Graph capture_graph(const Stream& stream, const std::function<void(const Stream&)>& record,
                    const CaptureOptions& options) {
  const cuda::CUstream handle = stream.handle();
  if (handle == nullptr || handle == cuda::CU_STREAM_LEGACY)
    throw InvalidArgument(
        "capture_graph: the legacy default stream cannot be captured (the driver refuses it); capture on a stream "
        "of your own (Context::create_stream) or the per-thread default stream");
  if (!record) throw InvalidArgument("capture_graph: no recording function");
  const int mode = driver_mode(options.mode);
  Context& context = stream.context() ? *stream.context() : current_context();
  // Current before the scope opens, so that this ScopedContext leaves the
  // thread's capture mode as the program set it: the recording's own calls
  // meet the capture's rules; the managers relax theirs.
  ScopedContext current(context);
  CaptureScope scope(context, options.reuse, options.shared_memory);
  CUEMM_CU(cuStreamBeginCapture, handle, mode);
  try {
    record(stream);
  } catch (...) {
    abandon_capture(handle);
    throw;
  }
  cuda::CUgraph graph = nullptr;
  const cuda::CUresult ended = CUEMM_CU_RESULT(cuStreamEndCapture, handle, &graph);
  if (ended == cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    throw CudaError(ended, "cuStreamEndCapture",
                    "capture_graph: a call that the capture forbids ended it while it ran: a synchronisation or "
                    "query of the context or the legacy stream, or, unless the caller's mode was relaxed, an "
                    "allocation, free or event query; no graph was made");
  driver::check(ended, "cuStreamEndCapture");
  cuda::CUgraphExec executable = nullptr;
  if (const cuda::CUresult result = CUEMM_CU_RESULT(cuGraphInstantiate, &executable, graph, 0)) {
    CUEMM_CU_RESULT(cuGraphDestroy, graph);
    driver::check(result, "cuGraphInstantiate");
  }
  return Graph(context, graph, executable, scope.memory());
}

}  // namespace cuemm
