// best_fit_reference.hpp: the footprint of an ideal best fit, the reference
// that `cuemm random` and `cuemm replay` set beside a manager's.
//
// One range of addresses that grows at its end; each request goes to the
// smallest free block that holds it (the lowest such address), and a freed
// block merges with its free neighbours at once. Nothing else: no thread
// caches, no wait for the GPU before reuse, no segment boundaries, no driver.
// So what a pool reserves beyond it is the price of those; what it reserves
// itself is the holes that any allocator which never moves a block leaves on
// that workload (a best fit is what RMM's pool and PyTorch's caching
// allocator aim at). Blocks are multiples of 256 bytes and the range of 2 MiB
// pages, as the pool's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "util/range_allocator.hpp"
#include "util/round_up.hpp"

namespace cuemm::tool {

class BestFitReference {
 public:
  static constexpr std::size_t kBlockGranularity = 256;
  static constexpr std::size_t kPage = std::size_t{2} << 20;

  // `capacity`: the device memory that the range may span at most (0: no
  // bound), so that a request no device of that size could hold fails here
  // as it would under a manager.
  explicit BestFitReference(std::size_t capacity = 0) : capacity_(capacity) {}

  // False, with nothing changed, where the range would pass the capacity.
  bool allocate(std::uint64_t id, std::size_t size) {
    if (capacity_ && size > capacity_) return false;  // (before its rounding could wrap)
    const std::size_t bytes = util::round_up(size == 0 ? 1 : size, kBlockGranularity);
    std::optional<std::size_t> address = range_.allocate(bytes);
    if (!address) {
      // The range grows at its end, by what its free end lacks: the block
      // then takes that free end exactly.
      const std::size_t growth = bytes - range_.free_before(end_);
      if (capacity_ && util::round_up(end_ + growth, kPage) > capacity_) return false;
      range_.release(end_, growth);
      address = range_.allocate(bytes);
      end_ = *address + bytes;
    }
    blocks_[id] = {*address, bytes, size};
    live_ += size;
    return true;
  }

  // Frees the block of `id`; an id not allocated is ignored (a log may begin mid-run).
  void free(std::uint64_t id) {
    auto block = blocks_.find(id);
    if (block == blocks_.end()) return;
    range_.release(block->second.address, block->second.bytes);
    live_ -= block->second.size;
    blocks_.erase(block);
  }

  // The bytes asked for by the blocks not yet freed.
  std::size_t live_bytes() const noexcept { return live_; }
  // The most the range ever spanned (it never shrinks), in whole pages.
  std::size_t peak_reserved() const noexcept { return util::round_up(end_, kPage); }

 private:
  std::size_t capacity_;
  util::RangeAllocator range_{0};  // [0, end_), grown as requests need
  struct Block {
    std::size_t address, bytes, size;  // size: as asked for; bytes: rounded
  };
  std::unordered_map<std::uint64_t, Block> blocks_;
  std::size_t end_ = 0;
  std::size_t live_ = 0;
};

}  // namespace cuemm::tool
