// The pool's record of the blocks its raw allocate() handed out, which
// PoolOptions::check_frees turns on: deallocate() asks it before freeing.
//
// A raw pointer carries nothing but its address, and the pool's fast path
// trusts it: a second free, a pointer it never handed out, or a block from
// before a reset() would go into a thread's ring and be handed out again,
// two owners for one block (or a block the driver has taken back). Keeping
// the record costs a lock and a hash lookup each way, so it is off by default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace cuemm::detail {

class RawFreeChecker {
 public:
  void handed_out(std::uintptr_t address, std::size_t size) {
    std::lock_guard lock(mutex_);
    live_[address] = size;
  }
  // Null when the block at `address` was handed out with `size` and is
  // live (it is then forgotten, as it is about to be freed); else why not.
  std::optional<std::string> take_back(std::uintptr_t address, std::size_t size) {
    std::lock_guard lock(mutex_);
    const auto it = live_.find(address);
    if (it == live_.end()) {
      return std::string("no live block of this pool starts there (freed already, never handed out by allocate(), "
                         "or handed out before a reset())");
    }
    if (it->second != size) {
      return "the block there was allocated with " + std::to_string(it->second) + " bytes";
    }
    live_.erase(it);
    return std::nullopt;
  }
  // A reset gave every block back.
  void forget_all() {
    std::lock_guard lock(mutex_);
    live_.clear();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::uintptr_t, std::size_t> live_;
};

}  // namespace cuemm::detail
