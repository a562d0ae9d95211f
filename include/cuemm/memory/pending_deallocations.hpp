// cuemm/memory/pending_deallocations.hpp: Numba's deferred-release queue.
//
// Releases (cuMemFree, cuStreamDestroy, ...) are queued rather than run at
// once, and the queue is flushed when it holds more than `max_count` entries
// or more than `max_bytes` bytes: freeing in batches keeps the synchronising
// driver calls out of hot loops. While a defer() guard is alive nothing is
// flushed. Thread-safe; releases run outside the lock and never throw (a
// failing release is reported on stderr).
//
//   PendingDeallocations pending(10, 1 << 30);
//   pending.add([p] { cuMemFree(p); }, bytes);     // may flush
//   { auto guard = pending.defer(); ... }          // no flush in here
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <mutex>
#include <vector>

#include "cuemm/memory/cleanup_guard.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

class PendingDeallocations {
 public:
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

  explicit PendingDeallocations(std::size_t max_count = 10, std::size_t max_bytes = kUnlimited);
  PendingDeallocations(const PendingDeallocations&) = delete;
  PendingDeallocations& operator=(const PendingDeallocations&) = delete;

  // Queues a release of `bytes` bytes; flushes if a threshold is exceeded.
  void add(std::function<void()> release, std::size_t bytes = 0);
  // Runs every pending release, unless deferred (Numba's clear()). Returns how many ran.
  std::size_t flush();
  // Runs every pending release even while deferred (a context reset).
  std::size_t flush_all();
  // Nothing is flushed until every guard returned so far is gone. Nestable.
  CleanupGuard defer();

  bool is_deferred() const;
  std::size_t pending_count() const;
  std::size_t pending_bytes() const;
  std::size_t max_count() const;
  std::size_t max_bytes() const;
  void set_max_bytes(std::size_t max_bytes);

 private:
  struct Pending {
    std::function<void()> release;
    std::size_t bytes;
  };
  static void run_one(Pending& item) noexcept;
  std::size_t run(std::vector<Pending> batch) noexcept;

  mutable BlockingAwareMutex mutex_;
  std::vector<Pending> pending_;
  std::size_t pending_bytes_ = 0;
  std::size_t max_count_;
  std::size_t max_bytes_;
  int defer_depth_ = 0;  // Invariant: >= 0; flushing is allowed only at 0
};

}  // namespace cuemm
