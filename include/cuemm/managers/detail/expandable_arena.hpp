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
// Note [Assembled blocks]
// A hole of the range keeps the pages at its two ends mapped, partly free.
// Where a request fits no hole, the free end of one such page and the free
// start of another (with pages of its own between, for a larger block) can
// make its block instead: the driver maps one page at two addresses, so the
// arena maps those pages again, side by side, at a reservation of the
// block's own. The owner keeps the two ends allocated in its index while the
// block lives, so that nothing else is placed there, and a page under an
// assembled block is never unmapped from the range. (A model of RMM's
// workload up to 4 MiB with 128 MiB live: 1.19 -> 1.11-1.14 peak mapped over
// peak live, assembling near the peak only: docs/pool-measurements.md.)
//
// Not thread-safe: the owner locks. The owner makes the context current.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
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
  // How many pages under [offset, offset + bytes) are not mapped (what commit() would map).
  std::size_t unmapped_pages(std::size_t offset, std::size_t bytes) const noexcept;
  // Unmaps the mapped pages that lie wholly inside [offset, offset + bytes),
  // but those under assembled blocks; returns how many.
  std::size_t decommit(std::size_t offset, std::size_t bytes) noexcept;
  // Cuts the range at `offset` (a multiple of granularity()), unmapping the
  // pages after it but those under assembled blocks; returns how many.
  std::size_t shrink_to(std::size_t offset) noexcept;
  // Unmaps everything and frees the addresses (assembled blocks first).
  void release() noexcept;

  // What an assembled block is made of, in order (Note [Assembled blocks]):
  // the mapped page at range offset `tail_page` from its byte `tail_from` to
  // its end, then `own_pages` new pages, then the first bytes of the mapped
  // page at range offset `head_page`. Either end may be left out.
  struct Assembly {
    std::optional<std::size_t> tail_page;  // a multiple of granularity()
    std::size_t tail_from = 0;             // within that page
    std::size_t own_pages = 0;
    std::optional<std::size_t> head_page;  // a multiple of granularity()
  };
  // Maps the block's pages at addresses of its own; returns where its first
  // byte lies (the tail's, else its first page's start), or nullopt when the
  // device is out of memory, nothing left mapped. InvalidArgument naming
  // the page when an end is not a mapped page of the range, or the two are
  // one page; other driver errors throw.
  std::optional<cuda::CUdeviceptr> assemble(const Assembly& assembly);
  // Unmaps an assembled block (by the address assemble() returned), frees
  // its own pages and its addresses; false if no block begins there.
  bool disassemble(cuda::CUdeviceptr block) noexcept;
  // Whether `address` lies in an assembled block's addresses.
  bool in_assembled_block(std::uintptr_t address) const noexcept;
  std::size_t assembled_blocks() const noexcept { return assembled_.size(); }
  // The assembled blocks' own pages, in bytes (counted in mapped_bytes() too).
  std::size_t assembled_page_bytes() const noexcept { return own_pages_ * granularity_; }

  // The pages that hold [address, address + bytes), each offered to other
  // processes as a descriptor (from its first share until it is unmapped),
  // and where `address` lies in the first of them. InvalidArgument naming the
  // range when it is not all mapped; NotSupported when the device cannot
  // share this memory.
  MappedExport share(std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first);

  cuda::CUdeviceptr base() const noexcept { return base_; }
  // The range's length, mapped or not.
  std::size_t extent() const noexcept { return extent_; }
  // The bytes of its pages that are mapped (the assembled blocks' own pages
  // too): what it holds of the device.
  std::size_t mapped_bytes() const noexcept { return (mapped_pages_ + own_pages_) * granularity_; }
  std::size_t reserved_bytes() const noexcept { return reserved_; }
  std::size_t granularity() const noexcept { return granularity_; }
  bool contains(std::uintptr_t address) const noexcept {
    return base_ && address >= base_ && address < base_ + reserved_;
  }

 private:
  struct Page {
    cuda::CUmemGenericAllocationHandle handle = 0;  // 0: not mapped
    std::uint64_t offered = 0;  // the token of its descriptor, once shared
    std::uint32_t assemblies = 0;  // assembled blocks that map it too (it stays mapped meanwhile)
  };
  // An assembled block: its reservation, mapping its pages in this order.
  struct AssembledBlock {
    cuda::CUdeviceptr reservation = 0;
    std::size_t first_offset = 0;             // where the block begins in its first page
    std::optional<std::size_t> tail_page;     // the range's page it begins in (an index into pages_)
    std::vector<Page> own;                    // then its own pages (and their descriptors, once shared)
    std::optional<std::size_t> head_page;     // then the range's page it ends in
    std::size_t pages() const noexcept { return tail_page.has_value() + own.size() + head_page.has_value(); }
  };
  cuda::CUmemAllocationProp properties() const noexcept;
  struct PageMapping {
    cuda::CUresult result = cuda::CUDA_SUCCESS;
    const char* call = nullptr;  // the driver call that failed
  };
  // Maps one page with an allocation of its own, not yet accessible: pages
  // side by side are granted together (one cuMemSetAccess a run of them).
  PageMapping map_page_without_access(std::size_t page);
  // Unmaps [first, end), all mapped, with one cuMemUnmap.
  void unmap_run(std::size_t first, std::size_t end) noexcept;
  // Unmaps the mapped pages among [first, end) but those under assembled
  // blocks, a run of them side by side at a time; returns how many.
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
  std::map<cuda::CUdeviceptr, AssembledBlock> assembled_;  // by the block's first byte
  std::size_t own_pages_ = 0;  // the assembled blocks' own pages, all together

  // The assembled block whose addresses hold `address`, or end().
  std::map<cuda::CUdeviceptr, AssembledBlock>::const_iterator assembled_at(std::uintptr_t address) const noexcept;
  // Unmaps and frees an assembled block's addresses and own pages.
  void unmap_assembled(AssembledBlock& block) noexcept;
  // share() for an assembled block (`found`).
  MappedExport share_assembled(std::map<cuda::CUdeviceptr, AssembledBlock>::const_iterator found,
                               std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first);
  void refuse_to_share_unless_shareable() const;
  // The token of `page`'s descriptor, offered to other processes at its first share.
  std::uint64_t offered(Page& page);
};

}  // namespace cuemm::detail
