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
// the split returns the rest) keeps fragmentation low. Blocks of the request's
// own list may hold it too, and fit it better than a larger list's head, whose
// split leaves a piece that few requests fit: the smallest of the first
// kOwnListFirstLooks of them that holds it is taken first. (Simulated driver,
// RMM's random workload, seeds 1-16, peak reserved over live: up to 4 MiB
// with 512 MiB live 1.20 -> 1.19, with 128 MiB 1.437 -> 1.410; the rest the
// same.) When no list above has a block, up to kOwnListLooks blocks of the
// own list are looked at: passing over one that fits would grow the pool (or
// fail it at its maximum size) with the block free.
// Device memory cannot hold allocator metadata, so each block is described by
// a host-side node; an address-to-node map finds the node on free.
//
// Not thread-safe: the owner locks. Knows nothing of CUDA: regions are plain
// address ranges handed in by the owner, which also takes them back (trim).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
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
  // As allocate(), but from the first free block at `address` for which
  // accept(address, rounded size) holds, in the order allocate() prefers
  // them, looking at up to `looks` blocks (so it stays O(1)); nullopt if none.
  template <class Accept>
  std::optional<std::uintptr_t> allocate_where(std::size_t size, Accept accept, int looks) {
    const std::size_t wanted = rounded_size(size);
    if (wanted < size) return std::nullopt;
    Block* block = find_free(wanted, accept, looks);
    if (!block) return std::nullopt;
    return carve(block, wanted);
  }
  // As allocate(), but only where the free block that allocate() would split
  // has at most `largest` bytes: a hole too small for other requests is put to
  // use, and larger free space is left to them. Nullopt otherwise.
  std::optional<std::uintptr_t> allocate_in_hole(std::size_t size, std::size_t largest);
  // Allocates exactly [address, address + size) (size rounded up to the
  // granularity), where that lies in one free block among the first `looks`
  // free blocks that could hold it, larger lists first (as
  // for_each_free_block() visits them); false, changing nothing, otherwise.
  // For an owner that chose the place itself (Note [Assembled blocks]).
  bool allocate_at(std::uintptr_t address, std::size_t size, int looks);
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
  // Whether any region is entirely free (a look at each region's first block).
  bool has_free_region() const noexcept;
  // Calls release(region) for every region, then forgets everything: the
  // owner's reset, which allocates nothing on the way, so that the regions go
  // back even where the host is out of memory.
  template <class Release>
  void release_all_regions(Release release) {
    for (const Bounds& bounds : regions_) release(region_of(bounds));
    forget_all();
  }

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
  // Each region's free space, found by walking all of its blocks: O(blocks),
  // for diagnostics (PoolMemoryManager::segments()), not for allocation.
  struct RegionUse {
    std::uintptr_t base;
    std::size_t size;
    std::size_t free_bytes;
    std::size_t free_blocks;
    std::size_t largest_free_block;
  };
  std::vector<RegionUse> region_use() const;
  // Calls visit(address, size) for each free block of at least `at_least`
  // bytes, larger lists first, until it returns false. Only the lists that
  // may hold such blocks are walked. visit() must not change the allocator.
  template <class Visit>
  void for_each_free_block(std::size_t at_least, Visit visit) const {
    for_each_free_block_node(at_least, [&](const Block* block) { return visit(block->address, block->size); });
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
  // Whether the region holds one block, free.
  static bool entirely_free(const Bounds& bounds) noexcept {
    return bounds.first->free && bounds.first->next_in_memory == bounds.sentinel;
  }
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
  // The first free block of at least `wanted` bytes that accept(address,
  // wanted) takes, in the order of preference: the smallest of the first
  // kOwnListFirstLooks blocks of wanted's own list that hold it, the lists
  // whose every block holds `wanted`, smallest first (two bit scans find
  // each), then the rest of wanted's own list; nullptr once `looks` blocks
  // were passed over.
  template <class Accept>
  Block* find_free(std::size_t wanted, Accept accept, int looks) const {
    if (!free_lists_) return nullptr;  // no regions
    const Index above = index_of_rounded_up(wanted);
    const Index own = index_of(wanted);
    const bool own_list_apart = own.first != above.first || own.second != above.second;
    Block* rest_of_own = own_list_apart ? head(own.first, own.second) : nullptr;
    if (rest_of_own) {
      Block* smallest = nullptr;
      for (int i = 0; rest_of_own && i < kOwnListFirstLooks; ++i) {
        Block* block = std::exchange(rest_of_own, rest_of_own->next_free);
        if (block->size >= wanted && (!smallest || block->size < smallest->size) && accept(block->address, wanted))
          smallest = block;
        if (--looks <= 0) return smallest;
      }
      if (smallest) return smallest;
    }
    if (above.first < kFirstLevels) {
      int first = above.first;
      std::uint32_t seconds = second_level_bitmaps_[first] & (~0u << above.second);
      for (;;) {
        for (; seconds; seconds &= seconds - 1) {
          for (Block* block = head(first, std::countr_zero(seconds)); block; block = block->next_free) {
            if (accept(block->address, wanted)) return block;  // (every block of these lists holds it)
            if (--looks <= 0) return nullptr;
          }
        }
        const std::uint64_t firsts =
            first + 1 >= kFirstLevels ? 0 : first_level_bitmap_ & (~std::uint64_t{0} << (first + 1));
        if (!firsts) break;
        first = std::countr_zero(firsts);
        seconds = second_level_bitmaps_[first];
      }
    }
    if (!own_list_apart) return nullptr;  // (walked above)
    for (Block* block = rest_of_own; block; block = block->next_free) {
      if (block->size >= wanted && accept(block->address, wanted)) return block;
      if (--looks <= 0) return nullptr;
    }
    return nullptr;
  }
  // for_each_free_block() over the nodes themselves.
  template <class Visit>
  void for_each_free_block_node(std::size_t at_least, Visit visit) const {
    if (!free_lists_) return;
    const int lowest = at_least == 0 ? 0 : index_of(at_least).first;
    for (int first = kFirstLevels - 1; first >= lowest; --first) {
      if (!(first_level_bitmap_ >> first & 1)) continue;
      for (int second = kSecondLevels - 1; second >= 0; --second) {
        if (!(second_level_bitmaps_[first] >> second & 1)) continue;
        for (Block* block = head(first, second); block; block = block->next_free)
          if (block->size >= at_least && !visit(block)) return;
      }
    }
  }
  static constexpr int kOwnListFirstLooks = 8;
  static constexpr int kOwnListLooks = 32;  // a bound, so that allocation stays O(1)
  void insert_free(Block* block) noexcept;
  void remove_free(Block* block) noexcept;
  Block* new_block();
  void recycle(Block* block) noexcept;

  std::size_t granularity_;
  std::uint64_t first_level_bitmap_ = 0;
  std::uint32_t second_level_bitmaps_[kFirstLevels] = {};
  // Each list's first block, kSecondLevels per first level. Made with the
  // first region and dropped with the last (release_all_regions()): a retired
  // pool core, kept until exit, then keeps no 8 KiB of empty lists.
  std::unique_ptr<Block*[]> free_lists_;
  Block*& head(int first, int second) const noexcept { return free_lists_[first * kSecondLevels + second]; }
  std::unordered_map<std::uintptr_t, Block*> allocated_;
  Region region_of(const Bounds& bounds) const noexcept;
  void forget_all() noexcept;

  std::vector<Bounds> regions_;
  std::vector<std::unique_ptr<Block[]>> node_chunks_;
  Block* spare_nodes_ = nullptr;  // nodes not in use, linked through next_free
  std::size_t region_bytes_ = 0;
  std::size_t free_bytes_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace cuemm::detail
