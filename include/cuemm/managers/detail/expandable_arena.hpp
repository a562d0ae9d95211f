// cuemm/managers/detail/expandable_arena.hpp: one range of device addresses
// whose memory grows and shrinks at its end.
//
// Note [Expandable arena]
// Separate cuMemAlloc segments cannot merge: a free block at the end of one
// and the start of the next are two holes, and a request larger than either
// takes a new segment. On RMM's random workload (sizes up to 4 MiB) that left
// the pool at 1.20-1.34x the live bytes. With the driver's virtual memory
// management the pool instead reserves addresses for the whole device once and
// maps physical memory (cuMemCreate + cuMemMap) at the end as it grows, so
// growth merges with the free space before it and the pool grows only by what
// is missing; trimming unmaps whole mappings from the end.
//
// Memory made by cuMemCreate has no cuIpcGetMemHandle. Where the device can,
// the arena creates it shareable as a POSIX file descriptor instead: an IPC
// handle names the mappings under a block, whose descriptors this process
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

  // Maps `bytes` more at the end (a multiple of granularity()). Returns false
  // when the device is out of memory or the reservation is full; nothing
  // changes then. Other driver errors throw.
  bool grow(std::size_t bytes);
  // Unmaps every mapping that lies wholly at or after `offset`; returns the
  // bytes unmapped. The new mapped size is the start of the first one unmapped.
  std::size_t shrink_to(std::size_t offset);
  // The end of the first mapping that ends at or after `offset`: where
  // shrink_to() may cut without touching memory before `offset`.
  std::size_t mapping_end_at_or_after(std::size_t offset) const;
  // Unmaps everything and frees the addresses.
  void release() noexcept;

  // The mappings that hold [address, address + bytes), each offered to other
  // processes as a descriptor (from its first share until it is unmapped),
  // and where `address` lies in the first of them. InvalidArgument naming the
  // range when it is not mapped here; NotSupported when the device cannot
  // share this memory.
  MappedExport share(std::uintptr_t address, std::size_t bytes, std::size_t& offset_in_first);

  cuda::CUdeviceptr base() const noexcept { return base_; }
  std::size_t mapped_bytes() const noexcept { return mapped_; }
  std::size_t mapping_count() const noexcept { return mappings_.size(); }
  std::size_t reserved_bytes() const noexcept { return reserved_; }
  std::size_t granularity() const noexcept { return granularity_; }
  bool contains(std::uintptr_t address) const noexcept {
    return base_ && address >= base_ && address < base_ + reserved_;
  }

 private:
  struct Mapping {
    std::size_t offset;
    std::size_t size;
    cuda::CUmemGenericAllocationHandle handle;
    std::uint64_t offered = 0;  // the token of its descriptor, once shared
  };
  cuda::CUmemAllocationProp properties() const noexcept;
  void unmap_last() noexcept;

  int device_;
  cuda::CUdeviceptr base_ = 0;
  std::size_t reserved_ = 0;
  std::size_t mapped_ = 0;
  std::size_t granularity_ = std::size_t{2} << 20;
  bool shareable_ = false;  // memory created as POSIX descriptors (set by reserve())
  // The device and its peers, which every mapping is granted to (set by reserve(); src/driver/mapping.hpp).
  std::vector<cuda::CUmemAccessDesc> access_;
  std::vector<Mapping> mappings_;  // by offset, side by side from 0
};

}  // namespace cuemm::detail
