// The BlockingHook tells a caller (the Python bridge, which holds the GIL)
// before cuemm may block, and only then: every driver call and every wait for
// a contended lock runs it; a block from a thread's cache does not.
#include <atomic>
#include <chrono>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

using namespace cuemm;

namespace {
struct CountingHook final : BlockingHook {
  int calls = 0;
  void before_blocking() noexcept override { ++calls; }
};
}  // namespace

TEST(BlockingHook, RunsBeforeEveryDriverCallOfItsThreadOnly) {
  CountingHook hook;
  {
    ScopedBlockingHook scope(hook);
    int count = 0;
    CUEMM_CU(cuDeviceGetCount, &count);
    EXPECT_EQ(hook.calls, 1);
    EXPECT_EQ(CUEMM_CU_RESULT(cuDeviceGetCount, &count), cuda::CUDA_SUCCESS);
    EXPECT_EQ(hook.calls, 2);
    std::thread([] {
      int others = 0;
      CUEMM_CU(cuDeviceGetCount, &others);  // another thread: no hook
    }).join();
    EXPECT_EQ(hook.calls, 2);
  }
  int count = 0;
  CUEMM_CU(cuDeviceGetCount, &count);
  EXPECT_EQ(hook.calls, 2) << "the hook ran after its scope ended";
}

TEST(BlockingHook, ScopesNest) {
  CountingHook outer, inner;
  ScopedBlockingHook outer_scope(outer);
  {
    ScopedBlockingHook inner_scope(inner);
    before_blocking();
  }
  before_blocking();
  EXPECT_EQ(inner.calls, 1);
  EXPECT_EQ(outer.calls, 1);
}

TEST(BlockingHook, RunsBeforeWaitingForAContendedMutexOnly) {
  BlockingAwareMutex mutex;
  CountingHook hook;
  ScopedBlockingHook scope(hook);
  mutex.lock();  // free: no wait
  mutex.unlock();
  EXPECT_EQ(hook.calls, 0);

  // The holder lets go once the hook has run: no clock decides whether the
  // lock is still held when this thread asks for it.
  std::atomic<bool> held{false};
  struct ReleasingHook final : BlockingHook {
    std::atomic<bool> release{false};
    int calls = 0;
    void before_blocking() noexcept override {
      ++calls;
      release = true;
    }
  } releasing;
  ScopedBlockingHook releasing_scope(releasing);
  std::thread holder([&] {
    std::lock_guard lock(mutex);
    held = true;
    while (!releasing.release) std::this_thread::yield();
  });
  while (!held) std::this_thread::yield();
  mutex.lock();  // waits for the holder
  EXPECT_EQ(releasing.calls, 1);
  mutex.unlock();
  holder.join();
  EXPECT_EQ(hook.calls, 0) << "an outer scope's hook ran";
}

// What the bridge relies on: a pool allocation served from the thread's
// cache keeps the caller's lock; one that must ask the driver lets it go first.
TEST(BlockingHook, APoolRunsItOnlyWhenItMayBlock) {
  Context& context = current_context();
  PoolMemoryManager pool(&context);
  pool.initialize();
  pool.memalloc(4096).reset();  // the segment and this thread's cache exist now
  pool.memalloc(4096).reset();

  CountingHook hook;
  ScopedBlockingHook scope(hook);
  for (int i = 0; i < 100; ++i) pool.memalloc(4096).reset();
  EXPECT_EQ(hook.calls, 0) << "a cached block ran the hook";

  const std::size_t segment_bytes = pool.statistics().reserved_bytes;
  auto large = pool.memalloc(segment_bytes + (1u << 20));  // more than the pool holds: the driver
  EXPECT_GE(hook.calls, 1) << "the pool grew without running the hook";
}

namespace {
// Runs its hook's signal, so that a test knows its thread is about to wait
// (no clock decides whether a lock is still held when a thread asks for it).
struct SignallingHook final : BlockingHook {
  std::atomic<int> calls{0};
  void before_blocking() noexcept override { calls.fetch_add(1); }
};
// Whether the hook ran (false after 10 s: a thread that should have waited
// went in instead, and the test fails rather than hang).
bool ran(const std::atomic<int>& calls) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (calls.load() == 0)
    if (std::chrono::steady_clock::now() > deadline) return false;
    else std::this_thread::yield();
  return true;
}

// This thread takes the lock (`hold`); another then takes it (`take`), which
// must wait, its hook run first, until this thread lets go (`let_go`).
template <typename Hold, typename Take, typename LetGo>
void expect_to_wait_for_this_thread(const char* who, Hold hold, Take take, LetGo let_go) {
  hold();
  SignallingHook hook;
  std::atomic<bool> through{false};
  std::thread other([&] {
    ScopedBlockingHook scope(hook);
    take();
    through = true;
  });
  EXPECT_TRUE(ran(hook.calls)) << who << ": it did not wait";
  EXPECT_FALSE(through) << who << ": it went in beside the holder";
  let_go();
  other.join();
  EXPECT_TRUE(through) << who;
}
}  // namespace

TEST(BlockingAwareSharedMutex, RunsTheHookOnlyBeforeItWaits) {
  BlockingAwareSharedMutex mutex;
  CountingHook hook;
  ScopedBlockingHook scope(hook);
  mutex.lock_shared();
  mutex.unlock_shared();
  mutex.lock();
  mutex.unlock();
  EXPECT_EQ(hook.calls, 0);

  // A writer waits for a reader, and a reader for a writer, each running its hook first.
  expect_to_wait_for_this_thread(
      "a writer behind a reader", [&] { mutex.lock_shared(); }, [&] { std::lock_guard lock(mutex); },
      [&] { mutex.unlock_shared(); });
  expect_to_wait_for_this_thread(
      "a reader behind a writer", [&] { mutex.lock(); }, [&] { std::shared_lock lock(mutex); },
      [&] { mutex.unlock(); });
  EXPECT_EQ(hook.calls, 0) << "this thread never waited";
}

// What reset() of the async manager relies on: readers whose holds always
// overlap do not keep a writer out.
TEST(BlockingAwareSharedMutex, AWaitingWriterGoesBeforeReadersThatComeAfterIt) {
  BlockingAwareSharedMutex mutex;
  mutex.lock_shared();  // the reader already in
  SignallingHook writer_hook;
  std::atomic<bool> writer_in{false}, writer_was_first{false};
  std::thread writer([&] {
    ScopedBlockingHook writer_scope(writer_hook);
    std::lock_guard lock(mutex);
    writer_in = true;
  });
  ASSERT_TRUE(ran(writer_hook.calls)) << "the writer did not wait for the reader";
  // (Waits for the reader now.)
  EXPECT_FALSE(mutex.try_lock_shared()) << "a new reader went in before a waiting writer";
  SignallingHook later_hook;
  std::thread later_reader([&] {
    ScopedBlockingHook later_scope(later_hook);
    std::shared_lock lock(mutex);
    writer_was_first = writer_in.load();
  });
  EXPECT_TRUE(ran(later_hook.calls)) << "the later reader did not wait behind the writer";
  mutex.unlock_shared();
  writer.join();
  later_reader.join();
  EXPECT_TRUE(writer_was_first) << "a later reader went in before the waiting writer";
}

TEST(BlockingAwareSharedMutex, ReadersShareItAndAWriterHasItAlone) {
  BlockingAwareSharedMutex mutex;
  std::atomic<int> readers_in{0}, writers_in{0}, readers_side_by_side{0};
  std::atomic<int> overlaps{0};
  constexpr int kThreads = 8, kRounds = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        if (t == 0 && round % 16 == 0) {
          std::lock_guard lock(mutex);
          if (writers_in.fetch_add(1) != 0 || readers_in.load() != 0) overlaps.fetch_add(1);
          std::this_thread::yield();
          if (readers_in.load() != 0) overlaps.fetch_add(1);
          writers_in.fetch_sub(1);
        } else {
          std::shared_lock lock(mutex);
          if (readers_in.fetch_add(1) > 0) readers_side_by_side.fetch_add(1);
          if (writers_in.load() != 0) overlaps.fetch_add(1);
          std::this_thread::yield();
          readers_in.fetch_sub(1);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(overlaps.load(), 0) << "a writer held it beside another holder";
  EXPECT_GT(readers_side_by_side.load(), 0) << "readers never held it at once";
  EXPECT_TRUE(mutex.try_lock()) << "left held";
  mutex.unlock();
}
