// tests/support/host_allocation_faults.hpp: one host allocation of the calling
// thread fails with std::bad_alloc, so that a test can check what the library
// does where its bookkeeping cannot grow: each operation throws or completes,
// nothing terminates the program, and the manager stays consistent.
//
// A test program links host_allocation_faults.cpp, which replaces the global
// operator new and delete (the library's calls reach the program's). The
// simulated driver's own allocations are spared: the real driver lets no C++
// exception out.
//
//   for (std::uint64_t nth = 1;; ++nth) {
//     cuemm::testing::HostAllocationFault fault(nth);
//     try { workload(); } catch (const std::bad_alloc&) {}
//     if (!fault.struck()) break;  // the workload ran through: each of its allocations failed once
//   }
#pragma once

#include <atomic>
#include <cstdint>

namespace cuemm::testing {

class HostAllocationFault {
 public:
  // Fails the nth allocation (1: the next) that this thread makes outside the
  // simulated driver while this lives.
  explicit HostAllocationFault(std::uint64_t nth);
  ~HostAllocationFault();
  HostAllocationFault(const HostAllocationFault&) = delete;
  HostAllocationFault& operator=(const HostAllocationFault&) = delete;

  // Whether the failure happened (false: the thread made fewer allocations).
  bool struck() const noexcept;
};

// Fails every allocation that this thread makes outside the simulated
// driver while this lives: for the paths that only a full stop reaches,
// such as a container's growth that comes once in many calls.
class EveryHostAllocationFails {
 public:
  EveryHostAllocationFails();
  ~EveryHostAllocationFails();
  EveryHostAllocationFails(const EveryHostAllocationFails&) = delete;
  EveryHostAllocationFails& operator=(const EveryHostAllocationFails&) = delete;

  // How many allocations failed so far.
  std::uint64_t failures() const noexcept;
};

// Whether the library's allocations reach the test program's operator new:
// not where the toolchain links the C++ runtime into libcuemm statically
// (the GPU machine's), which then keeps its own.
bool host_allocation_faults_reach_the_library();

// Fails the nth allocation (1: the next) that the calling thread makes
// outside the simulated driver from now to its end, the destructors of its
// thread_locals included: they run after every scope of the thread's body
// has closed, so a HostAllocationFault cannot reach them. Sets `struck`
// where the failure happens; read it once the thread is joined.
void fail_host_allocation_until_thread_exit(std::uint64_t nth, std::atomic<bool>& struck);

}  // namespace cuemm::testing
