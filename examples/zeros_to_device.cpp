// The seed's example in C++: ten zeros to the device, release them, and show
// what the memory manager did. Runs on a GPU or, without one, on the
// simulated driver.
//
//   ./zeros_to_device
//   CUEMM_MEMORY_MANAGER=/path/libcuemm_counting_plugin.so ./zeros_to_device
#include <cstdio>
#include <vector>

#include "cuemm/cuemm.hpp"

int main() {
  try {
    cuemm::Context& context = cuemm::current_context();
    const auto& driver = cuemm::driver::Driver::get();
    std::printf("driver:         %s (%s, version %d)\n", driver.library_path().c_str(),
                driver.is_simulated() ? "simulated" : "CUDA", driver.version());
    std::printf("device:         %d %s %s\n", context.device().id(), context.device().name().c_str(),
                context.device().uuid().c_str());
    std::printf("memory manager: %s\n", cuemm::memory_manager_name().c_str());

    const cuemm::MemoryInfo before = context.get_memory_info();
    std::vector<double> zeros(10, 0.0);
    {
      auto on_device = cuemm::to_device(zeros);
      std::printf("to_device:      %zu bytes at 0x%llx\n", on_device.nbytes(),
                  static_cast<unsigned long long>(on_device.device_pointer()));
      const bool round_trip = on_device.copy_to_host() == zeros;
      std::printf("copy_to_host:   %s\n", round_trip ? "10 zeros, as sent" : "MISMATCH");
      if (!round_trip) return 1;
    }  // released here: its finalizer gives the memory back to the manager

    if (auto* numba_like = dynamic_cast<cuemm::HostOnlyMemoryManager*>(&context.memory_manager())) {
      std::printf("released:       %zu free(s) pending (deferred until more than %zu are)\n",
                  numba_like->deallocations().pending_count(), numba_like->deallocations().max_count());
      numba_like->deallocations().flush();
      std::printf("flushed:        %zu pending\n", numba_like->deallocations().pending_count());
    }
    if (cuemm::simulation::active()) {
      std::printf("driver calls:   cuMemAlloc %llu, cuMemFree %llu\n",
                  static_cast<unsigned long long>(cuemm::simulation::call_count("cuMemAlloc")),
                  static_cast<unsigned long long>(cuemm::simulation::call_count("cuMemFree")));
    }
    const cuemm::MemoryInfo after = context.get_memory_info();
    std::printf("device memory:  %zu of %zu bytes free before, %zu after\n", before.free, before.total, after.free);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zeros_to_device: %s\n", error.what());
    return 1;
  }
}
