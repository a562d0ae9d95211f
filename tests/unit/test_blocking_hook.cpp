// The BlockingHook tells a caller (the Python bridge, which holds the GIL)
// before cuemm may block, and only then: every driver call and every wait for
// a contended lock runs it; a block from a thread's cache does not.
#include <atomic>
#include <thread>

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
