// The pool's block placement, checked against a model of live blocks.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "cuemm/managers/detail/tlsf_block_allocator.hpp"

using cuemm::detail::TlsfBlockAllocator;

namespace {
constexpr std::uintptr_t kBase = 0x7f0000000000;
}

// Four seeds of random allocations and frees, each checked against a model of
// the live blocks. Live bytes hover below 75% of the space, where requests of
// up to 4 MiB in 64 MiB regions fail only by fragmentation: rarely, with a
// good fit (0-23 in 100,000 over seeds 1-20), so the bound is 1 in 2,000.
TEST(TlsfBlockAllocator, RandomWorkloadKeepsBlocksDistinctAlignedAndAccounted) {
  std::size_t failures = 0, attempts = 0;
  for (unsigned seed = 1; seed <= 4; ++seed) {
    TlsfBlockAllocator allocator(256);
    const std::size_t region = std::size_t{64} << 20;
    allocator.add_region(kBase, region);
    allocator.add_region(kBase + (std::size_t{1} << 30), region);
    std::map<std::uintptr_t, std::size_t> live;  // address -> block size
    std::mt19937_64 random(seed);
    for (int step = 0; step < 200000; ++step) {
      const bool allocate = live.empty() || (allocator.allocated_bytes() < region * 3 / 2 && random() % 2 == 0);
      if (allocate) {
        // Two draws in a fixed order (inside one expression, the compiler picks the order).
        const bool large = random() % 8 == 0;
        const std::size_t size = 1 + random() % (large ? (4u << 20) : 65536u);
        ++attempts;
        auto address = allocator.allocate(size);
        if (!address) {
          ++failures;
          continue;
        }
        const std::size_t block = allocator.block_size(*address);
        ASSERT_GE(block, size);
        ASSERT_LT(block, size + size / 8 + 512) << "fit too loose";
        ASSERT_EQ(*address % 256, 0u);
        auto next = live.lower_bound(*address);
        ASSERT_TRUE(next == live.end() || *address + block <= next->first) << "overlaps the next block";
        if (next != live.begin()) {
          auto previous = std::prev(next);
          ASSERT_LE(previous->first + previous->second, *address) << "overlaps the previous block";
        }
        live.emplace(*address, block);
      } else {
        auto victim = live.begin();
        std::advance(victim, static_cast<long>(random() % live.size()));
        ASSERT_EQ(allocator.deallocate(victim->first), victim->second);
        live.erase(victim);
      }
      if (step % 5000 == 0) {
        std::size_t live_bytes = 0;
        for (const auto& [address, size] : live) live_bytes += size;
        ASSERT_EQ(allocator.allocated_bytes(), live_bytes);
        ASSERT_EQ(allocator.allocated_blocks(), live.size());
      }
    }
    for (const auto& [address, size] : live) ASSERT_EQ(allocator.deallocate(address), size);
    EXPECT_EQ(allocator.free_blocks(), 2u) << "freed neighbours did not coalesce";
    EXPECT_EQ(allocator.free_bytes(), 2 * region);
    auto regions = allocator.take_free_regions();
    ASSERT_EQ(regions.size(), 2u);
    EXPECT_EQ(regions[0].size + regions[1].size, 2 * region);
    EXPECT_EQ(allocator.region_bytes(), 0u);
  }
  EXPECT_LE(failures * 2000, attempts) << failures << " of " << attempts
                                       << " allocations failed at under 75% occupancy";
}

TEST(TlsfBlockAllocator, UnknownAddressesChangeNothing) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 1 << 20);
  auto address = allocator.allocate(1000);
  ASSERT_TRUE(address);
  EXPECT_EQ(allocator.deallocate(*address + 256), 0u);
  EXPECT_EQ(allocator.deallocate(*address), 1024u);
  EXPECT_EQ(allocator.deallocate(*address), 0u) << "a double free was accepted";
}

TEST(TlsfBlockAllocator, OnlyEntirelyFreeRegionsAreTaken) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 1 << 20);
  allocator.add_region(kBase + (1 << 24), 1 << 20);
  auto held = allocator.allocate(1 << 20);  // fills one region exactly
  ASSERT_TRUE(held);
  EXPECT_FALSE(allocator.allocate(512 << 10 | 1 << 20)) << "larger than any region";
  EXPECT_TRUE(allocator.has_free_region());
  auto regions = allocator.take_free_regions();
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_NE(regions[0].base, *held);
  EXPECT_FALSE(allocator.has_free_region()) << "the one region left holds a block";
  EXPECT_EQ(allocator.region_count(), 1u);
  EXPECT_FALSE(allocator.allocate(256)) << "space of a taken region was handed out";
  allocator.deallocate(*held);
  EXPECT_TRUE(allocator.has_free_region());
  EXPECT_EQ(allocator.take_free_regions().size(), 1u);
  EXPECT_FALSE(allocator.has_free_region()) << "no region left";
}

TEST(TlsfBlockAllocator, ManyFreeBlocksStillGiveAGoodFit) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, std::size_t{1} << 30);
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 65536; ++i) blocks.push_back(*allocator.allocate(4096));
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator.deallocate(blocks[i]);  // 32768 holes
  EXPECT_GE(allocator.free_blocks(), 32768u);
  auto address = allocator.allocate(4000);
  ASSERT_TRUE(address);
  EXPECT_EQ(allocator.block_size(*address), 4096u) << "the hole was not reused";
}

// The lists above a request hold only blocks that surely fit; when they are
// empty, a block of the request's own list that fits must still be found
// (the pool would otherwise grow, or fail at its maximum size).
TEST(TlsfBlockAllocator, ABlockOfTheRequestsOwnListThatFitsIsFound) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 3 * kMiB + 64 * 1024);
  allocator.add_region(kBase + 8 * kMiB, 3 * kMiB + 8 * 1024);  // the same list, too small, looked at first
  auto address = allocator.allocate(3 * kMiB + 32 * 1024);
  ASSERT_TRUE(address) << "a free block that fits was passed over";
  EXPECT_EQ(*address, kBase);
  EXPECT_FALSE(allocator.allocate(3 * kMiB + 16 * 1024)) << "no free block is that large";
  address = allocator.allocate(3 * kMiB + 8 * 1024);
  ASSERT_TRUE(address);
  EXPECT_EQ(*address, kBase + 8 * kMiB);
}

// for_each_free_block() visits every free block of at least the size asked
// for, larger first, and none smaller, stopping when told.
TEST(TlsfBlockAllocator, FreeBlocksOfAtLeastASizeAreVisitedLargestListsFirst) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 64 * kMiB);
  std::vector<std::uintptr_t> blocks;
  for (const std::size_t size : {1 * kMiB, 4096ul, 6 * kMiB, 4096ul, 2 * kMiB, 4096ul, 3 * kMiB, 4096ul})
    blocks.push_back(*allocator.allocate(size));
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator.deallocate(blocks[i]);  // 1, 6, 2 and 3 MiB free
  std::vector<std::size_t> seen;
  allocator.for_each_free_block(2 * kMiB, [&](std::uintptr_t address, std::size_t size) {
    EXPECT_EQ(allocator.block_size(address), 0u) << "an allocated block was visited";
    seen.push_back(size);
    return true;
  });
  // (The region's free end, 64 MiB less what was taken, is the largest.)
  const std::size_t end = 64 * kMiB - 12 * kMiB - 4 * 4096;
  EXPECT_EQ(seen, (std::vector<std::size_t>{end, 6 * kMiB, 3 * kMiB, 2 * kMiB}));
  seen.clear();
  allocator.for_each_free_block(2 * kMiB, [&](std::uintptr_t, std::size_t size) {
    seen.push_back(size);
    return seen.size() < 2;
  });
  EXPECT_EQ(seen.size(), 2u) << "the visit did not stop when told";
}

// allocate_where() takes the first block it prefers that the caller
// accepts, the good fit's lists first and the request's own list last, and
// gives up after the looks it was allowed.
TEST(TlsfBlockAllocator, AnAcceptedBlockIsTakenInTheOrderOfPreference) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 64 * kMiB);
  std::vector<std::uintptr_t> blocks;
  constexpr std::size_t kRequest = 2 * kMiB + 1000;  // 2 MiB + 1 KiB, rounded
  for (const std::size_t size : {2 * kMiB + 64 * 1024, 4096ul, 3 * kMiB, 4096ul, 8 * kMiB, 4096ul})
    blocks.push_back(*allocator.allocate(size));
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator.deallocate(blocks[i]);
  const std::uintptr_t own_list = blocks[0], three = blocks[2], eight = blocks[4];
  std::vector<std::uintptr_t> looked;
  auto refuse_all = [&](std::uintptr_t address, std::size_t bytes) {
    EXPECT_EQ(bytes, 2 * kMiB + 1024);
    looked.push_back(address);
    return false;
  };
  EXPECT_FALSE(allocator.allocate_where(kRequest, refuse_all, 100));
  // The block of its own list that holds the request first (a better fit
  // than a larger list's head), then 3 MiB (the smallest list whose every
  // block holds it), 8 MiB and the free end; each once.
  ASSERT_EQ(looked.size(), 4u);
  EXPECT_EQ(looked[0], own_list);
  EXPECT_EQ(looked[1], three);
  EXPECT_EQ(looked[2], eight);
  looked.clear();
  EXPECT_FALSE(allocator.allocate_where(kRequest, refuse_all, 2));
  EXPECT_EQ(looked.size(), 2u) << "looked past its bound";
  const auto taken =
      allocator.allocate_where(kRequest, [&](std::uintptr_t address, std::size_t) { return address == eight; }, 100);
  ASSERT_TRUE(taken);
  EXPECT_EQ(*taken, eight);
  EXPECT_EQ(allocator.block_size(eight), 2 * kMiB + 1024);
  EXPECT_EQ(allocator.free_bytes(), 64 * kMiB - 3 * 4096 - 2 * kMiB - 1024);
}

// A free block of the request's own list that holds it is taken before the
// head of a larger list, whose split would leave a piece; of the first few
// such blocks, the smallest.
TEST(TlsfBlockAllocator, ABlockOfTheRequestsOwnListThatHoldsItFitsBest) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 64 * kMiB);
  // Free blocks of 2 MiB + 96 KiB and + 32 KiB (one list: 2 MiB to 2 MiB +
  // 128 KiB), and of 3 MiB, each kept apart by a small block in use.
  std::vector<std::uintptr_t> blocks;
  for (const std::size_t size : {2 * kMiB + 96 * kKiB, 4 * kKiB, 2 * kMiB + 32 * kKiB, 4 * kKiB, 3 * kMiB, 4 * kKiB})
    blocks.push_back(*allocator.allocate(size));
  for (std::size_t i = 0; i < blocks.size(); i += 2) allocator.deallocate(blocks[i]);
  const auto taken = allocator.allocate(2 * kMiB + 16 * kKiB);
  ASSERT_TRUE(taken);
  EXPECT_EQ(*taken, blocks[2]) << "not the smallest block that holds it";
  EXPECT_EQ(allocator.block_size(*taken), 2 * kMiB + 16 * kKiB);
  // One that no block of its own list holds takes the larger list's.
  EXPECT_EQ(*allocator.allocate(2 * kMiB + 100 * kKiB), blocks[4]);
}

// allocate_in_hole() takes the block that allocate() would, only where that
// free block is no larger than the bound; otherwise nothing changes.
TEST(TlsfBlockAllocator, AllocationInAHoleTakesOnlyABlockWithinTheBound) {
  constexpr std::size_t kKiB = 1024, kMiB = kKiB * kKiB;
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 16 * kMiB);
  // A hole of 2 MiB between blocks in use, and 11 MiB free at the end.
  const std::uintptr_t first = *allocator.allocate(1 * kMiB);
  const std::uintptr_t hole = *allocator.allocate(2 * kMiB);
  const std::uintptr_t last = *allocator.allocate(2 * kMiB);
  allocator.deallocate(hole);
  const std::size_t free_before = allocator.free_bytes();
  EXPECT_FALSE(allocator.allocate_in_hole(256 * kKiB, 1 * kMiB)) << "the smallest free block is 2 MiB";
  EXPECT_EQ(allocator.free_bytes(), free_before);
  EXPECT_FALSE(allocator.allocate_in_hole(3 * kMiB, 4 * kMiB)) << "only the 11 MiB at the end holds 3 MiB";
  const auto small = allocator.allocate_in_hole(256 * kKiB, 2 * kMiB);
  ASSERT_TRUE(small);
  EXPECT_GE(*small, hole);
  EXPECT_LT(*small, hole + 2 * kMiB);
  EXPECT_EQ(allocator.block_size(*small), 256 * kKiB);
  EXPECT_EQ(allocator.free_bytes(), free_before - 256 * kKiB);
  EXPECT_NE(*small, first);
  EXPECT_NE(*small, last);
}

TEST(TlsfBlockAllocator, ReleaseAllRegionsForgetsEverything) {
  TlsfBlockAllocator allocator(512);
  allocator.add_region(kBase, 1 << 20);
  allocator.allocate(5000);
  std::vector<TlsfBlockAllocator::Region> regions;
  allocator.release_all_regions([&](const TlsfBlockAllocator::Region& region) { regions.push_back(region); });
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].base, kBase);
  EXPECT_EQ(regions[0].size, std::size_t{1} << 20);
  EXPECT_EQ(allocator.region_bytes(), 0u);
  EXPECT_FALSE(allocator.allocate(512));
  EXPECT_THROW(allocator.add_region(kBase + 1, 512), std::invalid_argument);
}

TEST(TlsfBlockAllocator, ARegionGrowsIntoTheFreeSpaceAtItsEnd) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 1 << 20);
  auto front = allocator.allocate(768 << 10);  // leaves 256 KiB free at the end
  ASSERT_TRUE(front);
  EXPECT_EQ(allocator.free_tail(kBase), kBase + (768 << 10));
  EXPECT_FALSE(allocator.allocate(1 << 20));
  allocator.extend_region(kBase, 1 << 20);
  auto merged = allocator.allocate(1 << 20);  // only fits across the old end
  ASSERT_TRUE(merged);
  EXPECT_EQ(*merged, kBase + (768 << 10));
  EXPECT_EQ(allocator.region_count(), 1u);
  EXPECT_EQ(allocator.region_bytes(), 2u << 20);
  // With the end in use, growth adds a free block after it.
  EXPECT_EQ(allocator.free_tail(kBase), kBase + (1792 << 10));
  allocator.extend_region(kBase, 256 << 10);
  allocator.deallocate(*merged);
  EXPECT_EQ(allocator.free_tail(kBase), kBase + (768 << 10)) << "the freed block did not merge with the grown end";
}

TEST(TlsfBlockAllocator, ARegionShrinksOnlyWithinItsFreeEnd) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 4 << 20);
  auto front = allocator.allocate(1 << 20);
  ASSERT_TRUE(front);
  EXPECT_THROW(allocator.shrink_region(kBase, kBase + (512 << 10)), std::invalid_argument) << "cuts a block in use";
  EXPECT_THROW(allocator.shrink_region(kBase + 256, kBase + (2 << 20)), std::invalid_argument) << "not a region";
  allocator.shrink_region(kBase, kBase + (2 << 20));
  EXPECT_EQ(allocator.region_bytes(), 2u << 20);
  EXPECT_EQ(allocator.free_bytes(), 1u << 20);
  EXPECT_FALSE(allocator.allocate((1 << 20) + 256)) << "space beyond the new end was handed out";
  auto rest = allocator.allocate(1 << 20);
  ASSERT_TRUE(rest);
  EXPECT_EQ(*rest, kBase + (1 << 20));
}

// The whole free end may go, where a block in use before it keeps the region non-empty.
TEST(TlsfBlockAllocator, ARegionShrinksToTheStartOfItsFreeEnd) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, 4 << 20);
  auto front = allocator.allocate(1 << 20);
  ASSERT_TRUE(front);
  allocator.shrink_region(kBase, kBase + (1 << 20));
  EXPECT_EQ(allocator.region_bytes(), 1u << 20);
  EXPECT_EQ(allocator.free_bytes(), 0u);
  EXPECT_EQ(allocator.free_tail(kBase), kBase + (1 << 20)) << "the region's last block is the one in use";
  EXPECT_FALSE(allocator.allocate(256));
  allocator.extend_region(kBase, 1 << 20);
  auto next = allocator.allocate(1 << 20);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, kBase + (1 << 20));
  allocator.deallocate(*front);
  allocator.deallocate(*next);
  EXPECT_THROW(allocator.shrink_region(kBase, kBase), std::invalid_argument) << "an empty region";
}

// A block at an address the owner chose: at a free block's start, inside
// it, at its end; the free space around it stays free and merges again.
TEST(TlsfBlockAllocator, ABlockCanBeTakenAtAChosenAddressInAFreeBlock) {
  TlsfBlockAllocator allocator(256);
  const std::size_t region = std::size_t{1} << 20;
  allocator.add_region(kBase, region);
  const auto first = allocator.allocate(4096);  // [0, 4096)
  ASSERT_EQ(first, std::optional<std::uintptr_t>(kBase));
  // Inside the free block [4096, 1 MiB): a front and a back stay free.
  ASSERT_TRUE(allocator.allocate_at(kBase + 65536, 1000, 8));
  EXPECT_EQ(allocator.block_size(kBase + 65536), 1024u) << "rounded to the granularity";
  EXPECT_EQ(allocator.allocated_bytes(), 4096u + 1024u);
  EXPECT_EQ(allocator.free_blocks(), 2u);
  EXPECT_FALSE(allocator.allocate_at(kBase + 65536, 256, 8)) << "taken already";
  EXPECT_FALSE(allocator.allocate_at(kBase + 65536 - 256, 512, 8)) << "overlaps the block taken";
  EXPECT_FALSE(allocator.allocate_at(kBase + 100, 256, 8)) << "not aligned";
  EXPECT_FALSE(allocator.allocate_at(kBase + region - 256, 512, 8)) << "past the region";
  // At the end of the front's free space, and at the very end of the region.
  ASSERT_TRUE(allocator.allocate_at(kBase + 65536 - 512, 512, 8));
  ASSERT_TRUE(allocator.allocate_at(kBase + region - 512, 512, 8));
  EXPECT_EQ(allocator.free_blocks(), 2u);
  // At a free block's start.
  ASSERT_TRUE(allocator.allocate_at(kBase + 4096, 256, 8));
  EXPECT_EQ(allocator.allocated_bytes(), 4096u + 1024u + 512u + 512u + 256u);
  for (const std::uintptr_t address :
       {kBase, kBase + 65536, kBase + 65536 - 512, kBase + region - 512, kBase + 4096})
    EXPECT_GT(allocator.deallocate(address), 0u) << std::hex << address;
  EXPECT_EQ(allocator.free_blocks(), 1u) << "everything merged again";
  EXPECT_EQ(allocator.largest_free_block(), region);
  EXPECT_EQ(allocator.take_free_regions().size(), 1u);
}

// The look stops after `looks` free blocks, so that it stays bounded.
TEST(TlsfBlockAllocator, ABlockAtAChosenAddressIsLookedForAmongABoundedNumberOfFreeBlocks) {
  TlsfBlockAllocator allocator(256);
  allocator.add_region(kBase, std::size_t{1} << 20);
  std::vector<std::uintptr_t> kept;
  for (int i = 0; i < 64; ++i) {
    kept.push_back(*allocator.allocate(4096));
    (void)allocator.allocate(4096);  // freed below: 64 free holes of 4 KiB between kept blocks
  }
  for (int i = 0; i < 64; ++i) allocator.deallocate(kept[i] + 4096);
  const std::uintptr_t hole = kept[10] + 4096;
  EXPECT_TRUE(allocator.allocate_at(hole, 4096, 100));
  allocator.deallocate(hole);
  EXPECT_FALSE(allocator.allocate_at(hole, 4096, 1)) << "the first free block looked at is the hole freed last";
  EXPECT_TRUE(allocator.allocate_at(kept[63] + 4096, 4096, 1));
}
