// atomic_max.hpp: raising a shared high-water mark from any thread.
#pragma once

#include <atomic>

namespace cuemm::util {

// Raises `peak` to `value` if it is higher; a thread that loses the race to a
// higher value leaves that one.
template <typename T>
void raise_to(std::atomic<T>& peak, T value) noexcept {
  T seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace cuemm::util
