#include "threading/section_gate.hpp"

#include <mutex>
#include <thread>

#include "cuemm/threading/blocking_hook.hpp"
#include "threading/owner_biased_lock.hpp"

namespace cuemm::detail {

namespace {
// Every thread that entered a section, for the closers to look at.
struct Registry {
  std::mutex mutex;
  SectionGate::ThreadState* first = nullptr;
};
Registry& registry() {
  static auto* kept = new Registry();  // never destroyed: threads may end during static destruction
  return *kept;
}

// What a thread uses once its own state is gone (sections in the destructors
// of thread_locals that outlive it): no closer waits for it.
SectionGate::ThreadState orphan;

}  // namespace

// Registers the thread's state and, at the thread's end, removes it.
struct SectionGate::Registration {
  SectionGate::ThreadState* state = new SectionGate::ThreadState();
  Registration() {
    Registry& all = registry();
    std::lock_guard lock(all.mutex);
    state->next = all.first;
    if (all.first) all.first->previous = state;
    all.first = state;
  }
  ~Registration() {
    this_thread_ = &orphan;
    {
      Registry& all = registry();
      std::lock_guard lock(all.mutex);
      (state->previous ? state->previous->next : all.first) = state->next;
      if (state->next) state->next->previous = state->previous;
    }
    delete state;
  }
};

SectionGate::ThreadState& SectionGate::register_this_thread() noexcept {
  try {
    thread_local Registration registration;
    this_thread_ = registration.state;
  } catch (...) {
    return orphan;  // (out of host memory: this section goes unseen)
  }
  return *this_thread_;
}

void SectionGate::wait_until_open(ThreadState& state) noexcept {
  do {
    state.sequence.store(state.sequence.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    before_blocking();
    while (closed_.load(std::memory_order_acquire)) std::this_thread::yield();
    state.sequence.store(state.sequence.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    light_fence();
  } while (closed_.load(std::memory_order_acquire));
}

void SectionGate::close_and_drain() noexcept {
  closed_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  process_barrier();  // every thread's entry now shows, or it sees the gate closed
  Registry& all = registry();
  std::lock_guard lock(all.mutex);  // (a thread that ends meanwhile waits to unregister)
  for (ThreadState* state = all.first; state; state = state->next) {
    const std::uint64_t seen = state->sequence.load(std::memory_order_acquire);
    if (seen % 2 == 0) continue;
    while (state->sequence.load(std::memory_order_acquire) == seen) std::this_thread::yield();
  }
}

}  // namespace cuemm::detail
