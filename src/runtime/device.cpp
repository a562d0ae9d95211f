#include "cuemm/runtime/device.hpp"

#include <cstdio>
#include <map>
#include <vector>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

// All devices, and which Context each driver context handle belongs to.
struct DeviceTable {
  BlockingAwareMutex mutex;
  bool counted = false;
  int count = 0;
  std::vector<std::unique_ptr<Device>> devices;
  std::map<cuda::CUcontext, Context*> contexts;

  static DeviceTable& instance() {
    static DeviceTable* table = new DeviceTable();  // never destroyed: memory may be freed at exit
    return *table;
  }
  static Device* make(int ordinal) { return new Device(ordinal); }
};

namespace detail {
Context* find_context(cuda::CUcontext handle) {
  auto& table = DeviceTable::instance();
  std::lock_guard lock(table.mutex);
  auto it = table.contexts.find(handle);
  return it == table.contexts.end() ? nullptr : it->second;
}
}  // namespace detail

int Device::count() {
  auto& table = DeviceTable::instance();
  std::lock_guard lock(table.mutex);
  if (!table.counted) {
    CUEMM_CU(cuDeviceGetCount, &table.count);
    table.devices.resize(static_cast<std::size_t>(table.count));
    table.counted = true;
  }
  return table.count;
}

Device& Device::get(int ordinal) {
  const int devices = count();
  if (ordinal < 0 || ordinal >= devices) {
    throw InvalidArgument("device " + std::to_string(ordinal) + " does not exist (the driver sees " +
                          std::to_string(devices) + " device(s))");
  }
  auto& table = DeviceTable::instance();
  std::lock_guard lock(table.mutex);
  auto& slot = table.devices[static_cast<std::size_t>(ordinal)];
  if (!slot) slot.reset(DeviceTable::make(ordinal));
  return *slot;
}

Device& Device::from_identity(const DeviceIdentity& identity) {
  for (int i = 0; i < count(); ++i) {
    Device& device = get(i);
    if (device.identity() == identity) return device;
  }
  throw InvalidArgument("no device has identity " + identity.to_string() +
                        "; the source device may not be visible in this process");
}

Device::Device(int ordinal) : ordinal_(ordinal) {
  char name[256] = {};
  CUEMM_CU(cuDeviceGetName, name, static_cast<int>(sizeof name - 1), ordinal);
  name_ = name;
  cuda::CUuuid uuid{};
  CUEMM_CU(cuDeviceGetUuid, &uuid, ordinal);
  char text[64];
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  uuid_ = text;
}

int Device::attribute(int attribute) const {
  int value = 0;
  CUEMM_CU(cuDeviceGetAttribute, &value, attribute, ordinal_);
  return value;
}

DeviceIdentity Device::identity() const {
  return {attribute(cuda::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID), attribute(cuda::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
          attribute(cuda::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)};
}

std::pair<int, int> Device::compute_capability() const {
  return {attribute(cuda::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
          attribute(cuda::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)};
}

bool Device::can_map_host_memory() const { return attribute(cuda::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) != 0; }

std::size_t Device::total_memory() const {
  std::size_t bytes = 0;
  CUEMM_CU(cuDeviceTotalMem, &bytes, ordinal_);
  return bytes;
}

bool Device::can_access_peer(const Device& peer) const {
  int can = 0;
  CUEMM_CU(cuDeviceCanAccessPeer, &can, ordinal_, peer.ordinal_);
  return can != 0;
}

Context& Device::primary_context() {
  bool prepare = false;
  {
    std::lock_guard lock(mutex_);
    if (!retained_) {
      cuda::CUcontext handle = nullptr;
      CUEMM_CU(cuDevicePrimaryCtxRetain, &handle, ordinal_);
      if (!primary_) {
        try {
          primary_ = std::make_unique<Context>(*this, handle);
        } catch (...) {
          CUEMM_CU_RESULT(cuDevicePrimaryCtxRelease, ordinal_);
          throw;
        }
        auto& table = DeviceTable::instance();
        std::lock_guard table_lock(table.mutex);
        table.contexts[handle] = primary_.get();
      }
      retained_ = true;
      prepare = true;
    }
  }
  if (prepare) primary_->prepare_for_use();
  return *primary_;
}

void Device::release_primary_context() {
  std::lock_guard lock(mutex_);
  if (!retained_) return;
  CUEMM_CU(cuDevicePrimaryCtxRelease, ordinal_);
  retained_ = false;
}

void Device::reset() {
  Context* primary = nullptr;
  {
    std::lock_guard lock(mutex_);
    primary = primary_.get();
  }
  if (primary) {
    primary->reset();
    primary->forget_driver_objects();
  }
  release_primary_context();
  CUEMM_CU(cuDevicePrimaryCtxReset, ordinal_);
}

}  // namespace cuemm
