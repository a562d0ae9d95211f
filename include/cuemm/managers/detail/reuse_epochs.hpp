// cuemm/managers/detail/reuse_epochs.hpp: when may freed memory be reused?
//
// The EMM interface passes no stream, so memory may be freed while queued GPU
// work still reads or writes it. A free is tagged with the open epoch (tag());
// seal() opens the next epoch and then records an event on the legacy default
// stream, which completes only after all earlier work on blocking streams.
// Once that event has completed (poll()), every tag of the sealed epoch is
// safe. Opening the next epoch before recording means a free tagged with the
// closed one happened before the event was recorded. When the legacy stream is
// idle at seal() (it reads as busy while any blocking stream is busy, measured
// on the H100), the closed epoch is safe at once and no event is recorded:
// the common case of a host program between kernels costs one query.
//
// tag() and is_safe() are lock-free; seal(), poll() and retire() take the
// epochs' own lock, so that a seal's stream query (about a microsecond) does
// not hold up the owner's lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <vector>

#include "cuemm/driver/cuda_api.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {
class Context;
}

namespace cuemm::detail {

class ReuseEpochs {
 public:
  explicit ReuseEpochs(Context* context) : context_(context) {}
  ReuseEpochs(const ReuseEpochs&) = delete;
  ReuseEpochs& operator=(const ReuseEpochs&) = delete;

  // The epoch to tag a free with now.
  std::uint64_t tag() noexcept {
    // The epoch first, then the flag: the other way round, a seal between
    // the two cleared the flag and left this tag in an epoch marked as holding
    // no frees, which no later seal closed until another free came.
    const std::uint64_t epoch = open_.load(std::memory_order_acquire);
    if (!freed_since_seal_.load(std::memory_order_relaxed)) freed_since_seal_.store(true, std::memory_order_relaxed);
    return epoch;
  }
  bool is_safe(std::uint64_t epoch) const noexcept { return epoch < safe_.load(std::memory_order_acquire); }
  // Whether the epoch has an event (or is safe): tags of the open one have none yet.
  bool is_sealed(std::uint64_t epoch) const noexcept { return epoch < open_.load(std::memory_order_acquire); }

  // Closes the open epoch if anything was tagged with it. Without an event
  // (the driver refused one) it synchronises the context instead.
  void seal() noexcept;
  // seal() unless another thread is sealing or polling; returns whether it ran.
  bool try_seal() noexcept;
  // Seals the open epoch if `epoch` is still open, then marks completed
  // epochs safe. Threads that queue for the lock behind one that sealed
  // find their tags sealed already: one stream query serves them all.
  // (The caller checks is_safe() after.)
  void seal_through(std::uint64_t epoch) noexcept;
  // Marks completed epochs safe; with `wait`, waits for every sealed one.
  void poll(bool wait);
  // poll(false) unless another thread is sealing or polling.
  void try_poll();
  // Waits for the oldest sealed epoch that is not yet safe (then marks
  // whatever else has completed safe): less of the GPU's queued work than
  // poll(true) waits for. False when none was pending.
  bool wait_for_oldest();
  // Polls until `epoch` is safe or `budget` has passed; returns whether it is.
  bool poll_until_safe(std::uint64_t epoch, std::chrono::nanoseconds budget);
  // Waits for and destroys every event (the owner is going away).
  void retire() noexcept;
  // Seals that closed an epoch so far: one stream query each (statistics).
  std::uint64_t seals() const noexcept { return seals_.load(std::memory_order_relaxed); }
  // Whether the legacy stream has work queued now (a stream query; it reads
  // busy while any blocking or per-thread stream has): then cuMemFree and
  // cuMemFreeHost would wait for all of it (Note [Growth while the GPU is
  // busy]). False where the query fails.
  bool legacy_stream_busy() const noexcept;

 private:
  struct Sealed {
    std::uint64_t epoch;
    cuda::CUevent event;  // null: known complete
  };
  void seal_locked() noexcept;
  void poll_locked(bool wait);
  // Marks the oldest sealed epoch safe once its event has completed (with
  // `wait`, waiting for it); false while it has not. sealed_ is not empty.
  bool retire_oldest_locked(bool wait);

  Context* context_;
  // Its own cache line: threads that wait for a seal read the epochs below
  // while the sealer holds this.
  alignas(64) mutable BlockingAwareMutex mutex_;  // sealed_ and spare_events_
  std::atomic<std::uint64_t> seals_{0};           // written under mutex_
  std::deque<Sealed> sealed_;  // oldest first
  std::vector<cuda::CUevent> spare_events_;
  // Read at every free and reuse; written once a seal.
  alignas(64) std::atomic<std::uint64_t> open_{1};
  std::atomic<std::uint64_t> safe_{1};
  // While a seal's query runs: threads waiting for it read this rather than
  // try the lock, whose failed attempts still took its cache line from the
  // sealer (16 threads of 64 MiB pairs on the H100: a third of their time).
  std::atomic<bool> sealing_{false};
  std::atomic<bool> freed_since_seal_{false};
  // (Last: the class's size rounds up to its alignment, so nothing of the
  // owner's shares that line.)
};

}  // namespace cuemm::detail
