// cuemm/runtime/graph.hpp: CUDA graphs captured from a stream, each holding
// the memory that its work uses.
//
//   cuemm::Graph graph = cuemm::capture_graph(stream, [&](const cuemm::Stream& s) {
//     auto scratch = context.memalloc(size);   // kept for the graph's launches
//     fill.launch({64}, {256}, s, scratch->device_pointer(), value, count);
//     copy.launch({64}, {256}, s, output->device_pointer(), scratch->device_pointer(), count);
//   });                                        // scratch let go: the graph keeps it
//   for (int step = 0; step < steps; ++step) graph.launch(stream);
//
// capture_graph is a CaptureScope (capture_scope.hpp) around the driver's
// capture, so the managers know of it: the pools seal nothing and wait for
// nothing while it runs, and what the recording thread allocates stays the
// graph's while the Graph lives. Another thread that records into the same
// capture (on a stream forked from it) holds a
// CaptureScope::Member(*CaptureScope::of_this_thread(context)), taken by the
// recording, for its blocks to be the graph's too. Nothing is left to get
// wrong: the memory goes with the graph, and an exception thrown while
// recording ends the capture (the stream can be used again) before it
// propagates.
//
// When the Graph goes, its blocks go back to their managers as stream-less
// frees, which are safe for work queued on the legacy stream and the streams
// it waits for; so the Graph first makes the legacy stream wait for its
// latest launch on every other stream it was launched on (an event recorded
// after each such launch), and launches still running are covered under
// every manager: the async manager's frees, ordered on the legacy stream,
// and a pool's seals before CUDA 12.5 come after them.
#pragma once

#include <functional>
#include <memory>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/runtime/capture_scope.hpp"
#include "cuemm/runtime/detail/context_owned_handle.hpp"
#include "cuemm/runtime/stream.hpp"

namespace cuemm {

// Which calls the capture forbids while it runs (CUstreamCaptureMode); a
// forbidden call ends the capture, and capture_graph then says so.
enum class CaptureMode {
  global,       // potentially unsafe calls (cuMemAlloc, cuMemFree, event queries) from any thread not relaxed
  this_thread,  // such calls from the capturing thread only
  relaxed,      // none
};

struct CaptureOptions {
  CaptureMode mode = CaptureMode::global;
  // Whether a block that the recording let go may serve its later requests (see CaptureScope).
  CaptureScope::Reuse reuse = CaptureScope::Reuse::never;
  // An earlier graph's memory() to share, for graphs only ever launched one after another on one stream.
  std::shared_ptr<GraphMemory> shared_memory;
};

class Graph {
 public:
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Queues one run of the graph on `stream`, which must be of the graph's context.
  void launch(const Stream& stream) const;
  // The blocks that the recording allocated, kept while this graph (or another holder) lives.
  const std::shared_ptr<GraphMemory>& memory() const noexcept { return memory_; }
  Context* context() const noexcept { return executable_.context(); }
  cuda::CUgraph graph() const noexcept { return static_cast<cuda::CUgraph>(graph_.get()); }
  cuda::CUgraphExec executable() const noexcept { return static_cast<cuda::CUgraphExec>(executable_.get()); }

 private:
  friend Graph capture_graph(const Stream&, const std::function<void(const Stream&)>&, const CaptureOptions&);
  Graph(Context& context, cuda::CUgraph graph, cuda::CUgraphExec executable, std::shared_ptr<GraphMemory> memory);
  // Makes the legacy stream wait for the latest launch on each other stream.
  void order_the_legacy_stream_after_launches() noexcept;

  // Declared first, so released last: the handles' releases are queued before the blocks go.
  std::shared_ptr<GraphMemory> memory_;
  detail::ContextOwnedHandle graph_;
  detail::ContextOwnedHandle executable_;
  // An event recorded after the latest launch on each stream other than the default ones.
  struct Launches;
  std::unique_ptr<Launches> launches_;
};

// Captures the work that `record` queues on `stream` into a graph, with the
// memory that the recording thread allocates through the stream's context
// meanwhile. `stream` may not be the legacy default stream, which the driver
// does not capture (InvalidArgument); the per-thread default stream captures
// in the current context. CudaError where the driver refused the capture or
// a call that it forbids ended it (the message says which); any exception
// from `record` ends the capture first.
Graph capture_graph(const Stream& stream, const std::function<void(const Stream&)>& record,
                    const CaptureOptions& options = {});

}  // namespace cuemm
