#include "cuemm/runtime/stream.hpp"

#include <memory>
#include <utility>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"

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

}  // namespace

Stream::Stream(Context* context, cuda::CUstream handle, bool owned)
    : context_(context), handle_(handle), owned_(owned), generation_(context ? context->generation() : 0) {}

Stream::Stream(Stream&& other) noexcept
    : context_(other.context_),
      handle_(std::exchange(other.handle_, nullptr)),
      owned_(std::exchange(other.owned_, false)),
      generation_(other.generation_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    release();
    context_ = other.context_;
    handle_ = std::exchange(other.handle_, nullptr);
    owned_ = std::exchange(other.owned_, false);
    generation_ = other.generation_;
  }
  return *this;
}

Stream::~Stream() { release(); }

// Destruction is deferred through the context's queue; a reset since creation
// means the driver already destroyed the stream.
void Stream::release() noexcept {
  if (!owned_ || !handle_ || !context_ || context_->generation() != generation_) return;
  Context* context = context_;
  cuda::CUstream handle = handle_;
  context->deallocations().add([context, handle] {
    ScopedContext scope(*context);
    CUEMM_CU(cuStreamDestroy, handle);
  });
  owned_ = false;
}

void Stream::synchronize() const {
  in_context_of(context_, [&] { CUEMM_CU(cuStreamSynchronize, handle_); });
}

bool Stream::query() const {
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  in_context_of(context_, [&] { result = CUEMM_CU_RESULT(cuStreamQuery, handle_); });
  if (result == cuda::CUDA_ERROR_NOT_READY) return false;
  driver::check(result, "cuStreamQuery");
  return true;
}

void Stream::wait_event(const Event& event) const {
  in_context_of(context_, [&] { CUEMM_CU(cuStreamWaitEvent, handle_, event.handle(), 0); });
}

void Stream::add_callback(std::function<void()> callback) const {
  auto owned = std::make_unique<std::function<void()>>(std::move(callback));
  auto trampoline = [](cuda::CUstream, cuda::CUresult, void* data) {
    std::unique_ptr<std::function<void()>> function(static_cast<std::function<void()>*>(data));
    (*function)();
  };
  in_context_of(context_, [&] { CUEMM_CU(cuStreamAddCallback, handle_, trampoline, owned.get(), 0); });
  owned.release();  // the trampoline owns it now
}

Event::Event(Context* context, cuda::CUevent handle)
    : context_(context), handle_(handle), generation_(context ? context->generation() : 0) {}

Event::Event(Event&& other) noexcept
    : context_(other.context_), handle_(std::exchange(other.handle_, nullptr)), generation_(other.generation_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    release();
    context_ = other.context_;
    handle_ = std::exchange(other.handle_, nullptr);
    generation_ = other.generation_;
  }
  return *this;
}

Event::~Event() { release(); }

void Event::release() noexcept {
  if (!handle_ || !context_ || context_->generation() != generation_) return;
  Context* context = context_;
  cuda::CUevent handle = std::exchange(handle_, nullptr);
  context->deallocations().add([context, handle] {
    ScopedContext scope(*context);
    CUEMM_CU(cuEventDestroy, handle);
  });
}

void Event::record(const Stream& stream) const {
  in_context_of(context_, [&] { CUEMM_CU(cuEventRecord, handle_, stream.handle()); });
}

void Event::synchronize() const {
  in_context_of(context_, [&] { CUEMM_CU(cuEventSynchronize, handle_); });
}

bool Event::query() const {
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  in_context_of(context_, [&] { result = CUEMM_CU_RESULT(cuEventQuery, handle_); });
  if (result == cuda::CUDA_ERROR_NOT_READY) return false;
  driver::check(result, "cuEventQuery");
  return true;
}

void Event::wait(const Stream& stream) const { stream.wait_event(*this); }

float Event::elapsed_time(const Event& start, const Event& end) {
  float milliseconds = 0;
  in_context_of(start.context_, [&] { CUEMM_CU(cuEventElapsedTime, &milliseconds, start.handle_, end.handle_); });
  return milliseconds;
}

}  // namespace cuemm
