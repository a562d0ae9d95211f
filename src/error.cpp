#include "cuemm/error.hpp"

#include <cstdio>

#include "cuemm/driver/driver.hpp"
#include "util/byte_size.hpp"

namespace cuemm {
namespace {

struct ErrorName {
  int code;
  const char* name;
};
// The driver's own names, so messages need no driver call (and work while
// the driver is still loading).
constexpr ErrorName kErrorNames[] = {
#include "driver/error_names.inc"
};

// What a graph capture's refusal of a call means for cuemm, which the
// driver's code alone does not say: a capture that nobody announced meets
// the managers' allocations and seals. (Not for a capture found ended,
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: its cause came earlier, where it
// was refused and said so, and capture_graph, whose scope is open, names
// the causes that remain.)
std::string capture_hint(cuda::CUresult code) {
  if (code != cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && code != cuda::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    return {};
  return "a stream is being captured into a CUDA graph, which forbids this call; cuemm's managers allocate, "
         "free and seal through the driver, which a capture allows only when it is opened inside a "
         "cuemm::CaptureScope (cuemm/runtime/capture_scope.hpp)";
}

// What the driver's code alone does not say: in a child forked after the
// driver was loaded, every driver error has one cause (Note [A child forked
// after the driver was loaded], driver.hpp); elsewhere, a capture's refusal.
std::string hint_for(cuda::CUresult code) {
  if (driver::in_forked_child()) {
    return "this process was forked from one that had initialized CUDA, and CUDA cannot be used in such a "
           "child: fork before the parent's first CUDA call, or start the process afresh (multiprocessing's "
           "'spawn' start method)";
  }
  return capture_hint(code);
}

std::string compose(const std::string& name, const std::string& call, const std::string& detail,
                    const std::string& hint = {}) {
  std::string message = "[" + name + "] Call to " + call + " results in " + name;
  const std::string said = detail.empty() ? hint : hint.empty() ? detail : detail + "; " + hint;
  if (!said.empty()) message += " (" + said + ")";
  return message;
}

}  // namespace

std::string error_name(cuda::CUresult code) {
  for (const auto& entry : kErrorNames) {
    if (entry.code == code) return entry.name;
  }
  return "CUDA_ERROR_" + std::to_string(code);
}

std::string describe_bytes(std::size_t bytes) {
  const util::ScaledBytes scaled = util::scale_byte_size(bytes);
  char text[64];
  if (bytes < 1024) {
    std::snprintf(text, sizeof text, "%zu bytes", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.2f %s (%zu bytes)", scaled.value, scaled.unit, bytes);
  }
  return text;
}

CudaError::CudaError(cuda::CUresult code, std::string call, const std::string& detail)
    : CudaError(code, call, error_name(code),
                compose(error_name(code), call, detail, hint_for(code))) {}

CudaError::CudaError(cuda::CUresult code, std::string call, std::string code_name, const std::string& message)
    : Error(message), code_(code), call_(std::move(call)), code_name_(std::move(code_name)) {}

OutOfMemory::OutOfMemory(std::string call, std::size_t requested, const std::string& detail)
    : CudaError(cuda::CUDA_ERROR_OUT_OF_MEMORY, call, error_name(cuda::CUDA_ERROR_OUT_OF_MEMORY),
                compose(error_name(cuda::CUDA_ERROR_OUT_OF_MEMORY), call,
                        requested == 0 ? detail
                                       : "requested " + describe_bytes(requested) +
                                             (detail.empty() ? "" : "; " + detail))),
      requested_(requested) {}

}  // namespace cuemm
