// sim/api/control.cpp: the simulation's own control API (sim_control.h): live
// allocations and streams, device attributes, a device's bytes in use, the
// calling thread's driver calls under way.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

SIM_EXPORT unsigned long long cuemmSimLiveAllocations(int kind) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  unsigned long long count = 0;
  for (const auto& [base, allocation] : s.allocations) {
    if (kind < 0 || static_cast<int>(allocation.kind) == kind) ++count;
  }
  return count;
}

SIM_EXPORT unsigned long long cuemmSimLiveStreams() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  unsigned long long count = 0;
  for (const auto& context : s.contexts) count += context->streams.size();
  return count;
}

SIM_EXPORT int cuemmSimSetDeviceAttribute(int ordinal, int attribute, int value) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device* device = device_at(s, ordinal);
  if (!device || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return 1;
  if (value < 0) {
    device->attribute_overrides.erase(attribute);
  } else {
    device->attribute_overrides[attribute] = value;
  }
  return 0;
}

SIM_EXPORT unsigned long long cuemmSimDeviceBytesInUse(int ordinal) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device* device = device_at(s, ordinal);
  return device ? device->used : 0;
}

SIM_EXPORT int* cuemmSimDriverCallsUnderWay() { return &driver_calls_under_way; }
