// range_allocator.hpp: best-fit placement of blocks inside one range: the
// simulated driver's device arena and its shared pages, and the `cuemm`
// tool's best-fit reference.
//
// Offsets only; the range's memory is elsewhere. O(log n) allocate and free,
// neighbours coalesce. Not thread-safe: the owner locks.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace cuemm::util {

class RangeAllocator {
 public:
  // A range of `capacity` bytes, all free (0: none yet; release() adds ranges).
  explicit RangeAllocator(std::size_t capacity) {
    if (capacity) insert_free(0, capacity);
  }

  // Returns the offset of a block of exactly `size` bytes (already rounded by
  // the caller), or nullopt when no free range is large enough.
  std::optional<std::size_t> allocate(std::size_t size) {
    auto fit = by_size_.lower_bound({size, 0});
    if (fit == by_size_.end()) return std::nullopt;
    const auto [length, offset] = *fit;
    erase_free(offset, length);
    if (length > size) insert_free(offset + size, length - size);
    return offset;
  }

  // The same at an offset that is a multiple of `alignment` (a power of two):
  // the smallest free range that holds such a block.
  std::optional<std::size_t> allocate_aligned(std::size_t size, std::size_t alignment) {
    for (auto fit = by_size_.lower_bound({size, 0}); fit != by_size_.end(); ++fit) {
      const auto [length, offset] = *fit;
      const std::size_t start = (offset + alignment - 1) & ~(alignment - 1);
      if (start + size > offset + length) continue;
      erase_free(offset, length);
      if (start > offset) insert_free(offset, start - offset);
      if (start + size < offset + length) insert_free(start + size, offset + length - start - size);
      return start;
    }
    return std::nullopt;
  }

  // The length of the free range that ends at `offset`; 0 if none does.
  std::size_t free_before(std::size_t offset) const {
    auto next = by_offset_.lower_bound(offset);
    if (next == by_offset_.begin()) return 0;
    const auto& [start, length] = *std::prev(next);
    return start + length == offset ? length : 0;
  }

  // Frees [offset, offset + size): a block handed out, or new room (as past the range's end).
  void release(std::size_t offset, std::size_t size) {
    // Invariant: free ranges never touch; merge with both neighbours.
    auto next = by_offset_.lower_bound(offset);
    if (next != by_offset_.end() && offset + size == next->first) {
      size += next->second;
      erase_free(next->first, next->second);
    }
    auto prev = by_offset_.lower_bound(offset);
    if (prev != by_offset_.begin()) {
      --prev;
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        size += prev->second;
        erase_free(prev->first, prev->second);
      }
    }
    insert_free(offset, size);
  }

  // Removes the free range [offset, offset + size), which must be exactly one
  // of the free ranges (a range given up: the simulated driver's emptied
  // pages); false, changing nothing, where it is not.
  bool take(std::size_t offset, std::size_t size) {
    const auto range = by_offset_.find(offset);
    if (range == by_offset_.end() || range->second != size) return false;
    erase_free(offset, size);
    return true;
  }

 private:
  void insert_free(std::size_t offset, std::size_t size) {
    by_offset_.emplace(offset, size);
    by_size_.emplace(size, offset);
  }
  void erase_free(std::size_t offset, std::size_t size) {
    by_offset_.erase(offset);
    by_size_.erase({size, offset});
  }

  std::map<std::size_t, std::size_t> by_offset_;    // offset -> length
  std::set<std::pair<std::size_t, std::size_t>> by_size_;  // (length, offset)
};

}  // namespace cuemm::util
