// The lock a pool's thread cache uses: its owner and visitors exclude each
// other. Compiled with its own copy of the lock's source, as the lock is
// private to the library.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "threading/owner_biased_lock.hpp"

using cuemm::OwnerBiasedLock;

namespace {

// Plain (non-atomic) data that the lock alone protects: a torn or lost update
// shows as a count that is off, or as the two halves disagreeing.
struct Guarded {
  std::uint64_t count = 0;
  std::uint64_t mirror = 0;
};

// The owner's two ways in: lock(), or try_lock() with lock() where it fails
// (as the pool's fast paths, which leave a failed try to a slower path).
enum class OwnerEnters { Lock, TryFirst };

void expect_owner_and_visitors_exclude_each_other(OwnerEnters enters = OwnerEnters::Lock) {
  OwnerBiasedLock lock;
  Guarded data;
  constexpr int kOwnerRounds = 2'000'000;
  constexpr int kVisitors = 3;
  constexpr int kVisitorRounds = 2'000;
  std::atomic<bool> torn{false};
  std::thread owner([&] {
    const auto update = [&] {
      if (data.count != data.mirror) torn = true;
      ++data.count;
      ++data.mirror;
    };
    for (int i = 0; i < kOwnerRounds; ++i) {
      if (enters == OwnerEnters::TryFirst) {
        const OwnerBiasedLock::TriedOwnerLock tried(lock.owner());
        if (tried.held()) {
          update();
          continue;
        }
      }
      std::lock_guard guard(lock.owner());
      update();
    }
  });
  std::vector<std::thread> visitors;
  for (int v = 0; v < kVisitors; ++v) {
    visitors.emplace_back([&] {
      for (int i = 0; i < kVisitorRounds; ++i) {
        std::lock_guard guard(lock.visitor());
        if (data.count != data.mirror) torn = true;
        data.count += 1000;
        data.mirror += 1000;
      }
    });
  }
  owner.join();
  for (auto& visitor : visitors) visitor.join();
  EXPECT_FALSE(torn.load()) << "a side saw the other's update half done";
  EXPECT_EQ(data.count, std::uint64_t{kOwnerRounds} + std::uint64_t{kVisitors} * kVisitorRounds * 1000);
  EXPECT_EQ(data.mirror, data.count);
}

TEST(OwnerBiasedLock, OwnerAndVisitorsExcludeEachOther) {
  // With membarrier (Linux 4.14 and later) the owner fences only the
  // compiler; without, this is the next test.
  expect_owner_and_visitors_exclude_each_other();
}

TEST(OwnerBiasedLock, WithoutMembarrierFullFencesStillExclude) {
  const int saved = cuemm::detail::process_barrier_state.exchange(2);  // this test's own copy of the lock's state
  expect_owner_and_visitors_exclude_each_other();
  cuemm::detail::process_barrier_state = saved;
}

TEST(OwnerBiasedLock, AnOwnerThatTriesFirstStillExcludesVisitors) {
  expect_owner_and_visitors_exclude_each_other(OwnerEnters::TryFirst);
  const int saved = cuemm::detail::process_barrier_state.exchange(2);
  expect_owner_and_visitors_exclude_each_other(OwnerEnters::TryFirst);
  cuemm::detail::process_barrier_state = saved;
}

TEST(OwnerBiasedLock, AnOwnersTryFailsWhileAVisitorIsInsideAndBeforeTheBarrierIsProbed) {
  OwnerBiasedLock lock;
  lock.visitor().lock();  // (probes the process barrier)
  EXPECT_FALSE(lock.owner().try_lock()) << "the owner entered while a visitor held the lock";
  lock.visitor().unlock();
  {
    const OwnerBiasedLock::TriedOwnerLock tried(lock.owner());
    ASSERT_TRUE(tried.held());
  }
  lock.visitor().lock();  // enters only once the guard has let go
  lock.visitor().unlock();

  const int saved = cuemm::detail::process_barrier_state.exchange(0);  // as before any lock()
  EXPECT_FALSE(lock.owner().try_lock()) << "try_lock() must leave the probe to lock()";
  lock.owner().lock();
  lock.owner().unlock();
  EXPECT_NE(cuemm::detail::process_barrier_state.load(), 0) << "lock() probes the barrier";
  cuemm::detail::process_barrier_state = saved;
}

TEST(OwnerBiasedLock, AnOwnerWaitsForAVisitorToLeave) {
  OwnerBiasedLock lock;
  std::atomic<bool> owner_entered{false};
  lock.visitor().lock();
  std::thread owner([&] {
    std::lock_guard guard(lock.owner());
    owner_entered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(owner_entered.load()) << "the owner entered while a visitor held the lock";
  lock.visitor().unlock();
  owner.join();
  EXPECT_TRUE(owner_entered.load());
}

TEST(OwnerBiasedLock, AVisitorWaitsForTheOwnerToLeave) {
  OwnerBiasedLock lock;
  std::atomic<bool> visitor_entered{false};
  std::atomic<bool> owner_inside{false};
  std::atomic<bool> release_owner{false};
  std::thread owner([&] {
    std::lock_guard guard(lock.owner());
    owner_inside = true;
    while (!release_owner) std::this_thread::yield();
  });
  while (!owner_inside) std::this_thread::yield();
  std::thread visitor([&] {
    std::lock_guard guard(lock.visitor());
    visitor_entered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(visitor_entered.load()) << "the visitor entered while the owner held the lock";
  release_owner = true;
  owner.join();
  visitor.join();
  EXPECT_TRUE(visitor_entered.load());
}

}  // namespace
