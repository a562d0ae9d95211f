// cuemm/runtime/stream.hpp: streams and events.
//
// Stream and Event are move-only owners of a driver handle. Destroying one
// queues the driver release on its context's deallocation queue (never the
// memory manager's), so a stream can be dropped while its work still runs.
// A default-constructed Stream is the legacy default stream (handle 0).
//
//   cuemm::Stream stream = context.create_stream();
//   cuemm::Event done = context.create_event();
//   ...work on stream...
//   done.record(stream);
//   done.synchronize();
#pragma once

#include <cstdint>
#include <functional>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/runtime/detail/context_owned_handle.hpp"

namespace cuemm {

class Context;
class Event;

class Stream {
 public:
  Stream() = default;  // the legacy default stream
  static Stream legacy_default() { return Stream(nullptr, cuda::CU_STREAM_LEGACY, false); }
  static Stream per_thread_default() { return Stream(nullptr, cuda::CU_STREAM_PER_THREAD, false); }
  Stream(Context* context, cuda::CUstream handle, bool owned);

  cuda::CUstream handle() const noexcept { return static_cast<cuda::CUstream>(handle_.get()); }
  Context* context() const noexcept { return handle_.context(); }
  bool is_default() const noexcept { return cuda::is_default_stream(handle()); }

  void synchronize() const;
  // True when all work queued so far has completed.
  bool query() const;
  void wait_event(const Event& event) const;
  // Runs `callback` on a driver thread once all earlier work has completed.
  // It must not call the driver. What it throws comes out of this stream's
  // next synchronize() (or its context's), the first of them only.
  void add_callback(std::function<void()> callback) const;

 private:
  detail::ContextOwnedHandle handle_;
};

class Event {
 public:
  Event(Context* context, cuda::CUevent handle);

  cuda::CUevent handle() const noexcept { return static_cast<cuda::CUevent>(handle_.get()); }
  Context* context() const noexcept { return handle_.context(); }
  void record(const Stream& stream = Stream()) const;
  void synchronize() const;
  // True when the work before the last record() has completed.
  bool query() const;
  void wait(const Stream& stream) const;
  // Milliseconds between two recorded, completed events.
  static float elapsed_time(const Event& start, const Event& end);

 private:
  detail::ContextOwnedHandle handle_;
};

}  // namespace cuemm
