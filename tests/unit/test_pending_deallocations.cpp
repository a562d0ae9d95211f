#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cuemm/memory/pending_deallocations.hpp"

using cuemm::PendingDeallocations;

TEST(PendingDeallocations, FlushesWhenTheCountIsExceeded) {
  PendingDeallocations pending(3);
  int released = 0;
  for (int i = 0; i < 3; ++i) pending.add([&] { ++released; });
  EXPECT_EQ(released, 0);
  EXPECT_EQ(pending.pending_count(), 3u);
  pending.add([&] { ++released; });  // 4 > 3
  EXPECT_EQ(released, 4);
  EXPECT_EQ(pending.pending_count(), 0u);
}

TEST(PendingDeallocations, FlushesWhenTheBytesAreExceeded) {
  PendingDeallocations pending(100, 1000);
  int released = 0;
  pending.add([&] { ++released; }, 600);
  pending.add([&] { ++released; }, 400);
  EXPECT_EQ(released, 0) << "1000 bytes is not more than 1000";
  EXPECT_EQ(pending.pending_bytes(), 1000u);
  pending.add([&] { ++released; }, 1);
  EXPECT_EQ(released, 3);
  EXPECT_EQ(pending.pending_bytes(), 0u);
}

TEST(PendingDeallocations, NestedDeferralHoldsEveryReleaseUntilTheOutermostEnds) {
  PendingDeallocations pending(2);
  int released = 0;
  {
    auto outer = pending.defer();
    {
      auto inner = pending.defer();
      for (int i = 0; i < 5; ++i) pending.add([&] { ++released; });
      EXPECT_EQ(pending.flush(), 0u);
    }
    EXPECT_TRUE(pending.is_deferred());
    EXPECT_EQ(released, 0);
  }
  EXPECT_FALSE(pending.is_deferred());
  EXPECT_EQ(released, 5) << "releases over the threshold run when the deferral ends";
}

TEST(PendingDeallocations, FlushAllIgnoresDeferral) {
  PendingDeallocations pending;
  int released = 0;
  auto guard = pending.defer();
  pending.add([&] { ++released; });
  EXPECT_EQ(pending.flush_all(), 1u);
  EXPECT_EQ(released, 1);
}

TEST(PendingDeallocations, AFailingReleaseDoesNotStopTheOthers) {
  PendingDeallocations pending;
  int released = 0;
  pending.add([] { throw std::runtime_error("driver said no"); });
  pending.add([&] { ++released; });
  EXPECT_EQ(pending.flush(), 2u);
  EXPECT_EQ(released, 1);
}

TEST(PendingDeallocations, ConcurrentAddsReleaseEverythingExactlyOnce) {
  PendingDeallocations pending(7);
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) pending.add([&] { released.fetch_add(1); }, 16);
    });
  }
  for (auto& thread : threads) thread.join();
  pending.flush_all();
  EXPECT_EQ(released, 16000);
}
