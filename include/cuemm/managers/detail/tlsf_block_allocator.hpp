// cuemm/managers/detail/tlsf_block_allocator.hpp: O(1) placement of blocks
// inside regions of device address space.
//
// Note [Two-level segregated fit]
// Free blocks sit in lists indexed by (first level = floor(log2 size), second
// level = the next kSecondLevelBits bits of the size), with one bitmap per
// level. Allocation rounds the request up to its list's lower bound, finds the
// first non-empty list at or above it with two bit scans, and splits the block;
// freeing merges with free address neighbours. Both are O(1) whatever the
// number of free blocks, and the good fit (at most 1/16 over the request before
// the split returns the rest) keeps fragmentation low. When no list above has
// a block, up to kOwnListLooks blocks of the request's own list are looked at:
// one of them may fit, and passing it over would grow the pool (or fail it at
// its maximum size) with the block free.
// Device memory cannot hold allocator metadata, so each block is described by
// a host-side node; an address-to-node map finds the node on free.
//
// Not thread-safe: the owner locks. Knows nothing of CUDA: regions are plain
// address ranges handed in by the owner, which also takes them back (trim).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace cuemm::detail {

class TlsfBlockAllocator {
 public:
  struct Region {
    std::uintptr_t base;
    std::size_t size;
  };

  // Every block is a multiple of `granularity` bytes (a power of two, >= 16),
  // and so aligned to it when regions are.
  explicit TlsfBlockAllocator(std::size_t granularity = 256);
  ~TlsfBlockAllocator();
  TlsfBlockAllocator(const TlsfBlockAllocator&) = delete;
  TlsfBlockAllocator& operator=(const TlsfBlockAllocator&) = delete;

  // Hands a region of free space to the allocator. Base and size must be
  // multiples of the granularity.
  void add_region(std::uintptr_t base, std::size_t size);

  // The address of a block of at least `size` bytes, or nullopt when no free
  // block is large enough. The block's real size is block_size(address).
  std::optional<std::uintptr_t> allocate(std::size_t size);
  // Whether allocate(size) would find a block, changing nothing.
  bool allocate_would_fit(std::size_t size) const noexcept;
  // As allocate(), but from the first free block at `address` for which
  // accept(address, rounded size) holds, in the order allocate() prefers
  // them, looking at up to `looks` blocks (so it stays O(1)); nullopt if none.
  template <class Accept>
  std::optional<std::uintptr_t> allocate_where(std::size_t size, Accept accept, int looks) {
    const std::size_t wanted = rounded_size(size);
    if (wanted < size) return std::nullopt;
    Block* found = nullptr;
    auto consider = [&](Block* block) {  // (every block looked at counts, fitting or not)
      if (block->size >= wanted && accept(block->address, wanted)) {
        found = block;
        return false;
      }
      return --looks > 0;
    };
    const Index own = index_of(wanted);
    const Index above = index_of_rounded_up(wanted);
    bool more = true;
    for (int first = above.first; more && first < kFirstLevels; ++first) {
      if (!(first_level_bitmap_ >> first & 1)) continue;
      for (int second = first == above.first ? above.second : 0; more && second < kSecondLevels; ++second) {
        if (!(second_level_bitmaps_[first] >> second & 1)) continue;
        for (Block* block = free_lists_[first][second]; more && block; block = block->next_free) more = consider(block);
      }
    }
    if (more && (own.first != above.first || own.second != above.second)) {
      for (Block* block = free_lists_[own.first][own.second]; more && block; block = block->next_free)
        more = consider(block);
    }
    if (!found) return std::nullopt;
    return carve(found, wanted);
  }
  // Frees a block from allocate(); returns its size, or 0 for an address that
  // is not an allocated block (nothing changes then).
  std::size_t deallocate(std::uintptr_t address);
  std::size_t block_size(std::uintptr_t address) const;

  // Growing and shrinking a region in place (an address range the owner maps
  // memory into at its end). Each finds the region by its base among all regions.
  // Adds `size` bytes at the end of the region that starts at `base`; they
  // merge with a free block there.
  void extend_region(std::uintptr_t base, std::size_t size);
  // Where the free space at the end of that region begins: its end when the
  // last block is in use.
  std::uintptr_t free_tail(std::uintptr_t base) const;
  // Gives back the region's end from `end` on, which must lie within the free
  // space at its end, its start included, and leave the region non-empty
  // (multiples of the granularity).
  void shrink_region(std::uintptr_t base, std::uintptr_t end);

  // Removes and returns every region that is entirely free.
  std::vector<Region> take_free_regions();
  // Forgets everything (the owner frees the regions).
  std::vector<Region> take_all_regions();

  std::size_t granularity() const noexcept { return granularity_; }
  std::size_t rounded_size(std::size_t size) const noexcept {
    return size == 0 ? granularity_ : (size + granularity_ - 1) & ~(granularity_ - 1);
  }
  std::size_t region_bytes() const noexcept { return region_bytes_; }
  std::size_t free_bytes() const noexcept { return free_bytes_; }
  std::size_t allocated_bytes() const noexcept { return region_bytes_ - free_bytes_; }
  std::size_t allocated_blocks() const noexcept { return allocated_.size(); }
  std::size_t free_blocks() const noexcept { return free_count_; }
  std::size_t region_count() const noexcept { return regions_.size(); }
  std::size_t largest_free_block() const;
  // Calls visit(address, size) for each free block of at least `at_least`
  // bytes, larger lists first, until it returns false. Only the lists that
  // may hold such blocks are walked. visit() must not change the allocator.
  template <class Visit>
  void for_each_free_block(std::size_t at_least, Visit visit) const {
    const int lowest = at_least == 0 ? 0 : index_of(at_least).first;
    for (int first = kFirstLevels - 1; first >= lowest; --first) {
      if (!(first_level_bitmap_ >> first & 1)) continue;
      for (int second = kSecondLevels - 1; second >= 0; --second) {
        if (!(second_level_bitmaps_[first] >> second & 1)) continue;
        for (const Block* block = free_lists_[first][second]; block; block = block->next_free)
          if (block->size >= at_least && !visit(block->address, block->size)) return;
      }
    }
  }

 private:
  static constexpr int kSecondLevelBits = 4;
  static constexpr int kSecondLevels = 1 << kSecondLevelBits;
  static constexpr int kFirstLevels = 64;

  struct Block {
    std::uintptr_t address;
    std::size_t size;
    Block* previous_in_memory;  // neighbours within the region, by address
    Block* next_in_memory;
    Block* previous_free;  // list links, valid while free
    Block* next_free;
    bool free;
  };

  // Each region ends in a sentinel node: size 0, never free, so nothing merges
  // past it, and its previous_in_memory is the region's last block.
  struct Bounds {
    Block* first;
    Block* sentinel;
  };
  const Bounds& bounds_of(std::uintptr_t base) const;

  struct Index {
    int first;
    int second;
  };
  Index index_of(std::size_t size) const noexcept;
  // The list after `size`'s own unless size is its lower bound: the first
  // whose every block holds it (kFirstLevels if none can).
  Index index_of_rounded_up(std::size_t size) const noexcept;
  // Takes `wanted` bytes from the start of the free `block`.
  std::uintptr_t carve(Block* block, std::size_t wanted);
  Block* find_free(std::size_t size) const noexcept;
  Block* find_in_own_list(std::size_t size) const noexcept;
  static constexpr int kOwnListLooks = 32;  // a bound, so that allocation stays O(1)
  void insert_free(Block* block) noexcept;
  void remove_free(Block* block) noexcept;
  Block* new_block();
  void recycle(Block* block) noexcept;

  std::size_t granularity_;
  std::uint64_t first_level_bitmap_ = 0;
  std::uint32_t second_level_bitmaps_[kFirstLevels] = {};
  Block* free_lists_[kFirstLevels][kSecondLevels] = {};
  std::unordered_map<std::uintptr_t, Block*> allocated_;
  std::vector<Bounds> regions_;
  std::vector<std::unique_ptr<Block[]>> node_chunks_;
  std::vector<Block*> spare_nodes_;
  std::size_t region_bytes_ = 0;
  std::size_t free_bytes_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace cuemm::detail
