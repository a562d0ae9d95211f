#include "cuemm/runtime/device_array.hpp"

#include "cuemm/driver/driver.hpp"

namespace cuemm::detail {

void copy_host_to_device(const MemoryPointer& dst, const void* src, std::size_t bytes, const Stream& stream) {
  dst.check_alive("copy to the device");
  ScopedContext scope(*dst.context());
  if (stream.handle()) {
    CUEMM_CU(cuMemcpyHtoDAsync, dst.device_pointer(), src, bytes, stream.handle());
  } else {
    CUEMM_CU(cuMemcpyHtoD, dst.device_pointer(), src, bytes);
  }
}

void copy_device_to_host(void* dst, const MemoryPointer& src, std::size_t bytes, const Stream& stream) {
  src.check_alive("copy to the host");
  ScopedContext scope(*src.context());
  if (stream.handle()) {
    CUEMM_CU(cuMemcpyDtoHAsync, dst, src.device_pointer(), bytes, stream.handle());
  } else {
    CUEMM_CU(cuMemcpyDtoH, dst, src.device_pointer(), bytes);
  }
}

}  // namespace cuemm::detail
