// sim/api/devices.cpp: the simulated driver's cuInit, versions, error names,
// devices and their attributes.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

SIM_EXPORT CUresult cuInit(unsigned flags) {
  SIM_ENTER(cuInit);
  if (forked_after_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.initialized) return CUDA_SUCCESS;
  const char* count_text = std::getenv("CUEMM_SIM_DEVICES");
  const int count = count_text ? std::atoi(count_text) : 1;
  if (count <= 0) return CUDA_ERROR_NO_DEVICE;
  const std::size_t capacity = bytes_from_environment("CUEMM_SIM_MEMORY", 16ull << 30);
  const char* peer = std::getenv("CUEMM_SIM_PEER_ACCESS");
  s.peer_access = peer && std::atoi(peer) != 0;
  for (int i = 0; i < count; ++i) {
    auto device = std::make_unique<Device>();
    device->ordinal = i;
    device->capacity = cuemm::util::round_up(capacity, kDevicePage);
    s.devices.push_back(std::move(device));
  }
  s.initialized = true;
  watch_for_forks();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDriverGetVersion(int* version) {
  SIM_ENTER(cuDriverGetVersion);
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

namespace {
struct ErrorName {
  int code;
  const char* name;
};
constexpr ErrorName kErrorNames[] = {
#include "driver/error_names.inc"
};
const char* error_name(CUresult code) {
  for (const auto& entry : kErrorNames) {
    if (entry.code == code) return entry.name;
  }
  return nullptr;
}
}  // namespace

SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  SIM_ENTER(cuGetErrorName);
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  *name = error_name(error);
  return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  SIM_ENTER(cuGetErrorString);
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  *text = error_name(error);
  return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// --- Devices ----------------------------------------------------------------

SIM_EXPORT CUresult cuDeviceGetCount(int* count) {
  SIM_BEGIN(cuDeviceGetCount);
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(s.devices.size());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  SIM_BEGIN(cuDeviceGet);
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!device_at(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceGetName);
  SIM_DEVICE(ordinal);
  if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(length), "%s", kDeviceName);
  return CUDA_SUCCESS;
}

namespace cuemm::sim {
// An H100-like device, unless a test said otherwise. Attributes not listed
// read as 0, as unsupported ones do.
int attribute_value(const Device& device, int attribute) {
  if (auto it = device.attribute_overrides.find(attribute); it != device.attribute_overrides.end()) return it->second;
  switch (attribute) {
    case 1: return 1024;                 // MAX_THREADS_PER_BLOCK
    case 2: case 3: return 1024;         // MAX_BLOCK_DIM_X, Y
    case 4: return 64;                   // MAX_BLOCK_DIM_Z
    case 5: return 2147483647;           // MAX_GRID_DIM_X
    case 6: case 7: return 65535;        // MAX_GRID_DIM_Y, Z
    case 8: return 49152;                // MAX_SHARED_MEMORY_PER_BLOCK
    case 9: return 65536;                // TOTAL_CONSTANT_MEMORY
    case 10: return 32;                  // WARP_SIZE
    case 11: return 2147483647;          // MAX_PITCH
    case 12: return 65536;               // MAX_REGISTERS_PER_BLOCK
    case 13: return 1755000;             // CLOCK_RATE (kHz)
    case 14: return 512;                 // TEXTURE_ALIGNMENT
    case 15: return 1;                   // GPU_OVERLAP
    case 16: return 132;                 // MULTIPROCESSOR_COUNT
    case 19: return 1;                   // CAN_MAP_HOST_MEMORY
    case 31: return 1;                   // CONCURRENT_KERNELS
    case 32: return 1;                   // ECC_ENABLED
    case 33: return 0x10 + device.ordinal;  // PCI_BUS_ID
    case 36: return 2619000;             // MEMORY_CLOCK_RATE (kHz)
    case 37: return 5120;                // GLOBAL_MEMORY_BUS_WIDTH
    case 38: return 52428800;            // L2_CACHE_SIZE
    case 39: return 2048;                // MAX_THREADS_PER_MULTIPROCESSOR
    case 40: return 3;                   // ASYNC_ENGINE_COUNT
    case 41: return 1;                   // UNIFIED_ADDRESSING
    case 75: return 9;                   // COMPUTE_CAPABILITY_MAJOR
    case 76: return 0;                   // COMPUTE_CAPABILITY_MINOR
    case 78: case 79: case 80: return 1;  // STREAM_PRIORITIES, GLOBAL_L1, LOCAL_L1
    case 81: return 233472;              // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82: return 65536;               // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 83: return 1;                   // MANAGED_MEMORY
    case 89: return 1;                   // CONCURRENT_MANAGED_ACCESS
    case 90: return 1;                   // COMPUTE_PREEMPTION_SUPPORTED
    case 91: return 1;                   // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    case 95: return 1;                   // COOPERATIVE_LAUNCH
    case 97: return 232448;              // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 102: return 1;                  // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    case 103: return 1;                  // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    case 106: return 32;                 // MAX_BLOCKS_PER_MULTIPROCESSOR
    case 115: return 1;                  // MEMORY_POOLS_SUPPORTED
    default: return 0;
  }
}
}  // namespace cuemm::sim

SIM_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceGetAttribute);
  SIM_DEVICE(ordinal);
  if (!value || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  *value = attribute_value(*device, attribute);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceComputeCapability);
  SIM_DEVICE(ordinal);
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  *major = attribute_value(*device, 75);
  *minor = attribute_value(*device, 76);
  return CUDA_SUCCESS;
}

namespace {
CUresult device_uuid(CUuuid* uuid, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceGetUuid);
  SIM_DEVICE(ordinal);
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  // Stable per ordinal, so another process sees the same identity.
  const char pattern[16] = {'c', 'u', 'e', 'm', 'm', '-', 's', 'i', 'm', 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(uuid->bytes, pattern, sizeof pattern);
  uuid->bytes[15] = static_cast<char>(device->ordinal);
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice ordinal) { return device_uuid(uuid, ordinal); }
SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice ordinal) { return device_uuid(uuid, ordinal); }

SIM_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceTotalMem);
  SIM_DEVICE(ordinal);
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = device->capacity;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceCanAccessPeer(int* can, CUdevice ordinal, CUdevice peer) {
  SIM_BEGIN(cuDeviceCanAccessPeer);
  SIM_DEVICE(ordinal);
  if (!can || !device_at(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = (s.peer_access && ordinal != peer) ? 1 : 0;
  return CUDA_SUCCESS;
}
