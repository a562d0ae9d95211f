#include "callback_failures.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace cuemm::detail {
namespace {

struct Kept {
  CallbackStream where;
  std::exception_ptr failure;
};

struct Failures {
  std::mutex mutex;
  std::vector<Kept> kept;  // (a few at most: callbacks seldom throw)
  // Whether anything is kept: synchronize() and stream destruction read this
  // without the lock.
  std::atomic<bool> any{false};
};

Failures& failures() {
  static Failures* instance = new Failures;  // (callbacks may run while statics are destroyed)
  return *instance;
}

template <typename Matches>
void rethrow_first(Matches&& matches) {
  Failures& all = failures();
  if (!all.any.load(std::memory_order_acquire)) return;
  std::exception_ptr failure;
  {
    std::lock_guard lock(all.mutex);
    auto found = std::find_if(all.kept.begin(), all.kept.end(), [&](const Kept& kept) { return matches(kept.where); });
    if (found == all.kept.end()) return;
    failure = found->failure;
    all.kept.erase(found);
    all.any.store(!all.kept.empty(), std::memory_order_release);
  }
  std::rethrow_exception(failure);
}

}  // namespace

void record_callback_failure(CallbackStream where, std::exception_ptr failure) noexcept {
  Failures& all = failures();
  std::lock_guard lock(all.mutex);
  const bool kept_already =
      std::any_of(all.kept.begin(), all.kept.end(), [&](const Kept& kept) { return kept.where == where; });
  if (kept_already) return;
  try {
    all.kept.push_back({where, std::move(failure)});
  } catch (...) {
    return;  // (out of host memory: the failure is lost, not the program)
  }
  all.any.store(true, std::memory_order_release);
}

bool callback_failures_kept() noexcept { return failures().any.load(std::memory_order_acquire); }

void rethrow_callback_failure(CallbackStream where) {
  rethrow_first([&](const CallbackStream& kept) { return kept == where; });
}

void rethrow_callback_failure_of_context(cuda::CUcontext context) {
  rethrow_first([&](const CallbackStream& kept) { return kept.context == context; });
}

void forget_callback_failures(cuda::CUstream stream) noexcept {
  Failures& all = failures();
  if (!all.any.load(std::memory_order_acquire)) return;
  std::lock_guard lock(all.mutex);
  std::erase_if(all.kept, [&](const Kept& kept) { return kept.where.stream == stream; });
  all.any.store(!all.kept.empty(), std::memory_order_release);
}

}  // namespace cuemm::detail
