// keep_until_exit.hpp: for objects that raw pointers may still reach after
// their owner is gone (a retired pool's core, an adaptor's observer). They are
// small, and keeping them costs less than a reference count per allocation,
// which every thread would update on one shared cache line.
#pragma once

#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm::util {

inline void keep_until_exit(std::shared_ptr<void> object) noexcept {
  {
    static BlockingAwareMutex mutex;
    std::lock_guard lock(mutex);
    try {
      // Never destroyed: a pointer freed during static destruction may still reach them.
      static auto* kept = new std::vector<std::shared_ptr<void>>();
      kept->push_back(std::move(object));
      return;
    } catch (const std::bad_alloc&) {
    }
  }
  // No room to list it (the host out of memory): a reference whose
  // destructor never runs keeps it all the same.
  alignas(std::shared_ptr<void>) unsigned char never_released[sizeof(std::shared_ptr<void>)];
  new (never_released) std::shared_ptr<void>(std::move(object));
}

}  // namespace cuemm::util
