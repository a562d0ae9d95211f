// pool/foreign_frees.hpp: large blocks freed by a thread that did not take
// them, waiting for the next holder of the pool's lock (Note [Large frees
// from another thread] in core.hpp).
//
// A bounded queue of many producers and one consumer at a time: any thread
// offers a block without a lock; the pool's lock holder takes them. Each
// slot's sequence says whose turn it is (the producer's at `position`, the
// consumer's at `position + 1`), so neither side waits for the other.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "thread_cache.hpp"

namespace cuemm::detail {

class ForeignFrees {
 public:
  static constexpr std::size_t kCapacity = 64;

  ForeignFrees() noexcept {
    for (std::size_t i = 0; i < kCapacity; ++i) slots_[i].sequence.store(i, std::memory_order_relaxed);
  }

  // Queues `freed`; false (nothing queued) when the queue is full.
  bool offer(const Freed& freed) noexcept {
    std::size_t position = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& slot = slots_[position % kCapacity];
      const std::size_t sequence = slot.sequence.load(std::memory_order_acquire);
      const auto turn = static_cast<std::ptrdiff_t>(sequence - position);
      if (turn == 0) {
        if (tail_.compare_exchange_weak(position, position + 1, std::memory_order_relaxed)) {
          slot.freed = freed;
          slot.sequence.store(position + 1, std::memory_order_release);
          return true;
        }
      } else if (turn < 0) {
        return false;  // the slot still holds a block from a lap before
      } else {
        position = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Whether a block is waiting, for a look before taking the pool's lock's
  // slow path: one load, of the next slot, as take() would read it (the
  // consumer's: a look at the producers' end would move its line away from
  // them at every lock).
  bool may_hold() const noexcept {
    const std::size_t position = head_.load(std::memory_order_relaxed);
    return slots_[position % kCapacity].sequence.load(std::memory_order_acquire) == position + 1;
  }

  // The oldest block whose producer has finished writing it; false if none.
  // One caller at a time (the pool's lock holder), as for may_hold().
  bool take(Freed& freed) noexcept {
    if (!may_hold()) return false;
    const std::size_t position = head_.load(std::memory_order_relaxed);
    Slot& slot = slots_[position % kCapacity];
    freed = slot.freed;
    slot.sequence.store(position + kCapacity, std::memory_order_release);
    head_.store(position + 1, std::memory_order_relaxed);
    return true;
  }

 private:
  // A line each: a producer writes one slot while the consumer reads the one before.
  struct alignas(64) Slot {
    std::atomic<std::size_t> sequence;
    Freed freed;
  };
  // The producers' end and the consumer's on lines of their own.
  alignas(64) std::atomic<std::size_t> tail_{0};
  alignas(64) std::atomic<std::size_t> head_{0};
  alignas(64) std::array<Slot, kCapacity> slots_;
};

}  // namespace cuemm::detail
