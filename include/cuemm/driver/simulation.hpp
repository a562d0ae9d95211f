// cuemm/driver/simulation.hpp: controls of the simulated driver, for tests.
//
// Lets a test count driver calls and make chosen calls fail, so that claims
// such as "this manager never calls cuMemAlloc" or "a failed cuMemHostAlloc
// leaks nothing" can be checked without a GPU. Every function throws
// StateError when the loaded driver is the real one.
//
//   cuemm::simulation::reset_call_counts();
//   run_workload();
//   EXPECT_EQ(cuemm::simulation::call_count("cuMemAlloc"), 0u);
//   cuemm::simulation::inject_fault("cuMemAlloc", 1, cuemm::cuda::CUDA_ERROR_OUT_OF_MEMORY);
#pragma once

#include <cstdint>
#include <string>

#include "cuemm/driver/cuda_api.hpp"

namespace cuemm::simulation {

// Whether the loaded driver is the simulated one (loads the driver).
bool active();

// Calls of a driver function by its API name ("cuMemAlloc"), since load or the
// last reset. InvalidArgument for a name the simulation does not know.
std::uint64_t call_count(const std::string& function);
void reset_call_counts();

// The nth call from now (1 = next) and the `times - 1` after it return `result`.
void inject_fault(const std::string& function, std::uint64_t nth, cuda::CUresult result, std::uint64_t times = 1);
void clear_faults();

enum class AllocationKind { Any = -1, Device = 0, Managed = 1, PinnedHost = 2, RegisteredHost = 3, IpcMapping = 4,
                            VirtualMapping = 5 };
std::uint64_t live_allocations(AllocationKind kind = AllocationKind::Any);
std::uint64_t device_bytes_in_use(int device);
// Makes cuDeviceGetAttribute answer `value` for a device's attribute, and the
// simulation refuse what a device without that feature refuses (virtual
// memory management, memory pools: CUDA_ERROR_NOT_SUPPORTED); a value below
// 0 restores the simulated H100's own answer.
void set_device_attribute(int device, cuda::DeviceAttribute attribute, int value);
// Streams of every live context: those created and not destroyed, and the
// per-thread default streams of threads still running.
std::uint64_t live_streams();
// The address of the calling thread's count of driver calls under way, which
// a test's replacement of operator new reads to spare the driver's own
// allocations when it makes the library's fail (the real driver lets no C++
// exception out): tests/support/host_allocation_faults.hpp.
const int* driver_calls_under_way();

}  // namespace cuemm::simulation
