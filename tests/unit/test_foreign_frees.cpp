// The queue of large frees that the pool's lock holder takes in (Note [Large
// frees from another thread]): order, its bound, and many threads offering
// while one takes. The queue is private to the library: the test includes
// its header from src/.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "managers/pool/foreign_frees.hpp"

using cuemm::detail::ForeignFrees;
using cuemm::detail::Freed;

TEST(ForeignFrees, BlocksComeOutInTheOrderTheyWereOffered) {
  ForeignFrees queue;
  EXPECT_FALSE(queue.may_hold());
  for (std::uintptr_t i = 1; i <= 10; ++i) ASSERT_TRUE(queue.offer({i * 256, i}));
  EXPECT_TRUE(queue.may_hold());
  Freed freed{};
  for (std::uintptr_t i = 1; i <= 10; ++i) {
    ASSERT_TRUE(queue.take(freed));
    EXPECT_EQ(freed.address, i * 256);
    EXPECT_EQ(freed.epoch, i);
  }
  EXPECT_FALSE(queue.take(freed));
  EXPECT_FALSE(queue.may_hold());
}

// A full queue refuses (its caller then takes the pool's lock itself), and
// has room again once one block is taken, lap after lap.
TEST(ForeignFrees, AFullQueueRefusesUntilABlockIsTaken) {
  ForeignFrees queue;
  std::uintptr_t next = 1;
  for (int lap = 0; lap < 3; ++lap) {
    while (queue.offer({next * 256, next})) ++next;
    EXPECT_EQ(next - 1, (lap + 1) * ForeignFrees::kCapacity) << "lap " << lap;
    Freed freed{};
    ASSERT_TRUE(queue.take(freed));
    EXPECT_EQ(freed.address, (lap * (ForeignFrees::kCapacity - 1) + lap + 1) * 256);
    EXPECT_TRUE(queue.offer({next * 256, next}));
    ++next;
    EXPECT_FALSE(queue.offer({next * 256, next}));
    for (std::size_t i = 0; i < ForeignFrees::kCapacity - 1; ++i) ASSERT_TRUE(queue.take(freed));
  }
}

// Producers on four threads, the taker on a fifth: every block comes out
// exactly once, each producer's in its order.
TEST(ForeignFrees, BlocksOfManyThreadsComeOutOnceEach) {
  constexpr int kProducers = 4;
  constexpr std::uintptr_t kEach = 20000;
  ForeignFrees queue;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (std::uintptr_t i = 0; i < kEach; ++i) {
        const Freed freed{(static_cast<std::uintptr_t>(p) << 32) | i, i};
        while (!queue.offer(freed)) std::this_thread::yield();  // full: the taker catches up
      }
    });
  }
  std::vector<std::uintptr_t> next(kProducers, 0);
  std::uintptr_t taken = 0, out_of_order = 0;
  while (taken < kProducers * kEach) {
    Freed freed{};
    if (!queue.take(freed)) {
      std::this_thread::yield();
      continue;
    }
    const auto producer = static_cast<std::size_t>(freed.address >> 32);
    ASSERT_LT(producer, static_cast<std::size_t>(kProducers));
    if ((freed.address & 0xffffffffu) != next[producer] || freed.epoch != next[producer]) ++out_of_order;
    ++next[producer];
    ++taken;
  }
  for (auto& producer : producers) producer.join();
  EXPECT_EQ(out_of_order, 0u);
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(next[p], kEach) << "producer " << p;
  Freed freed{};
  EXPECT_FALSE(queue.take(freed)) << "a block came out twice";
}
