// threading/owner_biased_lock.hpp (private to the library): a lock that is almost free for the
// one thread that nearly always takes it.
//
// A pool's per-thread cache is locked by its own thread on every allocation
// and free, and by another thread only to flush it (a trim, out of memory,
// a reset). An atomic exchange per lock was half the cost of a cached
// allocate+free pair. Here the owner takes the lock with plain stores and a
// compiler-only fence; a visitor pays instead, with a process-wide memory
// barrier (Linux membarrier) that makes the owner's stores visible before it
// looks at them. Where membarrier is missing, both sides use full fences: as
// fast as an exchange, and as correct.
//
//   OwnerBiasedLock lock;
//   { std::lock_guard guard(lock.owner()); ... }    // only ever the owning thread
//   { std::lock_guard guard(lock.visitor()); ... }  // any other thread
//
// Not recursive; a visitor must not be the owner inside its own critical section.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>

#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

namespace detail {
// 0: not yet probed; 1: membarrier is registered; 2: unavailable.
// (Hidden: read on every owner lock, without a trip through the GOT.)
[[gnu::visibility("hidden")]] extern std::atomic<int> process_barrier_state;
bool probe_process_barrier() noexcept;
// Whether process_barrier() reaches the other threads (probed on first call).
inline bool process_barrier_available() noexcept {
  const int state = process_barrier_state.load(std::memory_order_relaxed);
  return state == 1 || (state == 0 && probe_process_barrier());
}
// Makes every running thread of the process execute a full memory barrier;
// where that is unavailable, a full fence on this thread only (owners then
// use full fences too).
void process_barrier() noexcept;
// The fence of the side that process_barrier()'s caller pays for: the
// compiler's only, where the process barrier reaches this thread.
inline void light_fence() noexcept {
  if (process_barrier_available()) [[likely]]
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
}
}  // namespace detail

class OwnerBiasedLock {
 public:
  class OwnerSide {
   public:
    void lock() noexcept { lock_->lock_as_owner(); }
    // Without waiting and without calls, for fast paths that leave the rest
    // to a slower one: false (not held) while a visitor is inside, or
    // before the first lock() has probed the process barrier.
    bool try_lock() noexcept { return lock_->try_lock_as_owner(); }
    void unlock() noexcept { lock_->owner_inside_.store(false, std::memory_order_release); }

   private:
    friend class OwnerBiasedLock;
    explicit OwnerSide(OwnerBiasedLock* lock) : lock_(lock) {}
    OwnerBiasedLock* lock_;
  };
  // The owner's side for a scope, where try_lock() got it: the fast paths'
  // guard. (std::unique_lock's unlock() may throw, and once a change
  // elsewhere made the compiler call it out of line, the cached pair saved
  // registers again.)
  class TriedOwnerLock {
   public:
    explicit TriedOwnerLock(OwnerSide& owner) noexcept : owner_(owner), held_(owner.try_lock()) {}
    ~TriedOwnerLock() {
      if (held_) owner_.unlock();
    }
    TriedOwnerLock(const TriedOwnerLock&) = delete;
    TriedOwnerLock& operator=(const TriedOwnerLock&) = delete;
    bool held() const noexcept { return held_; }

   private:
    OwnerSide& owner_;
    const bool held_;
  };
  class VisitorSide {
   public:
    void lock() { lock_->lock_as_visitor(); }
    void unlock() noexcept {
      lock_->visitor_inside_.store(false, std::memory_order_release);
      lock_->visitors_.unlock();
    }

   private:
    friend class OwnerBiasedLock;
    explicit VisitorSide(OwnerBiasedLock* lock) : lock_(lock) {}
    OwnerBiasedLock* lock_;
  };

  OwnerBiasedLock() = default;
  OwnerBiasedLock(const OwnerBiasedLock&) = delete;
  OwnerBiasedLock& operator=(const OwnerBiasedLock&) = delete;

  OwnerSide& owner() noexcept { return owner_side_; }
  VisitorSide& visitor() noexcept { return visitor_side_; }

 private:
  // Dekker's pair of flags: each side raises its own, fences, then checks the
  // other's. The owner's fence costs nothing because a visitor's barrier
  // runs one on the owner's CPU.
  void lock_as_owner() noexcept {
    owner_inside_.store(true, std::memory_order_relaxed);
    detail::light_fence();
    if (visitor_inside_.load(std::memory_order_acquire)) [[unlikely]]
      wait_for_the_visitor();
  }
  bool try_lock_as_owner() noexcept {
    const int state = detail::process_barrier_state.load(std::memory_order_relaxed);
    if (state == 0) [[unlikely]]
      return false;
    owner_inside_.store(true, std::memory_order_relaxed);
    if (state == 1) [[likely]]
      std::atomic_signal_fence(std::memory_order_seq_cst);
    else
      std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!visitor_inside_.load(std::memory_order_acquire)) [[likely]]
      return true;
    owner_inside_.store(false, std::memory_order_release);
    return false;
  }
  // Out of line: the owner's fast paths then need no saved registers for it.
  [[gnu::noinline]] void wait_for_the_visitor() noexcept {
    do {
      owner_inside_.store(false, std::memory_order_release);
      before_blocking();
      while (visitor_inside_.load(std::memory_order_acquire)) std::this_thread::yield();
      owner_inside_.store(true, std::memory_order_relaxed);
      detail::light_fence();
    } while (visitor_inside_.load(std::memory_order_acquire));
  }
  void lock_as_visitor() {
    visitors_.lock();
    visitor_inside_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    detail::process_barrier();
    while (owner_inside_.load(std::memory_order_acquire)) std::this_thread::yield();  // held only briefly
  }

  std::atomic<bool> owner_inside_{false};
  std::atomic<bool> visitor_inside_{false};
  BlockingAwareMutex visitors_;  // one visitor at a time
  OwnerSide owner_side_{this};
  VisitorSide visitor_side_{this};
};

}  // namespace cuemm
