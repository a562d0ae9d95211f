// owned_counter.hpp: counters that one thread writes and others read.
//
// A thread's cache or counting shard keeps its figures in atomics so that
// other threads may read them, but only its owner writes them: a relaxed load
// and store, no locked read-modify-write, so the owner's cache line stays its
// own and a reader sees some recent value.
#pragma once

#include <atomic>

namespace cuemm::util {

// Adds `value` to a counter only the calling thread writes; returns the sum.
template <typename T>
T add_own(std::atomic<T>& counter, T value) noexcept {
  const T sum = counter.load(std::memory_order_relaxed) + value;
  counter.store(sum, std::memory_order_relaxed);
  return sum;
}

template <typename T>
T subtract_own(std::atomic<T>& counter, T value) noexcept {
  const T difference = counter.load(std::memory_order_relaxed) - value;
  counter.store(difference, std::memory_order_relaxed);
  return difference;
}

}  // namespace cuemm::util
