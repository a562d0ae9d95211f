// The bookkeeping of the pool's large blocks (Note [Dedicated segments]).
#include <gtest/gtest.h>

#include "cuemm/managers/detail/dedicated_segments.hpp"

using cuemm::detail::DedicatedSegments;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}

TEST(DedicatedSegments, SegmentsAreWholePagesOrSmallSteps) {
  EXPECT_EQ(DedicatedSegments::segment_size(4 * MiB), 4 * MiB);
  EXPECT_EQ(DedicatedSegments::segment_size(4 * MiB + 1), 6 * MiB);
  EXPECT_EQ(DedicatedSegments::segment_size(80), 256u);
  EXPECT_EQ(DedicatedSegments::segment_size(0), 256u);
  EXPECT_EQ(DedicatedSegments::segment_size(2 * MiB - 1), 2 * MiB);
  EXPECT_EQ(DedicatedSegments::segment_size(SIZE_MAX - 5), 0u) << "overflow must not wrap to a small segment";
}

TEST(DedicatedSegments, ASpareServesRequestsUpToAnEighthSmaller) {
  DedicatedSegments segments;
  segments.add(0x1000000, 64 * MiB);
  segments.make_spare(0x1000000);
  EXPECT_EQ(segments.spare_bytes(), 64 * MiB);
  EXPECT_FALSE(segments.take_spare(56 * MiB - 2 * MiB)) << "a spare 1/7 larger than the request wastes too much";
  EXPECT_FALSE(segments.take_spare(66 * MiB)) << "a spare smaller than the request";
  ASSERT_EQ(segments.take_spare(58 * MiB), std::optional<std::uintptr_t>(0x1000000));
  EXPECT_EQ(segments.spare_bytes(), 0u);
  EXPECT_EQ(segments.bytes(), 64 * MiB) << "a reused spare is still a segment";
  EXPECT_FALSE(segments.take_spare(58 * MiB)) << "handed out twice";
}

// The pool's shared segments take over the smallest spare that holds a
// request (PoolMemoryManager's adopt_spare()); it is no segment of its own then.
TEST(DedicatedSegments, TheSmallestSpareThatHoldsASizeCanBeTakenOver) {
  DedicatedSegments segments;
  segments.add(std::uintptr_t{1} << 32, 16 * MiB);
  segments.add(std::uintptr_t{2} << 32, 6 * MiB);
  segments.add(std::uintptr_t{3} << 32, 6 * MiB);
  segments.add(std::uintptr_t{4} << 32, 4 * MiB);  // in use
  for (std::uintptr_t i = 1; i <= 3; ++i) segments.make_spare(i << 32);
  EXPECT_FALSE(segments.smallest_spare_of_at_least(17 * MiB));
  const auto spare = segments.smallest_spare_of_at_least(5 * MiB);
  ASSERT_TRUE(spare);
  EXPECT_EQ(spare->size, 6 * MiB);
  EXPECT_EQ(segments.spare_bytes(), 28 * MiB) << "looking took it";
  segments.forget_spare(*spare);
  EXPECT_EQ(segments.spare_bytes(), 22 * MiB);
  EXPECT_EQ(segments.bytes(), 26 * MiB);
  EXPECT_EQ(segments.size_of(spare->base), 0u) << "still a segment of its own";
  segments.forget_spare(*spare);  // twice: nothing changes
  EXPECT_EQ(segments.bytes(), 26 * MiB);
  const auto other = segments.smallest_spare_of_at_least(5 * MiB);
  ASSERT_TRUE(other);
  EXPECT_NE(other->base, spare->base);
  EXPECT_EQ(other->size, 6 * MiB);
  segments.forget_spare({std::uintptr_t{4} << 32, 4 * MiB});  // in use, no spare: nothing changes
  EXPECT_EQ(segments.size_of(std::uintptr_t{4} << 32), 4 * MiB);
}

TEST(DedicatedSegments, TheLargestSparesAreGivenBackFirst) {
  DedicatedSegments segments;
  for (std::uintptr_t i = 1; i <= 4; ++i) {
    segments.add(i << 32, i * 8 * MiB);
    segments.make_spare(i << 32);
  }
  segments.add(std::uintptr_t{9} << 32, 10 * MiB);  // in use: never given back
  const auto taken = segments.take_spares_over(30 * MiB);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].size, 32 * MiB);
  EXPECT_EQ(taken[1].size, 24 * MiB);
  EXPECT_EQ(segments.spare_bytes(), 24 * MiB);
  EXPECT_EQ(segments.bytes(), 34 * MiB);
  EXPECT_EQ(segments.size_of(std::uintptr_t{4} << 32), 0u) << "a given-back segment is forgotten";
  std::size_t released = 0;
  segments.release_all([&](const DedicatedSegments::Segment&) { ++released; });
  EXPECT_EQ(released, 3u);
  EXPECT_EQ(segments.bytes(), 0u);
}

TEST(DedicatedSegments, UnknownAddressesChangeNothing) {
  DedicatedSegments segments;
  segments.add(0x200000, 4 * MiB);
  segments.make_spare(0x400000);
  segments.forget(0x400000);
  EXPECT_EQ(segments.size_of(0x400000), 0u);
  EXPECT_EQ(segments.bytes(), 4 * MiB);
  EXPECT_EQ(segments.spare_bytes(), 0u);
}
