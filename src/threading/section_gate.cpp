#include "threading/section_gate.hpp"

#include <mutex>
#include <utility>

#include "cuemm/threading/blocking_hook.hpp"
#include "threading/owner_biased_lock.hpp"
#include "threading/wait_while.hpp"

namespace cuemm::detail {

namespace {
// Every thread's state, for the closers to look at. States are never freed:
// a thread that ends leaves its state to the next one that registers, so a
// closer walks the list without a lock, and waits for a section without
// keeping threads from registering (a callback thread that a section's
// upstream call waits for may be entering its first section).
struct Registry {
  std::mutex mutex;  // registration and thread ends
  std::atomic<SectionGate::ThreadState*> first{nullptr};
};
Registry& registry() {
  static auto* kept = new Registry();  // never destroyed: threads may end during static destruction
  return *kept;
}

// What a thread uses once its own state is gone (sections in the destructors
// of thread_locals that outlive it): no closer waits for it.
SectionGate::ThreadState orphan;

}  // namespace

// Takes a state for the thread (a free one, or a new one at the list's
// head) and, at the thread's end, frees it.
struct SectionGate::Registration {
  SectionGate::ThreadState* state = nullptr;
  Registration() {
    Registry& all = registry();
    std::lock_guard lock(all.mutex);
    for (ThreadState* there = all.first.load(std::memory_order_relaxed); there && !state; there = there->next)
      if (!there->taken) state = there;
    if (!state) {
      state = new ThreadState();
      state->next = all.first.load(std::memory_order_relaxed);
      all.first.store(state, std::memory_order_release);
    }
    state->taken = true;
  }
  ~Registration() {
    this_thread_ = &orphan;
    Registry& all = registry();
    std::lock_guard lock(all.mutex);
    state->depth.store(0, std::memory_order_release);
    state->taken = false;
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

bool SectionGate::holds(const ThreadState& state, std::uint32_t depth) const noexcept {
  // (Entries below the depth read stay as they are while the thread is
  // inside them; one pushed since may show instead, which is another gate's.)
  if (depth > kMostNested) depth = kMostNested;
  for (std::uint32_t level = 0; level < depth; ++level)
    if (state.gates[level].load(std::memory_order_acquire) == this) return true;
  return false;
}

bool SectionGate::inside() const noexcept {
  return this_thread_ && holds(*this_thread_, this_thread_->depth.load(std::memory_order_relaxed));
}

void SectionGate::wait_until_open(ThreadState& state, std::uint32_t depth) noexcept {
  if (holds(state, depth)) return;  // (nested: the closer waits for the outer section)
  do {
    state.depth.store(depth, std::memory_order_release);
    before_blocking();
    wait_while([this] { return closed_.load(std::memory_order_acquire); });  // (a reset may wait for the device)
    state.gates[depth].store(this, std::memory_order_relaxed);
    state.depth.store(depth + 1, std::memory_order_release);
    light_fence();
  } while (closed_.load(std::memory_order_acquire));
}

void SectionGate::close_and_drain() noexcept {
  closed_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  process_barrier();  // every thread's entry now shows, or it sees the gate closed
  bool told = false;
  for (ThreadState* state = registry().first.load(std::memory_order_acquire); state; state = state->next) {
    const auto inside = [&] { return holds(*state, state->depth.load(std::memory_order_acquire)); };
    if (!inside()) continue;
    // A section may hold the upstream's call, which may wait for something
    // this thread holds (the GIL, for a Python owner it drops).
    if (!std::exchange(told, true)) before_blocking();
    wait_while(inside);
  }
}

}  // namespace cuemm::detail
