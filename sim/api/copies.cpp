// sim/api/copies.cpp: the simulated driver's copies and memsets.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

#define SIM_CHECK_DEVICE_RANGE(pointer, bytes) \
  if (!device_accessible(s, pointer, bytes)) return CUDA_ERROR_INVALID_VALUE

SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes) {
  SIM_BEGIN(cuMemcpyHtoD);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  if (bytes && !src) return CUDA_ERROR_INVALID_VALUE;
  return run_synchronously(s, lock, dst, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes) {
  SIM_BEGIN(cuMemcpyDtoH);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  if (bytes && !dst) return CUDA_ERROR_INVALID_VALUE;
  return run_synchronously(s, lock, src, [=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  SIM_BEGIN(cuMemcpyDtoD);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  return run_synchronously(s, lock, dst, [=] {
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
  });
}

// Async copies with pageable (not page-locked) host memory behave as CUDA's:
// the source of a host-to-device copy is staged at the call, so the caller may
// reuse or free it at once; a device-to-host copy returns once it is done.
// (In a capture both read and write the host memory when the graph runs.)
namespace {
bool pageable(State& s, const void* host, std::size_t bytes) {
  return bytes && !device_accessible(s, reinterpret_cast<CUdeviceptr>(host), bytes);
}
}  // namespace

SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t bytes,
                                         CUstream stream) {
  SIM_BEGIN(cuMemcpyHtoDAsync);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  if (bytes && !src) return CUDA_ERROR_INVALID_VALUE;
  if (pageable(s, src, bytes)) {
    CUresult error = CUDA_SUCCESS;
    const auto resolved = resolve_stream(s, stream, &error);
    if (!resolved) return error;
    if (!capture_of(s, resolved)) {
      auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                        static_cast<const char*>(src) + bytes);
      return run_on_stream(s, stream, [=] { std::memcpy(reinterpret_cast<void*>(dst), staged->data(), bytes); });
    }
  }
  return run_on_stream(s, stream, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  SIM_BEGIN(cuMemcpyDtoHAsync);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  if (bytes && !dst) return CUDA_ERROR_INVALID_VALUE;
  auto copy = [=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); };
  if (pageable(s, dst, bytes)) return run_on_stream_and_wait(s, lock, stream, copy);
  return run_on_stream(s, stream, copy);
}

SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                                         CUstream stream) {
  SIM_BEGIN(cuMemcpyDtoDAsync);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  return run_on_stream(s, stream, [=] {
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
  });
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t count) {
  SIM_BEGIN(cuMemsetD8);
  SIM_CHECK_DEVICE_RANGE(dst, count);
  const bool early = memset_returns_early(s, dst);
  return run_synchronously(
      s, lock, dst, [=] { std::memset(reinterpret_cast<void*>(dst), value, count); }, /*wait=*/!early);
}

SIM_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t count,
                                    CUstream stream) {
  SIM_BEGIN(cuMemsetD8Async);
  SIM_CHECK_DEVICE_RANGE(dst, count);
  return run_on_stream(s, stream, [=] { std::memset(reinterpret_cast<void*>(dst), value, count); });
}

namespace {
void fill32(CUdeviceptr dst, unsigned value, std::size_t count) {
  auto* words = reinterpret_cast<unsigned*>(dst);
  std::fill(words, words + count, value);
}
}  // namespace

SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, std::size_t count) {
  SIM_BEGIN(cuMemsetD32);
  if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
  SIM_CHECK_DEVICE_RANGE(dst, count * 4);
  const bool early = memset_returns_early(s, dst);
  return run_synchronously(s, lock, dst, [=] { fill32(dst, value, count); }, /*wait=*/!early);
}

SIM_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, std::size_t count, CUstream stream) {
  SIM_BEGIN(cuMemsetD32Async);
  if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
  SIM_CHECK_DEVICE_RANGE(dst, count * 4);
  return run_on_stream(s, stream, [=] { fill32(dst, value, count); });
}
