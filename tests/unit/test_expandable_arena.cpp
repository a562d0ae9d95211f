// The expandable arena's assembled blocks (Note [Assembled blocks]): the free
// ends of two mapped pages, and pages of the block's own between them, mapped
// again side by side at addresses of the block's own; and how the arena maps
// and unmaps runs of pages. On either driver.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuemm/managers/detail/expandable_arena.hpp"
#include "support/test_support.hpp"

namespace cuemm::testing {
namespace {

using detail::ExpandableArena;

constexpr std::size_t kPage = std::size_t{2} << 20;

class AssembledBlocks : public ::testing::Test {
 protected:
  void SetUp() override {
    arena.reserve(16 * kPage);
    ASSERT_EQ(arena.granularity(), kPage) << "these cases are laid out for 2 MiB pages";
    ASSERT_TRUE(arena.extend(4 * kPage));
    std::size_t mapped = 0;
    // Pages 0 and 2 mapped, 1 and 3 not: a hole of the range keeps the
    // pages at its ends.
    ASSERT_TRUE(arena.commit(0, kPage, mapped));
    ASSERT_TRUE(arena.commit(2 * kPage, kPage, mapped));
    fill(arena.base(), kPage, 0xAAAAAAAA);
    fill(arena.base() + 2 * kPage, kPage, 0xBBBBBBBB);
  }

  // (Waits for the memset: the arena unmaps without waiting for queued work, as the driver does.)
  static void fill(cuda::CUdeviceptr address, std::size_t bytes, std::uint32_t word) {
    CUEMM_CU(cuMemsetD32, address, word, bytes / 4);
    CUEMM_CU(cuCtxSynchronize);
  }
  static ::testing::AssertionResult holds(cuda::CUdeviceptr address, std::size_t bytes, std::uint32_t word) {
    std::vector<std::uint32_t> words(bytes / 4);
    CUEMM_CU(cuMemcpyDtoH, words.data(), address, bytes);
    for (std::size_t i = 0; i < words.size(); ++i) {
      if (words[i] != word)
        return ::testing::AssertionFailure() << "word " << i << " of " << words.size() << " reads " << std::hex
                                             << words[i] << ", not " << word;
    }
    return ::testing::AssertionSuccess();
  }

  ScopedContext scope{current_context()};
  ExpandableArena arena{current_context().device().id()};
};

TEST_F(AssembledBlocks, TheFreeEndsOfTwoPagesMakeOneBlockThatWritesThroughToThem) {
  const std::size_t tail = kPage / 4, head = kPage / 2;  // page 0's last quarter, page 2's first half
  fill(arena.base() + kPage - tail, tail, 0x11111111);
  fill(arena.base() + 2 * kPage, head, 0x22222222);
  const std::size_t mapped_before = arena.mapped_bytes();
  const auto block = arena.assemble({0, kPage - tail, 0, 2 * kPage});
  ASSERT_TRUE(block);
  EXPECT_EQ(*block % kPage, kPage - tail) << "the block begins where the tail does in its page";
  EXPECT_TRUE(holds(*block, tail, 0x11111111));
  EXPECT_TRUE(holds(*block + tail, head, 0x22222222));
  // One memset across the seam lands in both pages of the range.
  fill(*block, tail + head, 0x33333333);
  EXPECT_TRUE(holds(arena.base() + kPage - tail, tail, 0x33333333));
  EXPECT_TRUE(holds(arena.base() + 2 * kPage, head, 0x33333333));
  EXPECT_TRUE(holds(arena.base(), kPage - tail, 0xAAAAAAAA)) << "the rest of the tail's page";
  EXPECT_TRUE(holds(arena.base() + 2 * kPage + head, kPage - head, 0xBBBBBBBB)) << "the rest of the head's page";
  EXPECT_EQ(arena.mapped_bytes(), mapped_before) << "no page of its own: it holds no more of the device";
  EXPECT_TRUE(arena.in_assembled_block(*block + tail + head - 1));
  EXPECT_FALSE(arena.in_assembled_block(arena.base()));
  EXPECT_EQ(arena.assembled_blocks(), 1u);
  EXPECT_TRUE(arena.disassemble(*block));
  EXPECT_FALSE(arena.disassemble(*block)) << "gone already";
  EXPECT_EQ(arena.assembled_blocks(), 0u);
  EXPECT_TRUE(holds(arena.base() + 2 * kPage, head, 0x33333333)) << "the range keeps its pages";
}

TEST_F(AssembledBlocks, PagesOfItsOwnLieBetweenItsEndsAndCountAsMapped) {
  const std::size_t tail = kPage / 8, head = kPage / 4;
  const std::size_t mapped_before = arena.mapped_bytes();
  const auto block = arena.assemble({0, kPage - tail, 2, 2 * kPage});
  ASSERT_TRUE(block);
  EXPECT_EQ(arena.mapped_bytes(), mapped_before + 2 * kPage);
  const std::size_t bytes = tail + 2 * kPage + head;
  fill(*block, bytes, 0x44444444);
  EXPECT_TRUE(holds(*block, bytes, 0x44444444));
  EXPECT_TRUE(holds(arena.base() + kPage - tail, tail, 0x44444444));
  EXPECT_TRUE(holds(arena.base() + 2 * kPage, head, 0x44444444));
  EXPECT_TRUE(holds(arena.base() + 2 * kPage + head, kPage - head, 0xBBBBBBBB));
  EXPECT_TRUE(arena.disassemble(*block));
  EXPECT_EQ(arena.mapped_bytes(), mapped_before) << "its own pages went back";
}

TEST_F(AssembledBlocks, EitherEndMayBeANewPage) {
  const std::size_t mapped_before = arena.mapped_bytes();
  const auto from_start = arena.assemble({std::nullopt, 0, 1, 2 * kPage});
  ASSERT_TRUE(from_start);
  EXPECT_EQ(*from_start % kPage, 0u);
  const auto to_end = arena.assemble({0, kPage / 2, 1, std::nullopt});
  ASSERT_TRUE(to_end);
  EXPECT_EQ(arena.mapped_bytes(), mapped_before + 2 * kPage);
  fill(*to_end, kPage / 2 + kPage, 0x55555555);
  EXPECT_TRUE(holds(arena.base() + kPage / 2, kPage / 2, 0x55555555));
  EXPECT_TRUE(arena.disassemble(*from_start));
  EXPECT_TRUE(arena.disassemble(*to_end));
  EXPECT_EQ(arena.mapped_bytes(), mapped_before);
}

// The owner keeps an assembled block's ends allocated, but should it call
// them free, the pages stay: unmapping them would pull memory from under
// the block.
TEST_F(AssembledBlocks, APageUnderAnAssembledBlockIsNotUnmappedFromTheRange) {
  const auto block = arena.assemble({0, kPage / 2, 0, 2 * kPage});
  ASSERT_TRUE(block);
  EXPECT_EQ(arena.decommit(0, 4 * kPage), 0u);
  EXPECT_TRUE(arena.committed(0, kPage));
  EXPECT_TRUE(arena.committed(2 * kPage, kPage));
  EXPECT_TRUE(arena.disassemble(*block));
  EXPECT_EQ(arena.decommit(0, 4 * kPage), 2u) << "once the block is gone";
  EXPECT_EQ(arena.mapped_bytes(), 0u);
}

TEST_F(AssembledBlocks, WhatCannotBeAssembledIsRefusedSayingWhy) {
  const std::size_t mapped_before = arena.mapped_bytes();
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({kPage, 0, 0, 2 * kPage}); }, "tail's page",
                                      std::to_string(kPage), "not a mapped page"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({0, 100, 0, 3 * kPage}); }, "head's page",
                                      std::to_string(3 * kPage)));
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({0, 100, 0, 8 * kPage}); }, "head's page"))
      << "past the range's extent";
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({0, 100, 1, 0}); }, "one page"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({0, kPage, 0, 2 * kPage}); }, "from byte"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({std::nullopt, 256, 1, std::nullopt}); }, "no page"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.assemble({std::nullopt, 0, 0, std::nullopt}); }, "no pages"));
  EXPECT_EQ(arena.assembled_blocks(), 0u);
  EXPECT_EQ(arena.mapped_bytes(), mapped_before);
}

// Releasing the arena (a pool's reset) unmaps its assembled blocks first,
// then every page of the range, and frees what they hold of the device.
TEST_F(AssembledBlocks, ReleasingTheArenaUnmapsItsAssembledBlocksToo) {
  const std::uint64_t mappings_before = simulation::active()
      ? simulation::live_allocations(simulation::AllocationKind::VirtualMapping) : 0;
  const auto block = arena.assemble({0, kPage / 2, 1, 2 * kPage});
  ASSERT_TRUE(block);
  arena.release();
  EXPECT_EQ(arena.assembled_blocks(), 0u);
  EXPECT_EQ(arena.mapped_bytes(), 0u);
  EXPECT_FALSE(arena.in_assembled_block(*block));
  if (simulation::active()) {
    EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::VirtualMapping), mappings_before - 2)
        << "the range's two pages and the block's three mappings are gone";
  }
}

// A failure at any step leaves nothing mapped, reserved or created: out of
// memory says so (nullopt), another error throws naming its call.
TEST_F(AssembledBlocks, AFailureAtAnyCallLeavesNothingBehind) {
  if (!simulation::active()) GTEST_SKIP() << "faults are injected by the simulated driver";
  const int device = current_context().device().id();
  const std::uint64_t mappings_before = simulation::live_allocations(simulation::AllocationKind::VirtualMapping);
  const std::uint64_t device_bytes_before = simulation::device_bytes_in_use(device);
  const std::size_t mapped_before = arena.mapped_bytes();
  int failed = 0;
  for (const cuda::CUresult fault : {cuda::CUDA_ERROR_OUT_OF_MEMORY, cuda::CUDA_ERROR_INVALID_VALUE}) {
    for (const char* call : {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess"}) {
      for (std::uint64_t nth = 1; nth <= 4; ++nth) {
        SCOPED_TRACE(std::string(call) + " #" + std::to_string(nth) + ", error " + std::to_string(fault));
        simulation::inject_fault(call, nth, fault);
        std::optional<cuda::CUdeviceptr> block;
        const auto error = caught<CudaError>([&] { block = arena.assemble({0, kPage / 2, 2, 2 * kPage}); });
        simulation::clear_faults();
        if (block) {  // (the call is made fewer than `nth` times)
          EXPECT_TRUE(arena.disassemble(*block));
          continue;
        }
        ++failed;
        EXPECT_EQ(error.has_value(), fault != cuda::CUDA_ERROR_OUT_OF_MEMORY);
        if (error) {
          EXPECT_NE(std::string(error->what()).find(call), std::string::npos) << error->what();
        }
        EXPECT_EQ(arena.assembled_blocks(), 0u);
        EXPECT_EQ(arena.mapped_bytes(), mapped_before);
        EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::VirtualMapping), mappings_before);
        EXPECT_EQ(simulation::device_bytes_in_use(device), device_bytes_before);
      }
    }
  }
  // (A reservation, two creations, four mappings and one grant of access for the block.)
  EXPECT_EQ(failed, 2 * (1 + 2 + 4 + 1));
}

// Pages that one commit maps side by side are granted access together, and
// pages side by side go back with one unmap: a block of many pages costs one
// cuMemSetAccess, not one a page (about 27 us each on the H100).
TEST_F(AssembledBlocks, PagesSideBySideAreGrantedAndUnmappedARunAtATime) {
  ASSERT_TRUE(arena.extend(4 * kPage));  // pages 4-7
  const std::size_t mapped_before = arena.mapped_bytes();
  if (simulation::active()) simulation::reset_call_counts();
  EXPECT_EQ(arena.unmapped_pages(kPage, 7 * kPage), 6u);
  EXPECT_EQ(arena.unmapped_pages(kPage / 2, kPage), 1u) << "page 0 mapped, page 1 not";
  std::size_t mapped = 0;
  ASSERT_TRUE(arena.commit(kPage, 7 * kPage, mapped));  // maps 1 and 3-7 (0 and 2 are mapped)
  EXPECT_EQ(mapped, 6u);
  EXPECT_EQ(arena.unmapped_pages(0, 8 * kPage), 0u);
  EXPECT_EQ(arena.mapped_bytes(), mapped_before + 6 * kPage);
  if (simulation::active()) {
    EXPECT_EQ(simulation::call_count("cuMemMap"), 6u);
    EXPECT_EQ(simulation::call_count("cuMemSetAccess"), 2u) << "page 1, then pages 3-7";
  }
  // Every page reads and writes, across the seams of the run.
  fill(arena.base() + kPage, 7 * kPage, 0x5A5A5A5A);
  EXPECT_TRUE(holds(arena.base() + kPage, 7 * kPage, 0x5A5A5A5A));
  EXPECT_TRUE(holds(arena.base(), kPage, 0xAAAAAAAA)) << "page 0 was mapped before and keeps its bytes";
  if (simulation::active()) simulation::reset_call_counts();
  std::size_t free_before = 0, free_after = 0, total = 0;
  CUEMM_CU(cuMemGetInfo, &free_before, &total);
  EXPECT_EQ(arena.decommit(3 * kPage, 5 * kPage), 5u);
  CUEMM_CU(cuMemGetInfo, &free_after, &total);
  EXPECT_GE(free_after, free_before + 5 * kPage) << "the device has the five pages back: one unmap freed them all";
  if (simulation::active()) {
    EXPECT_EQ(simulation::call_count("cuMemUnmap"), 1u) << "pages 3-7 side by side";
    EXPECT_EQ(simulation::call_count("cuMemRelease"), 5u);
  }
  EXPECT_EQ(arena.mapped_bytes(), mapped_before + kPage);
  EXPECT_FALSE(arena.committed(3 * kPage, 1));
  EXPECT_TRUE(holds(arena.base() + 2 * kPage, kPage, 0x5A5A5A5A)) << "page 2, beside the run, stays";
}

// A grant that fails after some runs were mapped undoes the whole commit.
TEST_F(AssembledBlocks, AFailedGrantUndoesEveryPageTheCommitMapped) {
  if (!simulation::active()) GTEST_SKIP() << "faults are injected by the simulated driver";
  ASSERT_TRUE(arena.extend(4 * kPage));
  const int device = current_context().device().id();
  const std::uint64_t mappings_before = simulation::live_allocations(simulation::AllocationKind::VirtualMapping);
  const std::uint64_t device_bytes_before = simulation::device_bytes_in_use(device);
  const std::size_t mapped_before = arena.mapped_bytes();
  simulation::inject_fault("cuMemSetAccess", 2, cuda::CUDA_ERROR_INVALID_VALUE);  // the second run's grant
  std::size_t mapped = 0;
  const auto error = caught<CudaError>([&] { arena.commit(kPage, 7 * kPage, mapped); });
  simulation::clear_faults();
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(std::string(error->what()).find("cuMemSetAccess"), std::string::npos) << error->what();
  EXPECT_EQ(mapped, 0u);
  EXPECT_EQ(arena.mapped_bytes(), mapped_before);
  EXPECT_FALSE(arena.committed(kPage, 1));
  EXPECT_EQ(simulation::live_allocations(simulation::AllocationKind::VirtualMapping), mappings_before);
  EXPECT_EQ(simulation::device_bytes_in_use(device), device_bytes_before);
  EXPECT_TRUE(holds(arena.base() + 2 * kPage, kPage, 0xBBBBBBBB)) << "the pages mapped before stay";
}

// Its IPC export names its pages in order, the range's by the descriptors
// the range offers for them.
TEST_F(AssembledBlocks, AnIpcExportNamesItsPagesInOrder) {
  std::size_t offset = 0;
  std::optional<MappedExport> tail_page;
  if (const auto refused = caught<NotSupported>([&] { tail_page = arena.share(arena.base(), kPage, offset); }))
    GTEST_SKIP() << "this device cannot share the arena: " << refused->what();
  const MappedExport head_page = arena.share(arena.base() + 2 * kPage, kPage, offset);
  const std::size_t tail = kPage / 4;
  const auto block = arena.assemble({0, kPage - tail, 1, 2 * kPage});
  ASSERT_TRUE(block);
  const MappedExport whole = arena.share(*block, tail + kPage + 100, offset);
  EXPECT_EQ(offset, kPage - tail);
  ASSERT_EQ(whole.pieces.size(), 3u);
  EXPECT_EQ(whole.pieces[0].token, tail_page->pieces.at(0).token);
  EXPECT_NE(whole.pieces[1].token, whole.pieces[0].token);
  EXPECT_EQ(whole.pieces[2].token, head_page.pieces.at(0).token);
  const MappedExport inner = arena.share(*block + tail, kPage, offset);
  EXPECT_EQ(offset, 0u);
  ASSERT_EQ(inner.pieces.size(), 1u) << "from the block's own page, one page";
  EXPECT_EQ(inner.pieces[0].token, whole.pieces[1].token);
  EXPECT_TRUE(throws<InvalidArgument>([&] { arena.share(*block, tail + 2 * kPage + 1, offset); }, "runs past"));
  EXPECT_TRUE(arena.disassemble(*block));
}

}  // namespace
}  // namespace cuemm::testing
