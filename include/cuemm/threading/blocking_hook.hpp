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

#include <mutex>
#include <shared_mutex>

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

// The same for a std::shared_mutex, either way it is taken; a writer that
// waits goes before readers that come after it. (glibc's lock lets readers in
// while a writer waits: threads whose shared holds always overlapped kept
// the async manager's reset waiting for seconds on the H100.) Readers pass a
// turnstile that a waiting writer holds, so the shared side is not
// recursive: a thread that holds it must not take it again.
class BlockingAwareSharedMutex : public BasicBlockingAwareMutex<std::shared_mutex> {
 public:
  void lock() {
    std::lock_guard hold(turnstile_);
    BasicBlockingAwareMutex::lock();
  }
  void lock_shared() {
    { std::lock_guard pass(turnstile_); }
    if (mutex_.try_lock_shared()) [[likely]]
      return;
    before_blocking();
    mutex_.lock_shared();
  }
  bool try_lock_shared() { return mutex_.try_lock_shared(); }
  void unlock_shared() { mutex_.unlock_shared(); }

 private:
  BasicBlockingAwareMutex<std::mutex> turnstile_;
};

}  // namespace cuemm
