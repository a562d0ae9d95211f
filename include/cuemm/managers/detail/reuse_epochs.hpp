// cuemm/managers/detail/reuse_epochs.hpp: when may freed memory be reused?
//
// The EMM interface passes no stream, so memory may be freed while queued GPU
// work still reads or writes it. A free is tagged with the open epoch (tag());
// seal() opens the next epoch and then records an event that completes once
// the work queued before it has run. Once that event has completed (poll()),
// every tag of the sealed epoch is safe. Opening the next epoch before
// recording means a free tagged with the closed one happened before the event
// was recorded.
//
// Which work the event covers: where the driver has cuCtxRecordEvent (CUDA
// 12.5), all of the context's, on every stream, as cuMemFree waits for (a
// kernel on a non-blocking stream too; probe_free_beside.cpp on the H100).
// Elsewhere it is recorded on the legacy default stream, which completes only
// after earlier work on blocking streams, so work on non-blocking streams is
// not covered (the pool orders a free on such a stream after it by hand).
// When the event has completed at once (or the legacy stream reads idle),
// the closed epoch and every one before it are safe, with nothing to poll:
// the common case of a host program between kernels.
//
// tag() and is_safe() are lock-free; seal(), poll() and retire() take the
// epochs' own lock, so that a seal's driver calls (about a microsecond) do
// not hold up the owner's lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
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
  // (the driver refused one) it synchronises the context instead; where that
  // is refused too, the epoch turns safe only with a later seal's event.
  void seal() noexcept;
  // seal() unless another thread is sealing or polling; returns whether it ran.
  bool try_seal() noexcept;
  // Seals the open epoch if no pending event covers `epoch` (it is still
  // open, or the seal that closed it got no event), then marks completed
  // epochs safe. Threads that queue for the lock behind one that sealed
  // find their tags sealed already: one seal serves them all.
  // (The caller checks is_safe() after.)
  void seal_through(std::uint64_t epoch) noexcept;
  // seal(), unless another thread holds the lock (sealing, say): then
  // seal_through(epoch), which needs no second seal where the other's covers
  // `epoch`.
  void seal_or_join(std::uint64_t epoch) noexcept;
  // Marks completed epochs safe; with `wait`, waits for every sealed one.
  void poll(bool wait);
  // poll(false) unless another thread is sealing or polling.
  void try_poll();
  // Waits for the oldest sealed epoch that is not yet safe (then marks
  // whatever else has completed safe): less of the GPU's queued work than
  // poll(true) waits for. False when none was pending.
  bool wait_for_oldest();
  // Seals `epoch` if need be and waits until it is safe: for a freed block
  // with no room to wait in a queue (the host out of memory). False where
  // it cannot be (a graph being captured, or the driver refused).
  bool wait_until_safe(std::uint64_t epoch) noexcept;
  // Polls until `epoch` is safe or `budget` has passed; returns whether it is.
  bool poll_until_safe(std::uint64_t epoch, std::chrono::nanoseconds budget);
  // Waits for and destroys every event (the owner is going away).
  void retire() noexcept;
  // Seals that closed an epoch so far (statistics): each records an event for
  // the context and queries it, or queries the legacy stream first.
  std::uint64_t seals() const noexcept { return seals_.load(std::memory_order_relaxed); }
  // Whether the GPU has work of this context queued now, on any stream where
  // covers_every_stream(), else on the legacy stream (which reads busy while
  // any blocking or per-thread stream is): then cuMemFree and cuMemFreeHost
  // would wait for all of it (Note [Growth while the GPU is busy]). False
  // where the driver's answer is an error.
  bool gpu_busy() const noexcept;
  // Whether seals cover work on every stream (the driver records an event for
  // a whole context), rather than the legacy stream's. Asked of the driver
  // once.
  bool covers_every_stream() const noexcept;

 private:
  // A graph is being captured in the context (CaptureScope): no seal, no
  // wait, no probe, as a capture survives none of them.
  bool capture_under_way() const noexcept;
  struct Sealed {
    std::uint64_t epoch;
    cuda::CUevent event;  // null: known complete
  };
  void seal_locked() noexcept;
  // Keeps a completed event for the next seal; without room for it (the
  // host out of memory), destroys it instead.
  void keep_spare_locked(cuda::CUevent event) noexcept;
  // Every epoch through `closed` is safe: its events go back to the spares.
  void mark_safe_through_locked(std::uint64_t closed) noexcept;
  // Records probe_event_ (made at first use) for the whole context. Under probe_mutex_.
  cuda::CUresult record_probe_locked() const;
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
  bool said_why_unsealed_ = false;  // a seal's failure went to stderr (once)
  // Read at every free and reuse; written once a seal.
  alignas(64) std::atomic<std::uint64_t> open_{1};
  std::atomic<std::uint64_t> safe_{1};
  // While a seal's query runs: threads waiting for it read this rather than
  // try the lock, whose failed attempts still took its cache line from the
  // sealer (16 threads of 64 MiB pairs on the H100: a third of their time).
  std::atomic<bool> sealing_{false};
  std::atomic<bool> freed_since_seal_{false};
  // covers_every_stream()'s answer: 0 not asked yet, 1 every stream, 2 the legacy stream's.
  mutable std::atomic<int> coverage_{0};
  // gpu_busy()'s event, recorded for the whole context and queried at once.
  mutable std::mutex probe_mutex_;
  mutable cuda::CUevent probe_event_ = nullptr;
  // (Last: the class's size rounds up to its alignment, so nothing of the
  // owner's shares that line.)
};

}  // namespace cuemm::detail
