// callback_failures.hpp: exceptions thrown by stream callbacks, kept until
// the program waits for that stream.
//
// A callback runs on a driver thread, where an escaping exception would end
// the program. Stream::add_callback catches it here instead; the stream's
// next synchronize() (or its context's) rethrows the first one, as
// std::future::get rethrows what its task threw.
#pragma once

#include <exception>

#include "cuemm/driver/cuda_api.hpp"

namespace cuemm::detail {

// The stream a callback was added to: the default streams are one handle in
// every context, so the context is part of it.
struct CallbackStream {
  cuda::CUcontext context = nullptr;
  cuda::CUstream stream = nullptr;
  bool operator==(const CallbackStream&) const = default;
};

// Keeps `failure` for `where` (only the first until it is rethrown; later
// ones are dropped).
void record_callback_failure(CallbackStream where, std::exception_ptr failure) noexcept;

// Whether any failure is kept (no lock: for the paths that wait).
bool callback_failures_kept() noexcept;

// Rethrows, and forgets, the failure kept for `where`, if any.
void rethrow_callback_failure(CallbackStream where);

// Rethrows, and forgets, a failure kept for any stream of `context`, if any.
void rethrow_callback_failure_of_context(cuda::CUcontext context);

// Forgets the failures of `stream` in every context: it is being destroyed,
// and the driver may give its handle to a new stream.
void forget_callback_failures(cuda::CUstream stream) noexcept;

}  // namespace cuemm::detail
