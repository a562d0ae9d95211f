// A minimal external memory-manager plugin, built as its own shared library.
//
// It takes device memory straight from the driver, frees it as soon as its
// pointer goes (no deferral) and keeps a count of live bytes; host memory
// comes from HostOnlyMemoryManager. Select it without recompiling anything:
//
//   CUEMM_MEMORY_MANAGER=/path/to/libcuemm_counting_plugin.so ./your_program
//
// defer_cleanup(): device frees are never deferred; host frees are (HostOnly).
#include <atomic>
#include <cstdio>

#include "cuemm/driver/driver.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/host_only_memory_manager.hpp"
#include "cuemm/memory/registry.hpp"
#include "cuemm/runtime/context.hpp"

namespace {

class CountingMemoryManager : public cuemm::HostOnlyMemoryManager {
 public:
  explicit CountingMemoryManager(cuemm::Context* context) : HostOnlyMemoryManager(context) {}

  std::shared_ptr<cuemm::MemoryPointer> memalloc(std::size_t size) override {
    cuemm::Context& context = this->context();
    cuemm::ScopedContext scope(context);
    cuemm::cuda::CUdeviceptr pointer = 0;
    CUEMM_CU_ALLOC(size, cuMemAlloc, &pointer, size);
    live_bytes_ += size;
    auto* live = &live_bytes_;
    return std::make_shared<cuemm::MemoryPointer>(&context, pointer, size, nullptr, [&context, pointer, size, live] {
      cuemm::ScopedContext release_scope(context);
      CUEMM_CU(cuMemFree, pointer);
      *live -= size;
    });
  }
  cuemm::IpcHandle get_ipc_handle(const std::shared_ptr<cuemm::MemoryPointer>& memory) override {
    return cuemm::export_device_memory(context(), memory);
  }
  cuemm::MemoryInfo get_memory_info() override { return cuemm::driver_memory_info(context()); }

 protected:
  void on_reset() override { std::fprintf(stderr, "counting plugin: reset with %zu bytes live\n", live_bytes_.load()); }

 private:
  std::atomic<std::size_t> live_bytes_{0};
};

}  // namespace

CUEMM_EXPORT_MEMORY_MANAGER(CountingMemoryManager)
