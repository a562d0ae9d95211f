#include "cuemm/managers/detail/expandable_arena.hpp"

#include <unistd.h>

#include <algorithm>

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/runtime/device.hpp"
#include "driver/mapping.hpp"
#include "memory/descriptor_passing.hpp"
#include "util/hex_address.hpp"
#include "util/round_up.hpp"

namespace cuemm::detail {

ExpandableArena::~ExpandableArena() { release(); }

cuda::CUmemAllocationProp ExpandableArena::properties() const noexcept {
  cuda::CUmemAllocationProp properties{};
  properties.type = cuda::CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {cuda::CU_MEM_LOCATION_TYPE_DEVICE, device_};
  if (shareable_) properties.requested_handle_types = cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return properties;
}

void ExpandableArena::require_support(int device) {
  if (Device::get(device).attribute(cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0) {
    throw CudaError(cuda::CUDA_ERROR_NOT_SUPPORTED, "cuMemCreate",
                    "device " + std::to_string(device) +
                        " has no virtual memory management, which the expandable pool (CUEMM_POOL_EXPANDABLE=1) "
                        "maps its memory with; use the pool without it");
  }
}

void ExpandableArena::reserve(std::size_t bytes) {
  if (base_) return;
  require_support(device_);
  access_ = driver::read_write_access_with_peers(device_);
  int shareable = 0;
  shareable_ = CUEMM_CU_RESULT(cuDeviceGetAttribute, &shareable,
                               cuda::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               device_) == cuda::CUDA_SUCCESS &&
               shareable != 0;
  const cuda::CUmemAllocationProp wanted = properties();
  std::size_t granularity = 0;
  CUEMM_CU(cuMemGetAllocationGranularity, &granularity, &wanted, cuda::CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (granularity == 0) throw Error("cuMemGetAllocationGranularity gave 0 for device " + std::to_string(device_));
  granularity_ = granularity;
  const std::size_t rounded = util::round_up(bytes, granularity);
  CUEMM_CU_ALLOC(rounded, cuMemAddressReserve, &base_, rounded, 0, 0, 0);
  reserved_ = rounded;
}

bool ExpandableArena::grow(std::size_t bytes) {
  if (bytes == 0 || bytes % granularity_)
    throw InvalidArgument("ExpandableArena::grow: " + std::to_string(bytes) + " bytes is not a multiple of the " +
                          std::to_string(granularity_) + "-byte granularity");
  if (mapped_ + bytes > reserved_) return false;
  mappings_.reserve(mappings_.size() + 1);
  const cuda::CUmemAllocationProp wanted = properties();
  cuda::CUmemGenericAllocationHandle handle = 0;
  const cuda::CUresult created = CUEMM_CU_RESULT(cuMemCreate, &handle, bytes, &wanted, 0);
  if (created == cuda::CUDA_ERROR_OUT_OF_MEMORY) return false;
  if (created != cuda::CUDA_SUCCESS) driver::throw_allocation_error(created, "cuMemCreate", bytes);
  if (const driver::MappingResult mapped = driver::map_read_write(base_ + mapped_, bytes, handle, access_); !mapped) {
    CUEMM_CU_RESULT(cuMemRelease, handle);
    if (mapped.result == cuda::CUDA_ERROR_OUT_OF_MEMORY) return false;
    driver::throw_allocation_error(mapped.result, mapped.call, bytes);
  }
  mappings_.push_back({mapped_, bytes, handle});
  mapped_ += bytes;
  return true;
}

std::size_t ExpandableArena::mapping_end_at_or_after(std::size_t offset) const {
  // From the end: the pool cuts only its free tail, a few mappings.
  std::size_t end = mapped_;
  for (auto it = mappings_.rbegin(); it != mappings_.rend() && it->offset >= offset; ++it) end = it->offset;
  return end;
}

MappedExport ExpandableArena::share(std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first) {
  // (Its start must lie in a mapping even for 0 bytes: that mapping is the first piece.)
  if (!base_ || address < base_ || address - base_ >= mapped_ || bytes > mapped_ - (address - base_)) {
    throw InvalidArgument("get_ipc_handle: " + util::hex_address(address) + " (" + describe_bytes(bytes) +
                          ") is not mapped memory of the pool's arena");
  }
  if (!shareable_) {
    throw NotSupported("get_ipc_handle: device " + std::to_string(device_) +
                       " cannot share the pool's expandable arena (no POSIX file descriptor handles for "
                       "cuMemCreate); blocks of a segment of their own, or a pool without the option, can be");
  }
  const std::size_t start = address - base_;
  // The mapping that holds `start`: the last one that starts at or before it.
  auto first = std::prev(std::upper_bound(mappings_.begin(), mappings_.end(), start,
                                          [](std::size_t at, const Mapping& mapping) { return at < mapping.offset; }));
  MappedExport exported;
  exported.pid = static_cast<std::int32_t>(getpid());
  offset_in_first = start - first->offset;
  for (auto it = first; it != mappings_.end() && it->offset < start + std::max<std::size_t>(bytes, 1); ++it) {
    if (it->offered == 0) {
      int descriptor = -1;
      CUEMM_CU(cuMemExportToShareableHandle, &descriptor, it->handle, cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
               0);
      it->offered = offer_descriptor(descriptor);
    }
    exported.pieces.push_back({it->offered, it->size});
  }
  return exported;
}

void ExpandableArena::unmap_last() noexcept {
  const Mapping last = mappings_.back();
  if (last.offered) withdraw_descriptor(last.offered);  // importers keep what they mapped
  CUEMM_CU_RESULT(cuMemUnmap, base_ + last.offset, last.size);
  CUEMM_CU_RESULT(cuMemRelease, last.handle);
  mappings_.pop_back();
  mapped_ = last.offset;
}

std::size_t ExpandableArena::shrink_to(std::size_t offset) {
  const std::size_t before = mapped_;
  while (!mappings_.empty() && mappings_.back().offset >= offset) unmap_last();
  return before - mapped_;
}

void ExpandableArena::release() noexcept {
  if (!base_) return;
  while (!mappings_.empty()) unmap_last();
  CUEMM_CU_RESULT(cuMemAddressFree, base_, reserved_);
  base_ = 0;
  reserved_ = 0;
}

}  // namespace cuemm::detail
