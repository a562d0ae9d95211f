// shared_pages.hpp: which of a simulated device's 2 MiB pages its small
// cuMemAlloc blocks take, so that its free memory reads as libcuda's does.
//
// Note [cuMemAlloc's shared pages]: libcuda takes a device's memory in whole
// 2 MiB pages. A block of more than a page takes pages of its own; smaller
// blocks are placed side by side in pages they share, and a page goes back
// once its last block is freed (bench/probes/probe_alloc_granularity.cpp: 32
// blocks of 64 KiB or of 1 MiB took their size, whole pages in all). Charging
// such a block only its own bytes made the default manager's footprint on the
// simulated driver read 1.02 of its peak live bytes on RMM's workload up to
// 1 MiB and up to 256 KiB, where the H200 reads 1.105 for both (seed 1,
// bench/RESULTS-H200.md). Placing each block in the smallest free run that
// holds it, whatever the page, reads as the H200 does on the workloads
// measured there (`cuemm random --manager default`, seed 1, 20,000
// operations): 162 and 40 MiB of footprint up to 1 MiB and 256 KiB (the
// H200's 160 and 40), 698 MiB up to 4 MiB (702), and 1.403 of peak live up to
// 64 MiB with 1 GiB live (1.403).
//
// Offsets here are the pages' own (page i at i * kStride); the block's bytes
// are in the device's arena as any block's. Not thread-safe: the state's lock
// guards it.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "util/range_allocator.hpp"

namespace cuemm::sim {

class SharedPages {
 public:
  static constexpr std::size_t kPage = std::size_t{2} << 20;
  // Where one page's offsets start after the last: a page's gap past its end
  // keeps two pages' free runs from merging into one a block could span.
  static constexpr std::size_t kStride = 2 * kPage;

  // Where a block of `bytes` (at most a page) goes in the pages there are:
  // the smallest free run that holds it. nullopt where none does; the caller
  // then adds a page, once the device has room for it.
  std::optional<std::size_t> place(std::size_t bytes) {
    const std::optional<std::size_t> offset = free_.allocate(bytes);
    if (offset) used_[*offset / kStride] += bytes;
    return offset;
  }

  // A new page, all free (after the device's used bytes grew by kPage).
  void add_page() {
    std::size_t index = used_.size();
    if (!unused_.empty()) {
      index = unused_.back();
      unused_.pop_back();
    } else {
      used_.push_back(0);
    }
    free_.release(index * kStride, kPage);
  }

  // Frees a block that place() put at `offset`; true where that emptied its
  // page, which is then gone (the device's used bytes drop by kPage).
  bool release(std::size_t offset, std::size_t bytes) {
    const std::size_t index = offset / kStride;
    free_.release(offset, bytes);
    if ((used_[index] -= bytes) != 0) return false;
    free_.take(index * kStride, kPage);
    unused_.push_back(index);
    return true;
  }

 private:
  util::RangeAllocator free_{0};
  std::vector<std::size_t> used_;    // bytes placed in each page, by index
  std::vector<std::size_t> unused_;  // indexes of pages given back, for the next new one
};

}  // namespace cuemm::sim
