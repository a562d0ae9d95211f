#include "cuemm/runtime/stream.hpp"

#include <memory>
#include <string>
#include <utility>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "callback_failures.hpp"

namespace cuemm {
namespace {

// Runs `call` with the object's context current (or whatever is current for
// default streams, which have no context of their own).
template <typename Call>
void in_context_of(Context* context, Call&& call) {
  if (context) {
    ScopedContext scope(*context);
    call();
  } else {
    call();
  }
}

// The stream a callback added now is kept under (callback_failures.hpp).
detail::CallbackStream callback_stream(Context* context, cuda::CUstream handle) {
  cuda::CUcontext current = nullptr;
  if (context) {
    current = context->handle();
  } else {
    CUEMM_CU(cuCtxGetCurrent, &current);
  }
  return {current, handle};
}

}  // namespace

Stream::Stream(Context* context, cuda::CUstream handle, bool owned)
    : handle_(context, handle,
              owned ? [](void* stream) {
                detail::forget_callback_failures(static_cast<cuda::CUstream>(stream));
                CUEMM_CU(cuStreamDestroy, static_cast<cuda::CUstream>(stream));
              }
                    : detail::ContextOwnedHandle::Destroy{}) {}

void Stream::synchronize() const {
  in_context_of(context(), [&] {
    CUEMM_CU(cuStreamSynchronize, handle());
    if (detail::callback_failures_kept()) detail::rethrow_callback_failure(callback_stream(context(), handle()));
  });
}

bool Stream::query() const {
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  in_context_of(context(), [&] { result = CUEMM_CU_RESULT(cuStreamQuery, handle()); });
  if (result == cuda::CUDA_ERROR_NOT_READY) return false;
  driver::check(result, "cuStreamQuery");
  return true;
}

void Stream::wait_event(const Event& event) const {
  in_context_of(context(), [&] { CUEMM_CU(cuStreamWaitEvent, handle(), event.handle(), 0); });
}

void Stream::add_callback(std::function<void()> callback) const {
  struct Pending {
    std::function<void()> callback;
    detail::CallbackStream where;
  };
  auto owned = std::make_unique<Pending>(Pending{std::move(callback), detail::CallbackStream{}});
  auto trampoline = [](cuda::CUstream, cuda::CUresult, void* data) {
    std::unique_ptr<Pending> pending(static_cast<Pending*>(data));
    try {
      pending->callback();
    } catch (...) {
      detail::record_callback_failure(pending->where, std::current_exception());
    }
  };
  in_context_of(context(), [&] {
    owned->where = callback_stream(context(), handle());
    CUEMM_CU(cuStreamAddCallback, handle(), trampoline, owned.get(), 0);
  });
  owned.release();  // the trampoline owns it now
}

Event::Event(Context* context, cuda::CUevent handle)
    : handle_(context, handle, [](void* event) { CUEMM_CU(cuEventDestroy, static_cast<cuda::CUevent>(event)); }) {}

void Event::record(const Stream& stream) const {
  // (The driver answers only "invalid handle"; waits, not records, may cross contexts.)
  if (stream.context() && context() && stream.context() != context()) {
    throw InvalidArgument("Event::record: the event is of device " + std::to_string(context()->device().id()) +
                          "'s context and the stream of device " + std::to_string(stream.context()->device().id()) +
                          "'s; an event records a stream of its own context (another context's stream may wait "
                          "for it: Stream::wait_event)");
  }
  in_context_of(context(), [&] { CUEMM_CU(cuEventRecord, handle(), stream.handle()); });
}

void Event::synchronize() const {
  in_context_of(context(), [&] { CUEMM_CU(cuEventSynchronize, handle()); });
}

bool Event::query() const {
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  in_context_of(context(), [&] { result = CUEMM_CU_RESULT(cuEventQuery, handle()); });
  if (result == cuda::CUDA_ERROR_NOT_READY) return false;
  driver::check(result, "cuEventQuery");
  return true;
}

void Event::wait(const Stream& stream) const { stream.wait_event(*this); }

float Event::elapsed_time(const Event& start, const Event& end) {
  float milliseconds = 0;
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  in_context_of(start.context(), [&] {
    result = CUEMM_CU_RESULT(cuEventElapsedTime, &milliseconds, start.handle(), end.handle());
  });
  if (result == cuda::CUDA_ERROR_INVALID_HANDLE)  // (what the driver answers for both, without saying which)
    throw CudaError(result, "cuEventElapsedTime",
                    "an event made without timing (create_event(false)) or not yet recorded has no time");
  driver::check(result, "cuEventElapsedTime");
  return milliseconds;
}

}  // namespace cuemm
