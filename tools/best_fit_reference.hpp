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
#include <iterator>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

namespace cuemm::tool {

class BestFitReference {
 public:
  static constexpr std::size_t kBlockGranularity = 256;
  static constexpr std::size_t kPage = std::size_t{2} << 20;

  void allocate(std::uint64_t id, std::size_t size) {
    const std::size_t bytes = round_up(size == 0 ? 1 : size, kBlockGranularity);
    std::size_t address;
    if (auto fit = free_by_size_.lower_bound({bytes, 0}); fit != free_by_size_.end()) {
      const auto [free_bytes, free_address] = *fit;
      take_free(free_address, free_bytes);
      if (free_bytes > bytes) add_free(free_address + bytes, free_bytes - bytes);
      address = free_address;
    } else {
      // The range grows, from the free block at its end if there is one.
      address = end_;
      if (!free_by_address_.empty()) {
        const auto [last_address, last_bytes] = *std::prev(free_by_address_.end());
        if (last_address + last_bytes == end_) {
          take_free(last_address, last_bytes);
          address = last_address;
        }
      }
      end_ = address + bytes;
      peak_end_ = std::max(peak_end_, end_);
    }
    blocks_[id] = {address, bytes};
  }

  // Frees the block of `id`; an id not allocated is ignored (a log may begin mid-run).
  void free(std::uint64_t id) {
    auto block = blocks_.find(id);
    if (block == blocks_.end()) return;
    auto [address, bytes] = block->second;
    blocks_.erase(block);
    // Merge with the free neighbours on either side.
    if (auto next = free_by_address_.find(address + bytes); next != free_by_address_.end()) {
      const std::size_t next_bytes = next->second;
      take_free(address + bytes, next_bytes);
      bytes += next_bytes;
    }
    if (auto next = free_by_address_.lower_bound(address); next != free_by_address_.begin()) {
      const auto [previous_address, previous_bytes] = *std::prev(next);
      if (previous_address + previous_bytes == address) {
        take_free(previous_address, previous_bytes);
        address = previous_address;
        bytes += previous_bytes;
      }
    }
    add_free(address, bytes);
  }

  // The most the range ever spanned, in whole pages.
  std::size_t peak_reserved() const noexcept { return round_up(peak_end_, kPage); }

 private:
  static std::size_t round_up(std::size_t value, std::size_t step) noexcept { return (value + step - 1) / step * step; }
  void add_free(std::size_t address, std::size_t bytes) {
    free_by_address_.emplace(address, bytes);
    free_by_size_.emplace(bytes, address);
  }
  void take_free(std::size_t address, std::size_t bytes) {
    free_by_address_.erase(address);
    free_by_size_.erase({bytes, address});
  }

  std::map<std::size_t, std::size_t> free_by_address_;           // address -> bytes
  std::set<std::pair<std::size_t, std::size_t>> free_by_size_;   // (bytes, address): the best fit first
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::size_t>> blocks_;  // id -> (address, bytes)
  std::size_t end_ = 0;
  std::size_t peak_end_ = 0;
};

}  // namespace cuemm::tool
