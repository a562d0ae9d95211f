#include "cuemm/managers/detail/expandable_arena.hpp"

#include <unistd.h>

#include <algorithm>
#include <utility>

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
  std::vector<Page> pages(rounded / granularity);  // (before the reservation: this may throw)
  CUEMM_CU_ALLOC(rounded, cuMemAddressReserve, &base_, rounded, 0, 0, 0);
  reserved_ = rounded;
  pages_ = std::move(pages);
}

bool ExpandableArena::extend(std::size_t bytes) {
  if (bytes % granularity_)
    throw InvalidArgument("ExpandableArena::extend: " + std::to_string(bytes) + " bytes is not a multiple of the " +
                          std::to_string(granularity_) + "-byte granularity");
  if (bytes > reserved_ - extent_) return false;
  extent_ += bytes;
  return true;
}

ExpandableArena::PageMapping ExpandableArena::map_page(std::size_t page) {
  const cuda::CUmemAllocationProp wanted = properties();
  cuda::CUmemGenericAllocationHandle handle = 0;
  const cuda::CUresult created = CUEMM_CU_RESULT(cuMemCreate, &handle, granularity_, &wanted, 0);
  if (created != cuda::CUDA_SUCCESS) return {created, "cuMemCreate"};
  const driver::MappingResult mapped = driver::map_read_write(base_ + page * granularity_, granularity_, handle, access_);
  if (!mapped) {
    CUEMM_CU_RESULT(cuMemRelease, handle);
    return {mapped.result, mapped.call};
  }
  pages_[page].handle = handle;
  ++mapped_pages_;
  return {};
}

void ExpandableArena::unmap_page(std::size_t page) noexcept {
  Page& unmapped = pages_[page];
  if (unmapped.offered) withdraw_descriptor(std::exchange(unmapped.offered, 0));  // importers keep what they mapped
  CUEMM_CU_RESULT(cuMemUnmap, base_ + page * granularity_, granularity_);
  CUEMM_CU_RESULT(cuMemRelease, std::exchange(unmapped.handle, 0));
  --mapped_pages_;
}

bool ExpandableArena::commit(std::size_t offset, std::size_t bytes, std::size_t& mapped) {
  mapped = 0;
  if (bytes == 0) return true;
  const std::size_t first = offset / granularity_;
  const std::size_t end = std::min(util::round_up(offset + bytes, granularity_), extent_) / granularity_;
  std::vector<std::size_t> done;
  auto undo = [&] {
    for (const std::size_t page : done) unmap_page(page);
    mapped = 0;
  };
  done.reserve(end > first ? end - first : 0);
  for (std::size_t page = first; page < end; ++page) {
    if (pages_[page].handle) continue;
    const PageMapping result = map_page(page);
    if (result.result == cuda::CUDA_SUCCESS) {
      done.push_back(page);
      ++mapped;
      continue;
    }
    undo();
    if (result.result == cuda::CUDA_ERROR_OUT_OF_MEMORY) return false;
    driver::throw_allocation_error(result.result, result.call, granularity_);
  }
  return true;
}

bool ExpandableArena::committed(std::size_t offset, std::size_t bytes) const noexcept {
  const std::size_t end = util::round_up(offset + std::max<std::size_t>(bytes, 1), granularity_) / granularity_;
  for (std::size_t page = offset / granularity_; page < end; ++page)
    if (page >= pages_.size() || !pages_[page].handle) return false;
  return true;
}

std::size_t ExpandableArena::unmap_pages(std::size_t first, std::size_t end) noexcept {
  std::size_t unmapped = 0;
  for (std::size_t page = first; page < end; ++page) {
    if (!pages_[page].handle) continue;
    unmap_page(page);
    ++unmapped;
  }
  return unmapped;
}

std::size_t ExpandableArena::decommit(std::size_t offset, std::size_t bytes) noexcept {
  return unmap_pages(util::round_up(offset, granularity_) / granularity_,
                     std::min(offset + bytes, extent_) / granularity_);
}

MappedExport ExpandableArena::share(std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first) {
  // (Its start must lie in a mapped page even for 0 bytes: that page is the first piece.)
  if (!base_ || address < base_ || address - base_ >= extent_ || bytes > extent_ - (address - base_) ||
      !committed(address - base_, bytes)) {
    throw InvalidArgument("get_ipc_handle: " + util::hex_address(address) + " (" + describe_bytes(bytes) +
                          ") is not mapped memory of the pool's arena");
  }
  if (!shareable_) {
    throw NotSupported("get_ipc_handle: device " + std::to_string(device_) +
                       " cannot share the pool's expandable arena (no POSIX file descriptor handles for "
                       "cuMemCreate); blocks of a segment of their own, or a pool without the option, can be");
  }
  const std::size_t start = address - base_;
  const std::size_t end = util::round_up(start + std::max<std::size_t>(bytes, 1), granularity_) / granularity_;
  MappedExport exported;
  exported.pid = static_cast<std::int32_t>(getpid());
  offset_in_first = start % granularity_;
  for (std::size_t page = start / granularity_; page < end; ++page) {
    Page& shared = pages_[page];
    if (shared.offered == 0) {
      int descriptor = -1;
      CUEMM_CU(cuMemExportToShareableHandle, &descriptor, shared.handle,
               cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      shared.offered = offer_descriptor(descriptor);
    }
    exported.pieces.push_back({shared.offered, granularity_});
  }
  return exported;
}

std::size_t ExpandableArena::shrink_to(std::size_t offset) noexcept {
  const std::size_t unmapped = unmap_pages(offset / granularity_, extent_ / granularity_);
  extent_ = std::min(extent_, offset);
  return unmapped;
}

void ExpandableArena::release() noexcept {
  if (!base_) return;
  shrink_to(0);
  CUEMM_CU_RESULT(cuMemAddressFree, base_, reserved_);
  base_ = 0;
  reserved_ = 0;
  std::vector<Page>().swap(pages_);  // (its storage too: a retired pool's arena is kept until exit)
}

}  // namespace cuemm::detail
