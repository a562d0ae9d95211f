// threading/section_gate.hpp (private to the library): sections that many
// threads run at once, and a gate that one thread closes, now and then, to
// wait until none is inside.
//
// An adaptor makes each allocation (the upstream's call included) and each
// release in such a section, and its reset() closes the gate while it forgets
// the counts and resets the upstream: an allocation then falls wholly before
// the reset or wholly after it (Note [Counting across a reset] in
// adaptors/manager_adaptor.cpp). Entering costs two stores to the thread's
// own cache line and a load of the gate, with a compiler-only fence: the
// closer pays for both sides with a process-wide memory barrier (as
// OwnerBiasedLock's visitor does; full fences where it is missing).
//
//   SectionGate gate;
//   { SectionGate::Section section(gate); count(); }        // any thread, often
//   gate.close_and_drain(); forget_counts(); gate.open();    // one thread, seldom
//
// Sections nest: a thread keeps the gates it is inside as a stack (an
// adaptor's section holds its upstream's call, which enters the upstream
// adaptor's sections), and a closer waits only for threads with its own
// gate on theirs. A thread already inside a gate enters it again even while
// it is closed: its closer is still waiting for the outer section, so has
// not begun. A thread must not close a gate it is inside (inside() says).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "threading/owner_biased_lock.hpp"
#include "util/own_lines.hpp"

namespace cuemm::detail {

class SectionGate {
 public:
  // Sections deeper than this on one thread go unseen by closers (adaptors
  // stacked this deep; ManagerAdaptor refuses such a stack).
  static constexpr std::uint32_t kMostNested = 14;

  // The gates a thread is inside, innermost last: gates[0, depth).
  struct alignas(util::kOwnLines) ThreadState {
    std::atomic<std::uint32_t> depth{0};
    std::array<std::atomic<const SectionGate*>, kMostNested> gates{};
    ThreadState* next = nullptr;  // (set before the state is published, then fixed)
    bool taken = false;           // a live thread's (under the registry's mutex)
  };

  class Section {
   public:
    explicit Section(SectionGate& gate) noexcept
        : state_(this_thread_ ? *this_thread_ : register_this_thread()),
          depth_(state_.depth.load(std::memory_order_relaxed)) {
      if (depth_ >= kMostNested) [[unlikely]]
        return;  // (unseen; the destructor leaves the depth as it is)
      state_.gates[depth_].store(&gate, std::memory_order_relaxed);
      state_.depth.store(depth_ + 1, std::memory_order_release);
      light_fence();  // (the closer's process barrier runs ours)
      if (gate.closed_.load(std::memory_order_acquire)) [[unlikely]]
        gate.wait_until_open(state_, depth_);
    }
    ~Section() {
      if (depth_ < kMostNested) [[likely]]
        state_.depth.store(depth_, std::memory_order_release);
    }
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;

   private:
    ThreadState& state_;
    const std::uint32_t depth_;  // the thread's depth outside this section
  };

  SectionGate() = default;
  SectionGate(const SectionGate&) = delete;
  SectionGate& operator=(const SectionGate&) = delete;

  // Sections entered from now on wait; returns once every section under
  // way has ended. Not from inside a section of this gate, and one closer
  // at a time.
  void close_and_drain() noexcept;
  void open() noexcept { closed_.store(false, std::memory_order_release); }
  // Whether the calling thread is inside a section of this gate.
  bool inside() const noexcept;

 private:
  // The calling thread's state: null until its first section registers it.
  [[gnu::tls_model("initial-exec")]] static inline thread_local ThreadState* this_thread_ = nullptr;
  [[gnu::noinline]] static ThreadState& register_this_thread() noexcept;
  // Whether `state`'s thread is inside this gate below `depth`.
  bool holds(const ThreadState& state, std::uint32_t depth) const noexcept;

  // Leaves the section entered at `depth`, waits for the gate to open,
  // enters again; returns at once where the thread is inside already.
  [[gnu::noinline]] void wait_until_open(ThreadState& state, std::uint32_t depth) noexcept;

  struct Registration;

  std::atomic<bool> closed_{false};
};

}  // namespace cuemm::detail
