// cuemm/threading/blocking_hook.hpp: knowing when a call into cuemm may block.
//
// A caller may hold something that other threads need while it is inside
// cuemm: the Python bridge holds the GIL. Giving it up around every call
// costs more than a cached allocation itself, and keeping it across a call
// that waits can deadlock (a stream callback may need it to finish, or the
// thread holding a pool's lock may be waiting for such a callback). So
// cuemm tells the caller just before it might wait: every driver call and
// every wait for a lock that another thread holds first runs the calling
// thread's BlockingHook. Calls that never wait (a block from a thread's
// cache) never run it.
//
//   struct ReleaseOnBlock : cuemm::BlockingHook {
//     void before_blocking() noexcept override { /* give up what others need */ }
//   } hook;
//   cuemm::ScopedBlockingHook scope(hook);  // this thread, until scope ends
//   auto memory = manager.memalloc(size);
//
// Locks that such a waiter may meet are BlockingAwareMutex.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <shared_mutex>  // (std::shared_lock, for BlockingAwareSharedMutex)

namespace cuemm {

class BlockingHook {
 public:
  // Runs on the calling thread before it may block; at most once is enough
  // (later calls within the scope should do nothing).
  virtual void before_blocking() noexcept = 0;

 protected:
  ~BlockingHook() = default;
};

// Installs `hook` for this thread until the scope ends (scopes nest).
class ScopedBlockingHook {
 public:
  explicit ScopedBlockingHook(BlockingHook& hook) noexcept;
  ~ScopedBlockingHook();
  ScopedBlockingHook(const ScopedBlockingHook&) = delete;
  ScopedBlockingHook& operator=(const ScopedBlockingHook&) = delete;

 private:
  BlockingHook* previous_;
};

// Runs this thread's hook, if it has one: call before anything that may wait.
void before_blocking() noexcept;

// A mutex that runs the thread's hook before it waits for another thread to
// unlock it.
template <typename Mutex>
class BasicBlockingAwareMutex {
 public:
  void lock() {
    if (mutex_.try_lock()) [[likely]]
      return;
    before_blocking();
    mutex_.lock();
  }
  bool try_lock() { return mutex_.try_lock(); }
  void unlock() { mutex_.unlock(); }

 protected:
  Mutex mutex_;
};

using BlockingAwareMutex = BasicBlockingAwareMutex<std::mutex>;

// A shared lock that runs the thread's hook before it waits, either way it is
// taken. A writer that waits goes before readers that come after it (glibc's
// shared_mutex lets readers in while a writer waits: threads whose shared
// holds always overlapped kept the async manager's reset waiting for seconds
// on the H100). Readers count themselves on their own thread's line of
// several, so that threads reading at once move no line between them (a
// writer is rare; it reads every line). So the shared side is not recursive
// (a thread that holds it must not take it again: a waiting writer shuts it
// out), and a thread unlocks what it locked, as with std::shared_mutex.
class BlockingAwareSharedMutex {
 public:
  BlockingAwareSharedMutex() = default;
  BlockingAwareSharedMutex(const BlockingAwareSharedMutex&) = delete;
  BlockingAwareSharedMutex& operator=(const BlockingAwareSharedMutex&) = delete;

  void lock();
  bool try_lock();
  void unlock();
  void lock_shared();
  bool try_lock_shared() noexcept;
  void unlock_shared() noexcept;

 private:
  struct alignas(128) Readers {  // (128: a line and the one the CPU fetches with it)
    std::atomic<std::uint32_t> count{0};
  };
  static constexpr std::size_t kReaderLines = 32;
  Readers& this_threads_readers() noexcept;
  void wait_for_the_writer(Readers& readers);
  bool readers_gone() const noexcept;
  void open_to_readers() noexcept;

  std::array<Readers, kReaderLines> readers_;
  std::atomic<bool> writer_{false};  // a writer holds the lock, or waits for the readers to leave
  BlockingAwareMutex writers_;       // one writer at a time
  std::mutex gate_;                  // readers that met a writer wait here for it to leave
  std::condition_variable opened_;
};

}  // namespace cuemm
