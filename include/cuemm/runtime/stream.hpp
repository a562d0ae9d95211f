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

namespace cuemm {

class Context;
class Event;

class Stream {
 public:
  Stream() = default;  // the legacy default stream
  static Stream legacy_default() { return Stream(nullptr, cuda::CU_STREAM_LEGACY, false); }
  static Stream per_thread_default() { return Stream(nullptr, cuda::CU_STREAM_PER_THREAD, false); }
  Stream(Context* context, cuda::CUstream handle, bool owned);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  cuda::CUstream handle() const noexcept { return handle_; }
  Context* context() const noexcept { return context_; }
  bool is_default() const noexcept { return cuda::is_default_stream(handle_); }

  void synchronize() const;
  // True when all work queued so far has completed.
  bool query() const;
  void wait_event(const Event& event) const;
  // Runs `callback` on a driver thread once all earlier work has completed.
  // It must not call the driver.
  void add_callback(std::function<void()> callback) const;

 private:
  void release() noexcept;
  Context* context_ = nullptr;
  cuda::CUstream handle_ = nullptr;
  bool owned_ = false;
  std::uint64_t generation_ = 0;
};

class Event {
 public:
  Event(Context* context, cuda::CUevent handle);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  cuda::CUevent handle() const noexcept { return handle_; }
  void record(const Stream& stream = Stream()) const;
  void synchronize() const;
  // True when the work before the last record() has completed.
  bool query() const;
  void wait(const Stream& stream) const;
  // Milliseconds between two recorded, completed events.
  static float elapsed_time(const Event& start, const Event& end);

 private:
  void release() noexcept;
  Context* context_ = nullptr;
  cuda::CUevent handle_ = nullptr;
  std::uint64_t generation_ = 0;
};

}  // namespace cuemm
