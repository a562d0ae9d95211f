#include "cuemm/managers/detail/reuse_epochs.hpp"

#include <cstdio>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "cuemm/driver/driver.hpp"
#include "cuemm/runtime/context.hpp"

namespace cuemm::detail {
namespace {
// Waiting for another thread's seal (a stream query: 0.3-1 us): pauses of
// ~50 ns first, then yields too, then sleep on the lock.
// Pauses between two looks at the lock: looking more often slowed the
// sealer (docs/pool-measurements.md).
constexpr int kPausesBetweenTries = 16;
constexpr int kTriesBeforeYielding = 64;
constexpr int kTriesBeforeSleeping = 1000;

void pause_briefly() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

void ReuseEpochs::seal() noexcept {
  std::lock_guard lock(mutex_);
  seal_locked();
}

bool ReuseEpochs::try_seal() noexcept {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  seal_locked();
  return true;
}

void ReuseEpochs::seal_through(std::uint64_t epoch) noexcept {
  // While another thread seals, watch for its seal to cover `epoch` rather
  // than sleep on the lock: a sleeper's wake-up took microseconds on the
  // H100's host, and 16 threads of large pairs queued behind each other.
  // (A holder that waits for the GPU is slept on after a while.)
  // (Other ways of waiting, tried and slower: docs/pool-measurements.md.)
  std::unique_lock lock(mutex_, std::defer_lock);
  for (int tries = 0; sealing_.load(std::memory_order_relaxed) || !lock.try_lock(); ++tries) {
    if (tries == 0) before_blocking();
    // Watch `safe_` (a read, so the sealer's lock and its writes stay in
    // its own cache), trying the lock now and then.
    for (int pause = 0; pause < kPausesBetweenTries; ++pause) {
      if (is_safe(epoch)) return;
      pause_briefly();
    }
    if (tries == kTriesBeforeSleeping) {
      lock.lock();
      break;
    }
    if (tries >= kTriesBeforeYielding) std::this_thread::yield();
  }
  if (is_safe(epoch)) return;
  // Seal unless a pending event covers `epoch` (one recorded after its
  // frees): it may be open still, or the seal that closed it got no event.
  if (sealed_.empty() || sealed_.back().epoch < epoch) {
    freed_since_seal_.store(true, std::memory_order_relaxed);  // `epoch` holds a free
    seal_locked();
  }
  try {
    poll_locked(false);
  } catch (const std::exception&) {
    // A failed query: the caller finds `epoch` unsafe and takes the slow path, which polls again.
  }
}

void ReuseEpochs::seal_or_join(std::uint64_t epoch) noexcept {
  {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      seal_locked();
      return;
    }
  }
  seal_through(epoch);
}

bool ReuseEpochs::capture_under_way() const noexcept { return context_ && context_->capturing(); }

bool ReuseEpochs::covers_every_stream() const noexcept {
  enum : int { kUnknown, kEveryStream, kLegacyStream };
  if (const int known = coverage_.load(std::memory_order_acquire); known != kUnknown) return known == kEveryStream;
  // (Not asked while a graph is captured: the question itself would end it.)
  if (capture_under_way()) return false;
  std::lock_guard lock(probe_mutex_);
  if (const int known = coverage_.load(std::memory_order_acquire); known != kUnknown) return known == kEveryStream;
  cuda::CUresult recorded = cuda::CUDA_ERROR_NOT_SUPPORTED;
  try {
    if (driver::Driver::get().api().cuCtxRecordEvent) recorded = record_probe_locked();
  } catch (const std::exception&) {
    return false;  // (no context yet, say: the legacy stream's this time, and ask again)
  }
  // A stream being captured into a graph refuses it for now, not for good.
  if (recorded == cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) return false;
  const bool every = recorded == cuda::CUDA_SUCCESS;
  coverage_.store(every ? kEveryStream : kLegacyStream, std::memory_order_release);
  return every;
}

cuda::CUresult ReuseEpochs::record_probe_locked() const {
  ScopedContext scope(*context_);
  if (!probe_event_) CUEMM_CU(cuEventCreate, &probe_event_, cuda::CU_EVENT_DISABLE_TIMING);
  return CUEMM_CU_RESULT(cuCtxRecordEvent, context_->handle(), probe_event_);
}

bool ReuseEpochs::gpu_busy() const noexcept {
  // While a graph is captured no query is made: read as busy, so that the
  // pools grow rather than wait.
  if (capture_under_way()) return true;
  try {
    ScopedContext scope(*context_);
    if (covers_every_stream()) {
      std::lock_guard lock(probe_mutex_);
      if (record_probe_locked() == cuda::CUDA_SUCCESS)
        return CUEMM_CU_RESULT(cuEventQuery, probe_event_) == cuda::CUDA_ERROR_NOT_READY;
    }
    return CUEMM_CU_RESULT(cuStreamQuery, cuda::CU_STREAM_LEGACY) == cuda::CUDA_ERROR_NOT_READY;
  } catch (const std::exception&) {
    return false;
  }
}

void ReuseEpochs::keep_spare_locked(cuda::CUevent event) noexcept {
  try {
    spare_events_.push_back(event);
  } catch (const std::bad_alloc&) {  // (no room to keep it: the next seal makes another)
    try {
      ScopedContext scope(*context_);
      CUEMM_CU_RESULT(cuEventDestroy, event);
    } catch (const std::exception&) {
    }
  }
}

void ReuseEpochs::mark_safe_through_locked(std::uint64_t closed) noexcept {
  for (const Sealed& sealed : sealed_)
    if (sealed.event) keep_spare_locked(sealed.event);
  sealed_.clear();
  safe_.store(closed + 1, std::memory_order_release);
}

void ReuseEpochs::seal_locked() noexcept {
  // No seal while a graph is captured (no capture survives its event): the
  // open epoch stays open, its frees unsafe, until a seal after the capture.
  if (capture_under_way()) return;
  if (!freed_since_seal_.exchange(false)) return;
  sealing_.store(true, std::memory_order_relaxed);
  struct Done {
    std::atomic<bool>& sealing;
    ~Done() { sealing.store(false, std::memory_order_release); }
  } done{sealing_};
  seals_.store(seals_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  const std::uint64_t closed = open_.fetch_add(1);
  Sealed entry{closed, nullptr};
  try {
    ScopedContext scope(*context_);
    const bool every_stream = covers_every_stream();
    // An idle legacy stream (which reads as busy while any blocking stream
    // is) means everything queued there before now has run: one query, no
    // event to record and poll.
    if (!every_stream && CUEMM_CU_RESULT(cuStreamQuery, cuda::CU_STREAM_LEGACY) == cuda::CUDA_SUCCESS) {
      mark_safe_through_locked(closed);
      return;
    }
    if (!spare_events_.empty()) {
      entry.event = spare_events_.back();
      spare_events_.pop_back();
    } else {
      CUEMM_CU(cuEventCreate, &entry.event, cuda::CU_EVENT_DISABLE_TIMING);
    }
    if (every_stream) {
      CUEMM_CU(cuCtxRecordEvent, context_->handle(), entry.event);
      if (CUEMM_CU_RESULT(cuEventQuery, entry.event) == cuda::CUDA_SUCCESS) {
        keep_spare_locked(std::exchange(entry.event, nullptr));
        mark_safe_through_locked(closed);
        return;
      }
    } else {
      CUEMM_CU(cuEventRecord, entry.event, cuda::CU_STREAM_LEGACY);
    }
    sealed_.push_back(entry);
  } catch (const std::exception& error) {
    // Without an event, wait for the device: slower, still safe. (Said
    // once: while a graph is captured, every seal comes here.)
    if (!said_why_unsealed_) {
      said_why_unsealed_ = true;
      std::fprintf(stderr,
                   "cuemm: cannot record a reuse event (%s); waiting for the device instead, or where that is "
                   "refused too, for a later seal\n",
                   error.what());
    }
    // The event may be stale (its context was reset): never reuse it.
    if (entry.event) CUEMM_CU_RESULT(cuEventDestroy, entry.event);
    if (CUEMM_CU_RESULT(cuCtxSynchronize) == cuda::CUDA_SUCCESS) {
      mark_safe_through_locked(closed);  // (all of the context's work has run: every sealed epoch is safe)
      return;
    }
    // Not waited for either (the driver refuses both while a graph is being
    // captured): the closed epoch's frees stay unsafe, and the next seal
    // covers them, as its event comes after them (an epoch turns safe with
    // any later one).
    freed_since_seal_.store(true, std::memory_order_relaxed);
  }
}

void ReuseEpochs::poll(bool wait) {
  std::lock_guard lock(mutex_);
  poll_locked(wait);
}

void ReuseEpochs::try_poll() {
  // Every sealed epoch is safe already (the usual case after a seal found
  // the GPU idle): nothing to poll, no lock to take.
  if (safe_.load(std::memory_order_acquire) >= open_.load(std::memory_order_acquire)) return;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (lock.owns_lock()) poll_locked(false);
}

void ReuseEpochs::poll_locked(bool wait) {
  if (capture_under_way()) wait = false;  // queries go through a capture (relaxed); waits do not
  while (!sealed_.empty() && retire_oldest_locked(wait)) {
  }
}

bool ReuseEpochs::retire_oldest_locked(bool wait) {
  Sealed& oldest = sealed_.front();
  if (oldest.event) {
    ScopedContext scope(*context_);
    const cuda::CUresult result = wait ? CUEMM_CU_RESULT(cuEventSynchronize, oldest.event)
                                       : CUEMM_CU_RESULT(cuEventQuery, oldest.event);
    if (result == cuda::CUDA_ERROR_NOT_READY) return false;
    driver::check(result, wait ? "cuEventSynchronize" : "cuEventQuery");
    keep_spare_locked(oldest.event);
  }
  safe_.store(oldest.epoch + 1, std::memory_order_release);
  sealed_.pop_front();
  return true;
}

bool ReuseEpochs::wait_for_oldest() {
  std::lock_guard lock(mutex_);
  if (sealed_.empty() || capture_under_way()) return false;
  retire_oldest_locked(true);
  poll_locked(false);
  return true;
}

bool ReuseEpochs::wait_until_safe(std::uint64_t epoch) noexcept {
  seal_through(epoch);
  try {
    while (!is_safe(epoch) && wait_for_oldest()) {
    }
  } catch (const std::exception&) {  // (a failed wait: not safe)
  }
  return is_safe(epoch);
}

bool ReuseEpochs::poll_until_safe(std::uint64_t epoch, std::chrono::nanoseconds budget) {
  // Safe already (a seal that found the GPU idle): no clock to read, no lock
  // to take (60 ns of a 0.5 us seal on the H100).
  if (is_safe(epoch)) return true;
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    poll(false);
    if (is_safe(epoch) || !is_sealed(epoch) || std::chrono::steady_clock::now() >= deadline) return is_safe(epoch);
  }
}

void ReuseEpochs::retire() noexcept {
  std::lock_guard lock(mutex_);
  std::lock_guard probe_lock(probe_mutex_);
  // (Nothing also for a manager made without a context.)
  if (sealed_.empty() && spare_events_.empty() && !probe_event_) return;
  try {
    ScopedContext scope(*context_);
    for (auto& entry : sealed_) {
      if (!entry.event) continue;
      CUEMM_CU_RESULT(cuEventSynchronize, entry.event);
      CUEMM_CU_RESULT(cuEventDestroy, entry.event);
    }
    for (cuda::CUevent event : spare_events_) CUEMM_CU_RESULT(cuEventDestroy, event);
    if (probe_event_) CUEMM_CU_RESULT(cuEventDestroy, std::exchange(probe_event_, nullptr));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm: destroying reuse events failed: %s\n", error.what());
  }
  sealed_.clear();
  spare_events_.clear();
  safe_.store(open_.load());
}

}  // namespace cuemm::detail
