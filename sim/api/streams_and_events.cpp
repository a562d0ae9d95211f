// sim/api/streams_and_events.cpp: the simulated driver's streams and events,
// and waits between streams.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

SIM_EXPORT CUresult cuStreamCreate(CUstream* out, unsigned flags) {
  SIM_BEGIN(cuStreamCreate);
  SIM_CONTEXT();
  if (!out || (flags & ~CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  auto stream = std::make_shared<SimStream>(context, flags);
  context->streams.insert(stream);
  s.streams.emplace(stream.get(), stream);
  *out = reinterpret_cast<CUstream>(stream.get());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream handle) {
  SIM_BEGIN(cuStreamDestroy);
  auto it = s.streams.find(reinterpret_cast<SimStream*>(handle));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto stream = it->second;
  s.captures.erase(stream.get());
  s.streams.erase(it);
  stream->context()->streams.erase(stream);
  lock.unlock();
  stream->shut_down();  // finishes queued work, as a GPU would after destroy returns
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  SIM_BEGIN(cuStreamSynchronize);
  SIM_STREAM(stream, handle);
  if (const CUresult refused = check_stream_use(s, stream)) return refused;
  // An empty operation on the stream carries the legacy-stream dependencies with it.
  const auto ticket = submit(stream, nullptr);
  const int device = stream->context()->device->ordinal;
  lock.unlock();
  stream->wait_for(ticket);
  lock.lock();
  release_past_thresholds(s, device);  // as the driver's pools do at a synchronisation
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamGetCtx(CUstream handle, CUcontext* out) {
  SIM_BEGIN(cuStreamGetCtx);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, handle);
  *out = reinterpret_cast<CUcontext>(stream->context());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamGetId(CUstream handle, unsigned long long* out) {
  SIM_BEGIN(cuStreamGetId);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(stream, handle);
  *out = stream->id();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamQuery(CUstream handle) {
  SIM_BEGIN(cuStreamQuery);
  SIM_STREAM(stream, handle);
  if (const CUresult refused = check_stream_use(s, stream)) return refused;
  if (!stream->is_complete(stream->last_ticket())) return CUDA_ERROR_NOT_READY;
  // The legacy default stream reads as busy while any blocking stream is, as
  // its ordering implies (measured on the H100: busy for a kernel on a
  // blocking stream, idle for one on a non-blocking stream).
  if (Context* context = stream->context(); stream == context->legacy) {
    for (const auto& other : context->streams)
      if (other->blocking() && !other->is_complete(other->last_ticket())) return CUDA_ERROR_NOT_READY;
  }
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamAddCallback(CUstream handle, CUstreamCallback callback, void* user_data,
                                        unsigned flags) {
  SIM_BEGIN(cuStreamAddCallback);
  if (!callback || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return run_on_stream(s, handle, [=] { callback(handle, CUDA_SUCCESS, user_data); });
}

SIM_EXPORT CUresult cuEventCreate(CUevent* out, unsigned flags) {
  SIM_BEGIN(cuEventCreate);
  SIM_CONTEXT();
  if (!out || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
  auto event = std::make_shared<SimEvent>(context, flags);
  s.events.emplace(event.get(), event);
  *out = reinterpret_cast<CUevent>(event.get());
  return CUDA_SUCCESS;
}

namespace {
std::shared_ptr<SimEvent> find_event(State& s, CUevent handle) {
  auto it = s.events.find(reinterpret_cast<SimEvent*>(handle));
  return it == s.events.end() ? nullptr : it->second;
}
}  // namespace

SIM_EXPORT CUresult cuEventDestroy_v2(CUevent handle) {
  SIM_BEGIN(cuEventDestroy);
  if (s.events.erase(reinterpret_cast<SimEvent*>(handle)) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventRecord(CUevent handle, CUstream stream_handle) {
  SIM_BEGIN(cuEventRecord);
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  SIM_STREAM(stream, stream_handle);
  if (stream->context() != event->context) return CUDA_ERROR_INVALID_HANDLE;  // (the driver's documented answer)
  if (Capture* capture = capture_of(s, stream)) {
    // A point in the capture for other streams to fork from or join at; nothing runs for it.
    std::lock_guard event_lock(event->mutex);
    event->capture = s.captures.at(stream.get());
    event->captured_on = stream.get();
    event->captured_at = capture->operations.size();
    return CUDA_SUCCESS;
  }
  std::uint64_t generation;
  {
    std::lock_guard event_lock(event->mutex);
    generation = ++event->recorded;
    event->points.clear();
    event->capture.reset();
  }
  // A marker: it runs once the stream counts its ticket as reached, so a
  // wait for the event never ends before the stream reads idle up to it.
  // (It completes its own generation, for whoever waits for that one after
  // the event was recorded again.)
  if (const CUresult queued = queue_or_capture(s, stream, [event, generation] {
        std::lock_guard event_lock(event->mutex);
        if (generation <= event->completed) return;
        event->completed = generation;
        event->time = std::chrono::steady_clock::now();
        if (event->points_generation == generation) event->points.clear();  // (nor keep the stream)
        event->done.notify_all();
      }, /*marker=*/true))
    return queued;
  std::lock_guard event_lock(event->mutex);
  if (event->recorded == generation && event->completed < generation) {
    event->points_generation = generation;
    event->points = {{stream, stream->last_ticket()}};  // (the marker's: work is queued under the state's lock)
    event->settle();
  }
  return CUDA_SUCCESS;
}

// Captures in `handle` all the work queued in `context_handle` now, on every
// stream (CUDA 12.5's cuCtxRecordEvent; measured on the H100: it reads busy
// for a kernel on a non-blocking stream, where the legacy stream reads idle).
SIM_EXPORT CUresult cuCtxRecordEvent(CUcontext context_handle, CUevent handle) {
  SIM_BEGIN(cuCtxRecordEvent);
  Context* context = reinterpret_cast<Context*>(context_handle);
  if (!is_live(s, context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (const CUresult refused = check_captures(s, DuringCapture::whole_context)) return refused;
  auto event = find_event(s, handle);
  if (!event || event->context != context) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<SimStream::Dependency> points;
  for (auto& stream : all_streams_of(context)) points.push_back({stream, stream->last_ticket()});
  std::lock_guard event_lock(event->mutex);
  event->points_generation = ++event->recorded;
  event->points = std::move(points);
  event->settle();
  return CUDA_SUCCESS;
}

// The calling thread's capture mode: which calls the captures under way
// forbid it (check_captures).
SIM_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  SIM_BEGIN(cuThreadExchangeStreamCaptureMode);
  if (!mode || *mode < 0 || *mode > 2) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, thread_capture_mode);
  return CUDA_SUCCESS;
}

namespace {
// The record of an event that a wait begun now waits for: its latest, with
// the streams' points it stands for taken now, so that the event recorded
// again later (on another stream, say) neither ends the wait nor moves it,
// as on a GPU. No points: it has completed (or queued nothing: then its
// generation is waited for). Call with the event's mutex held.
struct RecordWaitedFor {
  std::uint64_t generation = 0;
  std::vector<SimStream::Dependency> points;
};
RecordWaitedFor record_to_wait_for(const SimEvent& event) {
  RecordWaitedFor record{event.recorded, {}};
  if (event.completed < event.recorded && event.points_generation == event.recorded) record.points = event.points;
  return record;
}

// Waits, without the state lock, until the streams have reached the
// record's points, and settles the event if it is still its latest record.
void await_record(const std::shared_ptr<SimEvent>& event, const RecordWaitedFor& record) {
  if (record.points.empty()) {
    std::unique_lock event_lock(event->mutex);
    event->done.wait(event_lock, [&] { return event->completed >= record.generation; });
    return;
  }
  for (const auto& point : record.points) point.stream->wait_for(point.ticket);
  std::lock_guard event_lock(event->mutex);
  event->settle();
}
}  // namespace

SIM_EXPORT CUresult cuEventQuery(CUevent handle) {
  SIM_BEGIN(cuEventQuery);
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  std::lock_guard event_lock(event->mutex);
  if (const auto captured = live_capture_of(*event)) {  // (a point in a capture, not an event yet)
    captured->invalidated = true;
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  event->settle();
  return event->completed >= event->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent handle) {
  SIM_BEGIN(cuEventSynchronize);
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  RecordWaitedFor record;
  {
    std::lock_guard event_lock(event->mutex);
    if (const auto captured = live_capture_of(*event)) {
      captured->invalidated = true;
      return CUDA_ERROR_CAPTURED_EVENT;
    }
    record = record_to_wait_for(*event);
  }
  const int device = event->context->device->ordinal;
  lock.unlock();
  await_record(event, record);
  lock.lock();
  release_past_thresholds(s, device);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamWaitEvent(CUstream stream_handle, CUevent handle, unsigned flags) {
  SIM_BEGIN(cuStreamWaitEvent);
  (void)flags;
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  SIM_STREAM(stream, stream_handle);
  std::shared_ptr<Capture> captured;
  SimStream* captured_on = nullptr;
  std::size_t captured_at = 0;
  RecordWaitedFor record;
  {
    std::lock_guard event_lock(event->mutex);
    captured = live_capture_of(*event);
    captured_on = event->captured_on;
    captured_at = event->captured_at;
    record = record_to_wait_for(*event);
  }
  Capture* mine = capture_of(s, stream);
  if (captured) {
    if (mine && mine != captured.get()) {
      mine->invalidated = true;  // (two captures may not depend on each other)
      return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (stream == stream->context()->legacy) {
      captured->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    if (!mine) s.captures[stream.get()] = captured;  // a fork: the stream joins the capture
    // The stream now depends on the capture's work up to the event: work
    // that the event's stream had not had joined back is joined into this
    // one, which must be joined back in turn unless it is the origin. (A
    // fork whose stream captures nothing needs no join.)
    const auto waited = captured->unjoined.find(captured_on);
    if (captured_on != stream.get() && waited != captured->unjoined.end() && waited->second <= captured_at) {
      if (stream.get() != captured->origin) {
        std::size_t& own = captured->unjoined[stream.get()];
        own = std::max(own, waited->second);
      }
      captured->unjoined.erase(waited);
    }
    return CUDA_SUCCESS;
  }
  if (Capture* capture = capture_of(s, stream)) {  // an event from outside the capture
    capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  return run_on_stream(s, stream_handle, [event, record = std::move(record)] { await_record(event, record); });
}

namespace {
CUresult elapsed_time(float* milliseconds, CUevent start_handle, CUevent end_handle) {
  SIM_BEGIN(cuEventElapsedTime);
  if (!milliseconds) return CUDA_ERROR_INVALID_VALUE;
  auto start = find_event(s, start_handle);
  auto end = find_event(s, end_handle);
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  // (One event may be both: a time of zero, and its mutex locked once.)
  std::unique_lock start_lock(start->mutex, std::defer_lock);
  std::unique_lock end_lock(end->mutex, std::defer_lock);
  if (end == start) {
    start_lock.lock();
  } else {
    std::lock(start_lock, end_lock);
  }
  if (start->recorded == 0 || end->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
  start->settle();
  end->settle();
  if (start->completed < start->recorded || end->completed < end->recorded) return CUDA_ERROR_NOT_READY;
  *milliseconds = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) { return elapsed_time(ms, a, b); }
SIM_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) { return elapsed_time(ms, a, b); }
