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

ExpandableArena::PageMapping ExpandableArena::map_page_without_access(std::size_t page) {
  const cuda::CUmemAllocationProp wanted = properties();
  cuda::CUmemGenericAllocationHandle handle = 0;
  const cuda::CUresult created = CUEMM_CU_RESULT(cuMemCreate, &handle, granularity_, &wanted, 0);
  if (created != cuda::CUDA_SUCCESS) return {created, "cuMemCreate"};
  const driver::MappingResult mapped = driver::map_without_access(base_ + page * granularity_, granularity_, handle);
  if (!mapped) {
    CUEMM_CU_RESULT(cuMemRelease, handle);
    return {mapped.result, mapped.call};
  }
  pages_[page].handle = handle;
  ++mapped_pages_;
  return {};
}

void ExpandableArena::unmap_run(std::size_t first, std::size_t end) noexcept {
  for (std::size_t page = first; page < end; ++page)
    if (pages_[page].offered) withdraw_descriptor(std::exchange(pages_[page].offered, 0));  // importers keep theirs
  CUEMM_CU_RESULT(cuMemUnmap, base_ + first * granularity_, (end - first) * granularity_);
  for (std::size_t page = first; page < end; ++page) CUEMM_CU_RESULT(cuMemRelease, std::exchange(pages_[page].handle, 0));
  mapped_pages_ -= end - first;
}

bool ExpandableArena::commit(std::size_t offset, std::size_t bytes, std::size_t& mapped) {
  mapped = 0;
  if (bytes == 0) return true;
  const std::size_t first = offset / granularity_;
  const std::size_t end = std::min(util::round_up(offset + bytes, granularity_), extent_) / granularity_;
  // Runs of pages this call maps, [begin, end) each: granted a run at a time.
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  runs.reserve(end > first ? (end - first + 1) / 2 : 0);
  auto undo = [&] {
    for (const auto& [run_first, run_end] : runs) unmap_run(run_first, run_end);
    mapped = 0;
  };
  PageMapping failed;
  for (std::size_t page = first; page < end; ++page) {
    if (pages_[page].handle) continue;
    failed = map_page_without_access(page);
    if (failed.result != cuda::CUDA_SUCCESS) break;
    if (!runs.empty() && runs.back().second == page) {
      ++runs.back().second;
    } else {
      runs.emplace_back(page, page + 1);
    }
    ++mapped;
  }
  for (std::size_t i = 0; i < runs.size() && failed.result == cuda::CUDA_SUCCESS; ++i) {
    const auto [run_first, run_end] = runs[i];
    const driver::MappingResult granted =
        driver::grant_read_write(base_ + run_first * granularity_, (run_end - run_first) * granularity_, access_);
    if (!granted) failed = {granted.result, granted.call};
  }
  if (failed.result == cuda::CUDA_SUCCESS) return true;
  undo();
  if (failed.result == cuda::CUDA_ERROR_OUT_OF_MEMORY) return false;
  driver::throw_allocation_error(failed.result, failed.call, granularity_);
}

bool ExpandableArena::committed(std::size_t offset, std::size_t bytes) const noexcept {
  const std::size_t end = util::round_up(offset + std::max<std::size_t>(bytes, 1), granularity_) / granularity_;
  for (std::size_t page = offset / granularity_; page < end; ++page)
    if (page >= pages_.size() || !pages_[page].handle) return false;
  return true;
}

std::size_t ExpandableArena::unmapped_pages(std::size_t offset, std::size_t bytes) const noexcept {
  const std::size_t end = std::min(util::round_up(offset + bytes, granularity_), extent_) / granularity_;
  std::size_t unmapped = 0;
  for (std::size_t page = offset / granularity_; page < end; ++page) unmapped += !pages_[page].handle;
  return unmapped;
}

std::size_t ExpandableArena::unmap_pages(std::size_t first, std::size_t end) noexcept {
  // (Pages under assembled blocks stay: Note [Assembled blocks].)
  auto goes = [&](std::size_t at) { return pages_[at].handle && !pages_[at].assemblies; };
  std::size_t unmapped = 0;
  for (std::size_t page = first; page < end;) {
    if (!goes(page)) {
      ++page;
      continue;
    }
    std::size_t run_end = page + 1;
    while (run_end < end && goes(run_end)) ++run_end;
    unmap_run(page, run_end);
    unmapped += run_end - page;
    page = run_end;
  }
  return unmapped;
}

std::size_t ExpandableArena::decommit(std::size_t offset, std::size_t bytes) noexcept {
  return unmap_pages(util::round_up(offset, granularity_) / granularity_,
                     std::min(offset + bytes, extent_) / granularity_);
}

MappedExport ExpandableArena::share(std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first) {
  if (auto block = assembled_at(address); block != assembled_.end())
    return share_assembled(block, address, bytes, offset_in_first);
  // (Its start must lie in a mapped page even for 0 bytes: that page is the first piece.)
  if (!base_ || address < base_ || address - base_ >= extent_ || bytes > extent_ - (address - base_) ||
      !committed(address - base_, bytes)) {
    throw InvalidArgument("get_ipc_handle: " + util::hex_address(address) + " (" + describe_bytes(bytes) +
                          ") is not mapped memory of the pool's arena");
  }
  refuse_to_share_unless_shareable();
  const std::size_t start = address - base_;
  const std::size_t end = util::round_up(start + std::max<std::size_t>(bytes, 1), granularity_) / granularity_;
  MappedExport exported;
  exported.pid = static_cast<std::int32_t>(getpid());
  offset_in_first = start % granularity_;
  for (std::size_t page = start / granularity_; page < end; ++page)
    exported.pieces.push_back({offered(pages_[page]), granularity_});
  return exported;
}

void ExpandableArena::refuse_to_share_unless_shareable() const {
  if (!shareable_) {
    throw NotSupported("get_ipc_handle: device " + std::to_string(device_) +
                       " cannot share the pool's expandable arena (no POSIX file descriptor handles for "
                       "cuMemCreate); blocks of a segment of their own, or a pool without the option, can be");
  }
}

std::uint64_t ExpandableArena::offered(Page& page) {
  if (page.offered == 0) {
    int descriptor = -1;
    CUEMM_CU(cuMemExportToShareableHandle, &descriptor, page.handle, cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
             0);
    page.offered = offer_descriptor(descriptor);
  }
  return page.offered;
}

MappedExport ExpandableArena::share_assembled(std::map<cuda::CUdeviceptr, AssembledBlock>::const_iterator found,
                                              std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first) {
  AssembledBlock& block = assembled_.at(found->first);
  const std::size_t start = address - block.reservation;
  if (bytes > block.pages() * granularity_ - start) {
    throw InvalidArgument("get_ipc_handle: " + util::hex_address(address) + " (" + describe_bytes(bytes) +
                          ") runs past the assembled block at " + util::hex_address(found->first));
  }
  refuse_to_share_unless_shareable();
  std::vector<Page*> in_order;
  if (block.tail_page) in_order.push_back(&pages_[*block.tail_page]);
  for (Page& own : block.own) in_order.push_back(&own);
  if (block.head_page) in_order.push_back(&pages_[*block.head_page]);
  MappedExport exported;
  exported.pid = static_cast<std::int32_t>(getpid());
  offset_in_first = start % granularity_;
  const std::size_t end = util::round_up(start + std::max<std::size_t>(bytes, 1), granularity_) / granularity_;
  for (std::size_t page = start / granularity_; page < end; ++page)
    exported.pieces.push_back({offered(*in_order[page]), granularity_});
  return exported;
}

std::optional<cuda::CUdeviceptr> ExpandableArena::assemble(const Assembly& assembly) {
  auto range_page = [&](const std::optional<std::size_t>& offset, const char* end) -> std::optional<std::size_t> {
    if (!offset) return std::nullopt;
    if (*offset % granularity_ || *offset >= extent_ || !pages_[*offset / granularity_].handle) {
      throw InvalidArgument("ExpandableArena::assemble: the " + std::string(end) + " page at offset " +
                            std::to_string(*offset) + " is not a mapped page of the range");
    }
    return *offset / granularity_;
  };
  AssembledBlock block;
  block.tail_page = range_page(assembly.tail_page, "tail's");
  block.head_page = range_page(assembly.head_page, "head's");
  if (block.tail_page && block.tail_page == block.head_page)
    throw InvalidArgument("ExpandableArena::assemble: its tail and head are one page, at offset " +
                          std::to_string(*assembly.tail_page));
  if (assembly.tail_from >= granularity_ || (assembly.tail_from && !block.tail_page))
    throw InvalidArgument("ExpandableArena::assemble: a tail from byte " + std::to_string(assembly.tail_from) +
                          " of " + (block.tail_page ? "a " + std::to_string(granularity_) + "-byte page" : "no page"));
  const std::size_t pages = block.tail_page.has_value() + assembly.own_pages + block.head_page.has_value();
  if (pages == 0) throw InvalidArgument("ExpandableArena::assemble: a block of no pages");
  block.first_offset = assembly.tail_from;
  block.own.reserve(assembly.own_pages);
  // (The record's node first, so that nothing can fail once the driver has mapped.)
  std::map<cuda::CUdeviceptr, AssembledBlock> staging;
  auto record = staging.extract(staging.try_emplace(0).first);
  const cuda::CUmemAllocationProp wanted = properties();
  std::size_t mapped_pages = 0;  // mapped at the block's addresses, in order
  auto undo = [&] {
    if (block.reservation) {
      if (mapped_pages) CUEMM_CU_RESULT(cuMemUnmap, block.reservation, mapped_pages * granularity_);
      CUEMM_CU_RESULT(cuMemAddressFree, block.reservation, pages * granularity_);
    }
    for (Page& own : block.own) CUEMM_CU_RESULT(cuMemRelease, own.handle);
  };
  auto map_next = [&](cuda::CUmemGenericAllocationHandle handle) {
    const driver::MappingResult mapped =
        driver::map_without_access(block.reservation + mapped_pages * granularity_, granularity_, handle);
    if (mapped) ++mapped_pages;
    return mapped;
  };
  driver::MappingResult so_far;  // (true while every call succeeded)
  if (const cuda::CUresult reserved = CUEMM_CU_RESULT(cuMemAddressReserve, &block.reservation, pages * granularity_,
                                                      granularity_, 0, 0);
      reserved != cuda::CUDA_SUCCESS) {
    block.reservation = 0;
    so_far = {reserved, "cuMemAddressReserve"};
  }
  if (so_far && block.tail_page) so_far = map_next(pages_[*block.tail_page].handle);
  for (std::size_t i = 0; so_far && i < assembly.own_pages; ++i) {
    cuda::CUmemGenericAllocationHandle handle = 0;
    if (const cuda::CUresult created = CUEMM_CU_RESULT(cuMemCreate, &handle, granularity_, &wanted, 0);
        created != cuda::CUDA_SUCCESS) {
      so_far = {created, "cuMemCreate"};
      break;
    }
    block.own.push_back({handle, 0, 0});
    so_far = map_next(handle);
  }
  if (so_far && block.head_page) so_far = map_next(pages_[*block.head_page].handle);
  if (so_far) so_far = driver::grant_read_write(block.reservation, pages * granularity_, access_);  // (once a block)
  if (!so_far) {
    undo();
    if (so_far.result == cuda::CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
    driver::throw_allocation_error(so_far.result, so_far.call, pages * granularity_);
  }
  const cuda::CUdeviceptr address = block.reservation + block.first_offset;
  if (block.tail_page) ++pages_[*block.tail_page].assemblies;
  if (block.head_page) ++pages_[*block.head_page].assemblies;
  own_pages_ += block.own.size();
  record.key() = address;
  record.mapped() = std::move(block);
  assembled_.insert(std::move(record));
  return address;
}

void ExpandableArena::unmap_assembled(AssembledBlock& block) noexcept {
  for (Page& own : block.own)
    if (own.offered) withdraw_descriptor(std::exchange(own.offered, 0));  // importers keep what they mapped
  CUEMM_CU_RESULT(cuMemUnmap, block.reservation, block.pages() * granularity_);
  CUEMM_CU_RESULT(cuMemAddressFree, block.reservation, block.pages() * granularity_);
  for (Page& own : block.own) CUEMM_CU_RESULT(cuMemRelease, own.handle);
  own_pages_ -= block.own.size();
  if (block.tail_page) --pages_[*block.tail_page].assemblies;
  if (block.head_page) --pages_[*block.head_page].assemblies;
}

bool ExpandableArena::disassemble(cuda::CUdeviceptr address) noexcept {
  auto block = assembled_.find(address);
  if (block == assembled_.end()) return false;
  unmap_assembled(block->second);
  assembled_.erase(block);
  return true;
}

std::map<cuda::CUdeviceptr, ExpandableArena::AssembledBlock>::const_iterator ExpandableArena::assembled_at(
    std::uintptr_t address) const noexcept {
  auto after = assembled_.upper_bound(address);
  if (after == assembled_.begin()) return assembled_.end();
  const auto block = std::prev(after);
  const AssembledBlock& found = block->second;
  return address < found.reservation + found.pages() * granularity_ ? block : assembled_.end();
}

bool ExpandableArena::in_assembled_block(std::uintptr_t address) const noexcept {
  return assembled_at(address) != assembled_.end();
}

std::size_t ExpandableArena::shrink_to(std::size_t offset) noexcept {
  const std::size_t unmapped = unmap_pages(offset / granularity_, extent_ / granularity_);
  extent_ = std::min(extent_, offset);
  return unmapped;
}

void ExpandableArena::release() noexcept {
  for (auto& [address, block] : assembled_) unmap_assembled(block);
  assembled_.clear();
  if (!base_) return;
  unmap_pages(0, pages_.size());  // (a page under an assembled block may lie past a cut)
  extent_ = 0;
  CUEMM_CU_RESULT(cuMemAddressFree, base_, reserved_);
  base_ = 0;
  reserved_ = 0;
  std::vector<Page>().swap(pages_);  // (its storage too: a retired pool's arena is kept until exit)
}

}  // namespace cuemm::detail
