// cuemm/runtime/device.hpp: the GPUs the driver sees.
//
//   for (int i = 0; i < cuemm::Device::count(); ++i) {
//     cuemm::Device& device = cuemm::Device::get(i);
//     std::cout << device.name() << " " << device.uuid() << "\n";
//   }
//
// Devices live until the process exits. The first call of any member loads
// the driver.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/memory/ipc_handle.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

class Context;

class Device {
 public:
  static int count();
  // InvalidArgument naming the ordinal and the device count when out of range.
  static Device& get(int ordinal);
  // The device with this PCI identity; InvalidArgument when no device has it.
  static Device& from_identity(const DeviceIdentity& identity);

  int id() const noexcept { return ordinal_; }
  const std::string& name() const noexcept { return name_; }
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  const std::string& uuid() const noexcept { return uuid_; }
  DeviceIdentity identity() const;
  int attribute(int attribute) const;
  std::pair<int, int> compute_capability() const;
  bool can_map_host_memory() const;
  // Bytes of memory on the device (cuDeviceTotalMem).
  std::size_t total_memory() const;
  bool can_access_peer(const Device& peer) const;

  // The primary context, retained (and prepared for use) on first call.
  Context& primary_context();
  // Drops our reference to the primary context (the driver's retain count).
  void release_primary_context();
  // Resets the primary context: its memory manager releases everything, the
  // driver destroys the context's resources. Pointers into it become dead.
  void reset();

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

 private:
  explicit Device(int ordinal);
  friend struct DeviceTable;

  int ordinal_;
  std::string name_;
  std::string uuid_;
  BlockingAwareMutex mutex_;
  std::unique_ptr<Context> primary_;
  bool retained_ = false;
};

}  // namespace cuemm
