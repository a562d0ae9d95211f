#include "cuemm/driver/simulation.hpp"

#include "cuemm/driver/driver.hpp"

namespace cuemm::simulation {
namespace {

template <typename Function>
Function control(const char* name) {
  const driver::Driver& loaded = driver::Driver::get();
  if (!loaded.is_simulated())
    throw StateError(std::string("cuemm::simulation::") + name + " needs the simulated driver, but " +
                     loaded.library_path() + " is loaded");
  auto function = reinterpret_cast<Function>(loaded.symbol(name));
  if (!function) throw StateError(std::string("the simulated driver lacks ") + name);
  return function;
}

}  // namespace

bool active() { return driver::Driver::get().is_simulated(); }

std::uint64_t call_count(const std::string& function) {
  const auto count = control<unsigned long long (*)(const char*)>("cuemmSimCallCount")(function.c_str());
  if (count == ~0ull) throw InvalidArgument("the simulated driver has no function named '" + function + "'");
  return count;
}

void reset_call_counts() { control<void (*)()>("cuemmSimResetCallCounts")(); }

void inject_fault(const std::string& function, std::uint64_t nth, cuda::CUresult result, std::uint64_t times) {
  using Inject = int (*)(const char*, unsigned long long, int, unsigned long long);
  if (control<Inject>("cuemmSimInjectFault")(function.c_str(), nth, result, times) != 0)
    throw InvalidArgument("the simulated driver has no function named '" + function + "'");
}

void clear_faults() { control<void (*)()>("cuemmSimClearFaults")(); }

void set_device_attribute(int device, cuda::DeviceAttribute attribute, int value) {
  if (control<int (*)(int, int, int)>("cuemmSimSetDeviceAttribute")(device, attribute, value) != 0)
    throw InvalidArgument("the simulated driver has no device " + std::to_string(device) + " or attribute " +
                          std::to_string(attribute));
}

std::uint64_t live_allocations(AllocationKind kind) {
  return control<unsigned long long (*)(int)>("cuemmSimLiveAllocations")(static_cast<int>(kind));
}

std::uint64_t live_streams() { return control<unsigned long long (*)()>("cuemmSimLiveStreams")(); }

const int* driver_calls_under_way() { return control<int* (*)()>("cuemmSimDriverCallsUnderWay")(); }

std::uint64_t device_bytes_in_use(int device) {
  return control<unsigned long long (*)(int)>("cuemmSimDeviceBytesInUse")(device);
}

}  // namespace cuemm::simulation
