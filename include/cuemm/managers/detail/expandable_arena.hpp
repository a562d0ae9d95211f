// cuemm/managers/detail/expandable_arena.hpp: one range of device addresses
// whose memory grows and shrinks at its end.
//
// Note [Expandable arena]
// Separate cuMemAlloc segments cannot merge: a free block at the end of one
// and the start of the next are two holes, and a request larger than either
// takes a new segment. On RMM's random workload (sizes up to 4 MiB) that left
// the pool at 1.20-1.34x the live bytes. With the driver's virtual memory
// management the pool instead reserves addresses for the whole device once,
// extends its one range at the end as it grows, and maps physical memory
// (cuMemCreate + cuMemMap) page by page under the blocks it hands out. Each
// 2 MiB page is an allocation of its own, so a page that lies wholly in free
// space can go back to the driver wherever it is: the pool does so where
// mapping a block's pages would take it past its peak footprint (Note
// [Pages given back]), and trimming unmaps every free page.
//
// Memory made by cuMemCreate has no cuIpcGetMemHandle. Where the device can,
// the arena creates it shareable as a POSIX file descriptor instead: an IPC
// handle names the pages under a block, whose descriptors this process
// offers to others (src/memory/descriptor_passing.hpp), and the importer maps
// them side by side as here.
//
// Its memory is granted to every device that can access the arena's own, as
// cuMemAlloc's would be once peer access is enabled (Note [Peer access] in
// src/driver/mapping.hpp).
//
// Not thread-safe: the owner locks. The owner makes the context current.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/memory/ipc_handle.hpp"

namespace cuemm::detail {

class ExpandableArena {
 public:
  // Reserves nothing yet; `device` is the ordinal whose memory is mapped.
  explicit ExpandableArena(int device) : device_(device) {}
  ~ExpandableArena();  // unmaps and frees everything (errors ignored)
  ExpandableArena(const ExpandableArena&) = delete;
  ExpandableArena& operator=(const ExpandableArena&) = delete;

  // Throws CudaError (CUDA_ERROR_NOT_SUPPORTED, saying so) when `device`
  // has no virtual memory management, which the arena maps its memory with.
  static void require_support(int device);
  // Reserves `bytes` of addresses (rounded up to the driver's granularity)
  // on first use; throws as require_support() does.
  void reserve(std::size_t bytes);
  bool reserved() const noexcept { return base_ != 0; }

  // Extends the range by `bytes` of addresses at its end (a multiple of
  // granularity()), mapping nothing. Returns false, changing nothing, past
  // the reservation.
  bool extend(std::size_t bytes);
  // Maps the pages under [offset, offset + bytes) that are not mapped
  // (within the range). Returns false when the device is out of memory; the
  // pages this call mapped are unmapped again then. Other driver errors
  // throw, after the same. `mapped` counts the pages it mapped.
  bool commit(std::size_t offset, std::size_t bytes, std::size_t& mapped);
  // Whether every page under [offset, offset + bytes) is mapped.
  bool committed(std::size_t offset, std::size_t bytes) const noexcept;
  // Unmaps the mapped pages that lie wholly inside [offset, offset + bytes);
  // returns how many.
  std::size_t decommit(std::size_t offset, std::size_t bytes) noexcept;
  // Cuts the range at `offset` (a multiple of granularity()), unmapping the
  // pages after it; returns how many.
  std::size_t shrink_to(std::size_t offset) noexcept;
  // Unmaps everything and frees the addresses.
  void release() noexcept;

  // The pages that hold [address, address + bytes), each offered to other
  // processes as a descriptor (from its first share until it is unmapped),
  // and where `address` lies in the first of them. InvalidArgument naming the
  // range when it is not all mapped; NotSupported when the device cannot
  // share this memory.
  MappedExport share(std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first);

  cuda::CUdeviceptr base() const noexcept { return base_; }
  // The range's length, mapped or not.
  std::size_t extent() const noexcept { return extent_; }
  // The bytes of its pages that are mapped: what it holds of the device.
  std::size_t mapped_bytes() const noexcept { return mapped_pages_ * granularity_; }
  std::size_t reserved_bytes() const noexcept { return reserved_; }
  std::size_t granularity() const noexcept { return granularity_; }
  bool contains(std::uintptr_t address) const noexcept {
    return base_ && address >= base_ && address < base_ + reserved_;
  }

 private:
  struct Page {
    cuda::CUmemGenericAllocationHandle handle = 0;  // 0: not mapped
    std::uint64_t offered = 0;  // the token of its descriptor, once shared
  };
  cuda::CUmemAllocationProp properties() const noexcept;
  struct PageMapping {
    cuda::CUresult result = cuda::CUDA_SUCCESS;
    const char* call = nullptr;  // the driver call that failed
  };
  // Maps one page with an allocation of its own.
  PageMapping map_page(std::size_t page);
  void unmap_page(std::size_t page) noexcept;
  // Unmaps the mapped pages among [first, end); returns how many.
  std::size_t unmap_pages(std::size_t first, std::size_t end) noexcept;

  int device_;
  cuda::CUdeviceptr base_ = 0;
  std::size_t reserved_ = 0;
  std::size_t extent_ = 0;
  std::size_t mapped_pages_ = 0;
  std::size_t granularity_ = std::size_t{2} << 20;
  bool shareable_ = false;  // memory created as POSIX descriptors (set by reserve())
  // The device and its peers, which every page is granted to (set by reserve(); src/driver/mapping.hpp).
  std::vector<cuda::CUmemAccessDesc> access_;
  std::vector<Page> pages_;  // one per page of the reservation (set by reserve())
};

}  // namespace cuemm::detail
