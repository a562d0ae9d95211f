// A step of work captured once as a CUDA graph and launched many times, its
// scratch memory from the context's memory manager. capture_graph tells the
// manager that a capture is under way (so a pool seals nothing that would end
// it) and keeps the scratch blocks for the graph: each layer's scratch block
// is let go as soon as it is recorded, yet nothing else gets it while the
// graph may run. Runs on a GPU or, without one, on the simulated driver.
//
//   ./graph_of_steps
//   CUEMM_MEMORY_MANAGER=pool ./graph_of_steps
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuemm/cuemm.hpp"

int main() {
  try {
    cuemm::Context& context = cuemm::current_context();
    cuemm::ScopedContext current(context);
    std::printf("memory manager: %s\n", cuemm::memory_manager_name().c_str());
    const cuemm::Stream stream = context.create_stream(/*non_blocking=*/true);

    // Each layer writes its own byte into a scratch block and copies that into its output.
    constexpr int kLayers = 8;
    auto bytes_of = [](int layer) { return std::size_t{64} << (10 + layer % 4); };  // 64 KiB to 512 KiB
    std::vector<std::shared_ptr<cuemm::MemoryPointer>> outputs;
    for (int layer = 0; layer < kLayers; ++layer) outputs.push_back(context.memalloc(bytes_of(layer)));

    // Layers run one after another on one stream: a scratch block let go may
    // serve a later layer within the capture (CaptureScope::Reuse).
    cuemm::CaptureOptions options;
    options.reuse = cuemm::CaptureScope::Reuse::in_capture_order;
    const cuemm::Graph step = cuemm::capture_graph(
        stream,
        [&](const cuemm::Stream& recording) {
          for (int layer = 0; layer < kLayers; ++layer) {
            auto scratch = context.memalloc(bytes_of(layer));
            scratch->memset(static_cast<unsigned char>(layer + 1), std::nullopt, &recording);
            CUEMM_CU(cuMemcpyDtoDAsync, outputs[layer]->device_pointer(), scratch->device_pointer(), bytes_of(layer),
                     recording.handle());
          }  // each scratch block let go here: the graph keeps it
        },
        options);
    std::printf("captured:       %d layers; the graph keeps %zu scratch block(s), %zu bytes (%zu reuse(s))\n",
                kLayers, step.memory()->blocks(), step.memory()->bytes(), step.memory()->reuses());

    // Requests made while the graph lives get other memory.
    std::vector<std::shared_ptr<cuemm::MemoryPointer>> others;
    for (int i = 0; i < 64; ++i) {
      others.push_back(context.memalloc(bytes_of(i)));
      others.back()->memset(0xEE);
    }
    constexpr int kLaunches = 5;
    for (int launch = 0; launch < kLaunches; ++launch) step.launch(stream);
    stream.synchronize();
    for (int layer = 0; layer < kLayers; ++layer) {
      const auto host = cuemm::DeviceArray<unsigned char>(outputs[layer], bytes_of(layer)).copy_to_host();
      if (std::count(host.begin(), host.end(), layer + 1) != static_cast<std::ptrdiff_t>(host.size())) {
        std::printf("layer %d:        WRONG BYTES\n", layer);
        return 1;
      }
    }
    for (const auto& other : others) {
      const auto host = cuemm::DeviceArray<unsigned char>(other, other->size()).copy_to_host();
      if (std::count(host.begin(), host.end(), 0xEE) != static_cast<std::ptrdiff_t>(host.size())) {
        std::printf("a block allocated beside the graph was written by its launches\n");
        return 1;
      }
    }
    std::printf("launched:       %d times; every layer's output holds its byte, the other %zu blocks theirs\n",
                kLaunches, others.size());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "graph_of_steps: %s\n", error.what());
    return 1;
  }
}
