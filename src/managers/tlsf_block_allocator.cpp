#include "cuemm/managers/detail/tlsf_block_allocator.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <stdexcept>

namespace cuemm::detail {

TlsfBlockAllocator::TlsfBlockAllocator(std::size_t granularity) : granularity_(granularity) {
  static_assert(kSecondLevelBits <= 4, "sizes of the smallest granularity, 16, must hold a second level's bits");
  if (granularity < 16 || !std::has_single_bit(granularity))
    throw std::invalid_argument("TlsfBlockAllocator: granularity must be a power of two >= 16");
}

TlsfBlockAllocator::~TlsfBlockAllocator() = default;

TlsfBlockAllocator::Index TlsfBlockAllocator::index_of(std::size_t size) const noexcept {
  // (Every size here is at least the granularity, 16 or more, so first >= kSecondLevelBits: no negative shift.)
  const int first = 63 - std::countl_zero(static_cast<std::uint64_t>(size));
  const int second = static_cast<int>((size >> (first - kSecondLevelBits)) & (kSecondLevels - 1));
  return {first, second};
}

TlsfBlockAllocator::Block* TlsfBlockAllocator::new_block() {
  if (!spare_nodes_) {
    constexpr std::size_t kChunk = 256;
    node_chunks_.push_back(std::make_unique<Block[]>(kChunk));
    Block* chunk = node_chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) recycle(&chunk[i]);
  }
  Block* block = spare_nodes_;
  spare_nodes_ = block->next_free;
  return block;
}

// (Linked through next_free, not kept in a container: a free, which must not
// fail, never allocates.)
void TlsfBlockAllocator::recycle(Block* block) noexcept {
  block->next_free = spare_nodes_;
  spare_nodes_ = block;
}

void TlsfBlockAllocator::insert_free(Block* block) noexcept {
  const Index index = index_of(block->size);
  Block*& first = head(index.first, index.second);
  block->free = true;
  block->previous_free = nullptr;
  block->next_free = first;
  if (first) first->previous_free = block;
  first = block;
  first_level_bitmap_ |= std::uint64_t{1} << index.first;
  second_level_bitmaps_[index.first] |= 1u << index.second;
  ++free_count_;
}

void TlsfBlockAllocator::remove_free(Block* block) noexcept {
  const Index index = index_of(block->size);
  if (block->previous_free) {
    block->previous_free->next_free = block->next_free;
  } else {
    head(index.first, index.second) = block->next_free;
  }
  if (block->next_free) block->next_free->previous_free = block->previous_free;
  if (!head(index.first, index.second)) {
    second_level_bitmaps_[index.first] &= ~(1u << index.second);
    if (!second_level_bitmaps_[index.first]) first_level_bitmap_ &= ~(std::uint64_t{1} << index.first);
  }
  block->free = false;
  --free_count_;
}

TlsfBlockAllocator::Index TlsfBlockAllocator::index_of_rounded_up(std::size_t size) const noexcept {
  const int first = 63 - std::countl_zero(static_cast<std::uint64_t>(size));
  const std::size_t step = std::size_t{1} << (first - kSecondLevelBits);
  const std::size_t rounded = size + step - 1;
  if (rounded < size) return {kFirstLevels, 0};  // overflow: nothing is that large
  return index_of(rounded);
}

void TlsfBlockAllocator::add_region(std::uintptr_t base, std::size_t size) {
  if (size < granularity_ || base % granularity_ || size % granularity_)
    throw std::invalid_argument("TlsfBlockAllocator: a region must be a non-empty multiple of the granularity");
  regions_.reserve(regions_.size() + 1);
  if (!free_lists_) free_lists_ = std::make_unique<Block*[]>(kFirstLevels * kSecondLevels);  // (all null)
  Block* block = new_block();
  Block* sentinel;
  try {
    sentinel = new_block();
  } catch (...) {
    recycle(block);
    throw;
  }
  *block = Block{base, size, nullptr, sentinel, nullptr, nullptr, false};
  *sentinel = Block{base + size, 0, block, nullptr, nullptr, nullptr, false};
  regions_.push_back({block, sentinel});
  insert_free(block);
  region_bytes_ += size;
  free_bytes_ += size;
}

std::optional<std::uintptr_t> TlsfBlockAllocator::allocate(std::size_t size) {
  return allocate_in_hole(size, std::numeric_limits<std::size_t>::max());
}

std::optional<std::uintptr_t> TlsfBlockAllocator::allocate_in_hole(std::size_t size, std::size_t largest) {
  const std::size_t wanted = rounded_size(size);
  if (wanted < size) return std::nullopt;
  // The head of the first list whose every block holds it; failing that, a
  // block of its own list that does.
  Block* block = find_free(wanted, [](std::uintptr_t, std::size_t) { return true; }, kOwnListLooks);
  if (!block || block->size > largest) return std::nullopt;
  return carve(block, wanted);
}

std::uintptr_t TlsfBlockAllocator::carve(Block* block, std::size_t wanted) {
  // Take every resource that can fail before changing any state.
  Block* rest = block->size - wanted >= granularity_ ? new_block() : nullptr;
  try {
    allocated_.emplace(block->address, block);
  } catch (...) {
    if (rest) recycle(rest);
    throw;
  }
  remove_free(block);
  if (rest) {
    *rest = Block{block->address + wanted, block->size - wanted, block, block->next_in_memory, nullptr, nullptr, false};
    if (block->next_in_memory) block->next_in_memory->previous_in_memory = rest;
    block->next_in_memory = rest;
    block->size = wanted;
    insert_free(rest);
  }
  free_bytes_ -= block->size;
  return block->address;
}

bool TlsfBlockAllocator::allocate_at(std::uintptr_t address, std::size_t size, int looks) {
  const std::size_t wanted = rounded_size(size);
  if (wanted < size || wanted == 0 || address % granularity_ || !free_lists_) return false;
  Block* block = nullptr;
  for_each_free_block_node(wanted, [&](Block* candidate) {
    if (candidate->address <= address && address - candidate->address <= candidate->size &&
        wanted <= candidate->address + candidate->size - address)
      block = candidate;
    return !block && --looks > 0;
  });
  if (!block) return false;
  if (address == block->address) {
    carve(block, wanted);
    return true;
  }
  // The free block keeps its node and its front; the block taken and the
  // free space after it get nodes of their own. (Everything that can fail first.)
  const std::uintptr_t end = block->address + block->size;
  Block* taken = new_block();
  Block* back = nullptr;
  try {
    if (end > address + wanted) back = new_block();
    allocated_.emplace(address, taken);
  } catch (...) {
    recycle(taken);
    if (back) recycle(back);
    throw;
  }
  remove_free(block);
  Block* after = block->next_in_memory;  // (a region's sentinel at least)
  *taken = Block{address, wanted, block, after, nullptr, nullptr, false};
  block->next_in_memory = taken;
  block->size = address - block->address;
  if (back) {
    *back = Block{address + wanted, end - address - wanted, taken, after, nullptr, nullptr, false};
    taken->next_in_memory = back;
    after->previous_in_memory = back;
    insert_free(back);
  } else {
    after->previous_in_memory = taken;
  }
  insert_free(block);
  free_bytes_ -= wanted;
  return true;
}

std::size_t TlsfBlockAllocator::deallocate(std::uintptr_t address) {
  auto it = allocated_.find(address);
  if (it == allocated_.end()) return 0;
  Block* block = it->second;
  allocated_.erase(it);
  const std::size_t size = block->size;
  free_bytes_ += size;
  if (Block* next = block->next_in_memory; next && next->free) {
    remove_free(next);
    block->size += next->size;
    block->next_in_memory = next->next_in_memory;
    if (block->next_in_memory) block->next_in_memory->previous_in_memory = block;
    recycle(next);
  }
  if (Block* previous = block->previous_in_memory; previous && previous->free) {
    remove_free(previous);
    previous->size += block->size;
    previous->next_in_memory = block->next_in_memory;
    if (previous->next_in_memory) previous->next_in_memory->previous_in_memory = previous;
    recycle(block);
    block = previous;
  }
  insert_free(block);
  return size;
}

std::size_t TlsfBlockAllocator::block_size(std::uintptr_t address) const {
  auto it = allocated_.find(address);
  return it == allocated_.end() ? 0 : it->second->size;
}

const TlsfBlockAllocator::Bounds& TlsfBlockAllocator::bounds_of(std::uintptr_t base) const {
  for (const Bounds& bounds : regions_)
    if (bounds.first->address == base) return bounds;
  throw std::invalid_argument("TlsfBlockAllocator: no region starts at that address");
}

void TlsfBlockAllocator::extend_region(std::uintptr_t base, std::size_t size) {
  if (size == 0 || size % granularity_)
    throw std::invalid_argument("TlsfBlockAllocator: a region grows by a non-empty multiple of the granularity");
  Block* sentinel = bounds_of(base).sentinel;
  Block* last = sentinel->previous_in_memory;
  if (last->free) {
    remove_free(last);
    last->size += size;
  } else {
    Block* added = new_block();
    *added = Block{sentinel->address, size, last, sentinel, nullptr, nullptr, false};
    last->next_in_memory = added;
    sentinel->previous_in_memory = added;
    last = added;
  }
  sentinel->address += size;
  insert_free(last);
  region_bytes_ += size;
  free_bytes_ += size;
}

std::uintptr_t TlsfBlockAllocator::free_tail(std::uintptr_t base) const {
  const Block* last = bounds_of(base).sentinel->previous_in_memory;
  return last->free ? last->address : last->address + last->size;
}

void TlsfBlockAllocator::shrink_region(std::uintptr_t base, std::uintptr_t end) {
  const Bounds& bounds = bounds_of(base);
  Block* sentinel = bounds.sentinel;
  Block* last = sentinel->previous_in_memory;
  if (end == sentinel->address) return;
  if (!last->free || end < last->address || end > sentinel->address || (end - last->address) % granularity_ ||
      (last == bounds.first && end == last->address))
    throw std::invalid_argument("TlsfBlockAllocator: a region shrinks only within the free space at its end");
  const std::size_t removed = sentinel->address - end;
  remove_free(last);
  if (end == last->address) {  // the whole free end goes: the block before it is the last now
    last->previous_in_memory->next_in_memory = sentinel;
    sentinel->previous_in_memory = last->previous_in_memory;
    recycle(last);
  } else {
    last->size -= removed;
    insert_free(last);
  }
  sentinel->address = end;
  region_bytes_ -= removed;
  free_bytes_ -= removed;
}

bool TlsfBlockAllocator::has_free_region() const noexcept {
  return std::any_of(regions_.begin(), regions_.end(), entirely_free);
}

std::vector<TlsfBlockAllocator::Region> TlsfBlockAllocator::take_free_regions() {
  std::vector<Region> taken;
  std::vector<Bounds> kept;
  // Room first: a push that threw after remove_free() would leave a free
  // block outside every list. Out of host memory, nothing has changed.
  taken.reserve(regions_.size());
  kept.reserve(regions_.size());
  for (const Bounds& bounds : regions_) {
    Block* first = bounds.first;
    if (entirely_free(bounds)) {
      remove_free(first);
      taken.push_back({first->address, first->size});
      region_bytes_ -= first->size;
      free_bytes_ -= first->size;
      recycle(first);
      recycle(bounds.sentinel);
    } else {
      kept.push_back(bounds);
    }
  }
  regions_ = std::move(kept);
  return taken;
}

TlsfBlockAllocator::Region TlsfBlockAllocator::region_of(const Bounds& bounds) const noexcept {
  Region region{bounds.first->address, 0};
  for (const Block* block = bounds.first; block; block = block->next_in_memory) region.size += block->size;
  return region;
}

void TlsfBlockAllocator::forget_all() noexcept {
  regions_.clear();
  allocated_.clear();
  spare_nodes_ = nullptr;
  node_chunks_.clear();
  first_level_bitmap_ = 0;
  for (auto& bitmap : second_level_bitmaps_) bitmap = 0;
  free_lists_.reset();
  region_bytes_ = free_bytes_ = free_count_ = 0;
}

std::vector<TlsfBlockAllocator::RegionUse> TlsfBlockAllocator::region_use() const {
  std::vector<RegionUse> uses;
  uses.reserve(regions_.size());
  for (const Bounds& bounds : regions_) {
    RegionUse use{bounds.first->address, bounds.sentinel->address - bounds.first->address, 0, 0, 0};
    for (const Block* block = bounds.first; block != bounds.sentinel; block = block->next_in_memory) {
      if (!block->free) continue;
      use.free_bytes += block->size;
      ++use.free_blocks;
      use.largest_free_block = std::max(use.largest_free_block, block->size);
    }
    uses.push_back(use);
  }
  return uses;
}

std::size_t TlsfBlockAllocator::largest_free_block() const {
  if (!first_level_bitmap_) return 0;
  const int first = 63 - std::countl_zero(first_level_bitmap_);
  const int second = 31 - std::countl_zero(second_level_bitmaps_[first]);
  std::size_t largest = 0;
  for (Block* block = head(first, second); block; block = block->next_free)
    largest = std::max(largest, block->size);
  return largest;
}

}  // namespace cuemm::detail
