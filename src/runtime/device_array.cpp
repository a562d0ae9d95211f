#include "cuemm/runtime/device_array.hpp"

#include <string>

#include "cuemm/driver/driver.hpp"
#include "util/hex_address.hpp"

namespace cuemm::detail {

namespace {
// A copy into or out of memory already given back would touch whatever the
// manager handed the bytes to since.
void check_alive(const MemoryPointer& memory, const char* copy) {
  if (!memory.is_alive()) {
    throw StateError(std::string(copy) + " of freed " + to_string(memory.kind()) + " memory at " +
                     util::hex_address(memory.device_pointer()) + " (" + std::to_string(memory.size()) + " bytes)");
  }
}
}  // namespace

void copy_host_to_device(const MemoryPointer& dst, const void* src, std::size_t bytes, const Stream& stream) {
  check_alive(dst, "copy to the device");
  ScopedContext scope(*dst.context());
  if (stream.handle()) {
    CUEMM_CU(cuMemcpyHtoDAsync, dst.device_pointer(), src, bytes, stream.handle());
  } else {
    CUEMM_CU(cuMemcpyHtoD, dst.device_pointer(), src, bytes);
  }
}

void copy_device_to_host(void* dst, const MemoryPointer& src, std::size_t bytes, const Stream& stream) {
  check_alive(src, "copy to the host");
  ScopedContext scope(*src.context());
  if (stream.handle()) {
    CUEMM_CU(cuMemcpyDtoHAsync, dst, src.device_pointer(), bytes, stream.handle());
  } else {
    CUEMM_CU(cuMemcpyDtoH, dst, src.device_pointer(), bytes);
  }
}

}  // namespace cuemm::detail
