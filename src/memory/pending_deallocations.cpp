#include "cuemm/memory/pending_deallocations.hpp"

#include <cstdio>
#include <exception>
#include <utility>

namespace cuemm {

PendingDeallocations::PendingDeallocations(std::size_t max_count, std::size_t max_bytes)
    : max_count_(max_count), max_bytes_(max_bytes) {}

void PendingDeallocations::add(std::function<void()> release, std::size_t bytes) {
  Pending item{std::move(release), bytes};
  bool queued = false;
  std::vector<Pending> batch;
  {
    std::lock_guard lock(mutex_);
    try {
      pending_.push_back(std::move(item));  // (where the queue cannot grow, `item` is left as it was)
      queued = true;
    } catch (const std::bad_alloc&) {
      // No room to queue it (the host is out of memory): released below, which
      // is only sooner than asked, rather than lost.
    }
    if (queued) {
      pending_bytes_ += bytes;
      const bool over = pending_.size() > max_count_ || pending_bytes_ > max_bytes_;
      if (!over || defer_depth_ > 0) return;
      batch = std::exchange(pending_, {});
      pending_bytes_ = 0;
    }
  }
  if (!queued) {
    run_one(item);
    return;
  }
  run(std::move(batch));
}

std::size_t PendingDeallocations::flush() {
  std::vector<Pending> batch;
  {
    std::lock_guard lock(mutex_);
    if (defer_depth_ > 0) return 0;
    batch = std::exchange(pending_, {});
    pending_bytes_ = 0;
  }
  return run(std::move(batch));
}

std::size_t PendingDeallocations::flush_all() {
  std::vector<Pending> batch;
  {
    std::lock_guard lock(mutex_);
    batch = std::exchange(pending_, {});
    pending_bytes_ = 0;
  }
  return run(std::move(batch));
}

CleanupGuard PendingDeallocations::defer() {
  {
    std::lock_guard lock(mutex_);
    ++defer_depth_;
  }
  return CleanupGuard([this] {
    bool flush_now = false;
    {
      std::lock_guard lock(mutex_);
      flush_now = --defer_depth_ == 0 &&
                  (pending_.size() > max_count_ || pending_bytes_ > max_bytes_);
    }
    // Releases that crossed a threshold while deferred run now.
    if (flush_now) flush();
  });
}

void PendingDeallocations::run_one(Pending& item) noexcept {
  try {
    item.release();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm: a deferred release failed: %s\n", error.what());
  }
}

std::size_t PendingDeallocations::run(std::vector<Pending> batch) noexcept {
  for (auto& item : batch) run_one(item);
  return batch.size();
}

bool PendingDeallocations::is_deferred() const {
  std::lock_guard lock(mutex_);
  return defer_depth_ > 0;
}
std::size_t PendingDeallocations::pending_count() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}
std::size_t PendingDeallocations::pending_bytes() const {
  std::lock_guard lock(mutex_);
  return pending_bytes_;
}
std::size_t PendingDeallocations::max_count() const {
  std::lock_guard lock(mutex_);
  return max_count_;
}
std::size_t PendingDeallocations::max_bytes() const {
  std::lock_guard lock(mutex_);
  return max_bytes_;
}
void PendingDeallocations::set_max_bytes(std::size_t max_bytes) {
  std::lock_guard lock(mutex_);
  max_bytes_ = max_bytes;
}

}  // namespace cuemm
