// The importing process of the IPC tests.
//
// ipc_child HEX DEVICE COUNT FIRST MODE
//   Opens the serialised handle HEX in device DEVICE's primary context, checks
//   that it holds COUNT uint32 values FIRST, FIRST+1, ..., checks that a second
//   open and a close of an unopened handle are refused, and, in mode "direct",
//   adds 1000 to each with a kernel of DEVICE (a peer's, where DEVICE is not
//   the memory's) so the exporter can see the memory is shared.
//   Exit status 0 means every check held; otherwise stderr says which failed.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cuemm/cuemm.hpp"

using namespace cuemm;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: ipc_child HEX DEVICE COUNT FIRST direct|staged\n");
    return 2;
  }
  try {
    IpcHandle handle = IpcHandle::from_hex(argv[1]);
    Context& context = Device::get(std::atoi(argv[2])).primary_context();
    const std::size_t count = std::strtoull(argv[3], nullptr, 10);
    const auto first = static_cast<std::uint32_t>(std::strtoul(argv[4], nullptr, 10));
    const std::string mode = argv[5];

    DeviceArray<std::uint32_t> array = open_array<std::uint32_t>(handle, context, count);
    if (handle.is_staged() != (mode == "staged")) {
      std::fprintf(stderr, "expected a %s open, got %s\n", mode.c_str(), handle.is_staged() ? "staged" : "direct");
      return 1;
    }
    std::vector<std::uint32_t> values = array.copy_to_host();
    for (std::size_t i = 0; i < count; ++i) {
      if (values[i] != first + i) {
        std::fprintf(stderr, "value %zu is %u, expected %zu\n", i, values[i], first + i);
        return 1;
      }
    }
    try {
      handle.open(context);
      std::fprintf(stderr, "a second open was accepted\n");
      return 1;
    } catch (const StateError&) {
    }
    if (mode == "direct") {
      std::ifstream file(CUEMM_TEST_KERNELS_PTX);
      std::stringstream ptx;
      ptx << file.rdbuf();
      ScopedContext scope(context);
      Module module = context.load_module(ptx.str());
      Stream stream = context.create_stream();
      const std::uint64_t words = count;
      module.function("cuemm_add_u32").launch({64}, {256}, stream, array.device_pointer(), 1000u, words);
      stream.synchronize();
    }
    handle.close();
    try {
      handle.close();
      std::fprintf(stderr, "closing a closed handle was accepted\n");
      return 1;
    } catch (const StateError&) {
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ipc_child: %s\n", error.what());
    return 1;
  }
}
