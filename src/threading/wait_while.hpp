// threading/wait_while.hpp (private to the library): waiting for a state that
// another thread ends with no signal to wake this one.
#pragma once

#include <chrono>
#include <thread>

namespace cuemm::detail {

// Looks at `waiting()` until it is false: at first at once (yielding between
// looks), then every 20 us, as what ends it may be a driver call under way.
template <typename Condition>
void wait_while(Condition&& waiting) {
  for (int looks = 0; waiting(); ++looks) {
    if (looks < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace cuemm::detail
