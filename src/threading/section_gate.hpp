// threading/section_gate.hpp (private to the library): short sections that
// many threads run at once, and a gate that one thread closes, now and then,
// to wait until none is inside.
//
// The adaptors count each allocation and release in such a section, and a
// reset() closes the gate while it forgets the counts: a count then falls
// wholly before the reset or wholly after it (Note [Counting across a
// reset] in adaptors/manager_adaptor.cpp). Entering costs two stores to the
// thread's own cache line and a load of the gate, with a compiler-only
// fence: the closer pays for both sides with a process-wide memory barrier
// (as OwnerBiasedLock's visitor does; full fences where it is missing).
//
//   SectionGate gate;
//   { SectionGate::Section section(gate); count(); }        // any thread, often
//   gate.close_and_drain(); forget_counts(); gate.open();    // one thread, seldom
//
// Sections do not nest, and must not wait for anything that a closer holds.
#pragma once

#include <atomic>
#include <cstdint>

#include "threading/owner_biased_lock.hpp"
#include "util/own_lines.hpp"

namespace cuemm::detail {

class SectionGate {
 public:
  // Where each thread says whether it is inside a section (odd) or not.
  struct alignas(util::kOwnLines) ThreadState {
    std::atomic<std::uint64_t> sequence{0};
    ThreadState* next = nullptr;
    ThreadState* previous = nullptr;
  };

  class Section {
   public:
    explicit Section(SectionGate& gate) noexcept : state_(this_thread_ ? *this_thread_ : register_this_thread()) {
      const std::uint64_t outside = state_.sequence.load(std::memory_order_relaxed);
      state_.sequence.store(outside + 1, std::memory_order_relaxed);
      light_fence();  // (the closer's process barrier runs ours)
      if (gate.closed_.load(std::memory_order_acquire)) [[unlikely]]
        gate.wait_until_open(state_);
    }
    ~Section() {
      state_.sequence.store(state_.sequence.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;

   private:
    ThreadState& state_;
  };

  SectionGate() = default;
  SectionGate(const SectionGate&) = delete;
  SectionGate& operator=(const SectionGate&) = delete;

  // Sections entered from now on wait; returns once every section under
  // way has ended. Not from inside a section, and one closer at a time.
  void close_and_drain() noexcept;
  void open() noexcept { closed_.store(false, std::memory_order_release); }

 private:
  // The calling thread's state: null until its first section registers it.
  [[gnu::tls_model("initial-exec")]] static inline thread_local ThreadState* this_thread_ = nullptr;
  [[gnu::noinline]] static ThreadState& register_this_thread() noexcept;

  // Leaves the section entered, waits for the gate to open, enters again.
  [[gnu::noinline]] void wait_until_open(ThreadState& state) noexcept;

  struct Registration;

  std::atomic<bool> closed_{false};
};

}  // namespace cuemm::detail
