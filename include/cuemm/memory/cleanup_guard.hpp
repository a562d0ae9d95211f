// cuemm/memory/cleanup_guard.hpp: what defer_cleanup() returns.
//
// A move-only RAII value: while it lives, the manager that returned it defers
// cleanup; its destruction ends that. Guards nest and compose: a manager that
// wraps another returns its own guard with the inner one attached, and the
// attached guards are released after this one's own action (inner last).
//
//   {
//     auto guard = context.defer_cleanup();
//     launch_kernels();   // nothing is freed behind their back
//   }                     // deferred frees may run from here on
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace cuemm {

class CleanupGuard {
 public:
  CleanupGuard() = default;
  explicit CleanupGuard(std::function<void()> on_release) {
    if (on_release) releases_.push_back(std::move(on_release));
  }
  CleanupGuard(CleanupGuard&& other) noexcept : releases_(std::exchange(other.releases_, {})) {}
  CleanupGuard& operator=(CleanupGuard&& other) noexcept {
    if (this != &other) {
      release();
      releases_ = std::exchange(other.releases_, {});
    }
    return *this;
  }
  CleanupGuard(const CleanupGuard&) = delete;
  CleanupGuard& operator=(const CleanupGuard&) = delete;
  ~CleanupGuard() { release(); }

  // Attaches another guard, released after this guard's own actions.
  CleanupGuard& attach(CleanupGuard inner) {
    for (auto& action : inner.releases_) releases_.push_back(std::move(action));
    inner.releases_.clear();
    return *this;
  }

  // Ends the deferral now (the destructor then does nothing).
  void release() noexcept {
    auto actions = std::exchange(releases_, {});
    for (auto& action : actions) action();
  }

  bool active() const noexcept { return !releases_.empty(); }

 private:
  std::vector<std::function<void()>> releases_;
};

}  // namespace cuemm
