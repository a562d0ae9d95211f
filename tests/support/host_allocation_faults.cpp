// The global operator new and delete of a test program, able to fail one
// allocation of a thread on purpose (host_allocation_faults.hpp).
#include "support/host_allocation_faults.hpp"

#include <atomic>

#include "cuemm/driver/simulation.hpp"
#include "cuemm/error.hpp"

namespace {

// Per thread, so that other threads (a driver's, the test's own) never see
// the failure. 0: not armed.
thread_local std::uint64_t countdown = 0;
thread_local bool failed_one = false;
thread_local const int* driver_calls_under_way = nullptr;
thread_local std::atomic<bool>* struck_at_exit = nullptr;  // (read by another thread once this one ends)
thread_local bool failing_every_one = false;
thread_local std::uint64_t failures_of_every_one = 0;

// Fails the thread's nth allocation from now; reports it to `report` too.
void arm(std::uint64_t nth, std::atomic<bool>* report) {
  // (Asked before arming: the lookup may allocate.)
  driver_calls_under_way = cuemm::simulation::active() ? cuemm::simulation::driver_calls_under_way() : nullptr;
  failed_one = false;
  struck_at_exit = report;
  countdown = nth;
}

bool fail_this_one() noexcept {
  if (driver_calls_under_way && *driver_calls_under_way > 0) return false;
  if (failing_every_one) {
    ++failures_of_every_one;
    return true;
  }
  if (countdown == 0) return false;
  if (--countdown != 0) return false;
  failed_one = true;
  if (struck_at_exit) struck_at_exit->store(true);
  return true;
}

}  // namespace

namespace cuemm::testing {

HostAllocationFault::HostAllocationFault(std::uint64_t nth) { arm(nth, nullptr); }

HostAllocationFault::~HostAllocationFault() { countdown = 0; }

bool HostAllocationFault::struck() const noexcept { return failed_one; }

EveryHostAllocationFails::EveryHostAllocationFails() {
  arm(0, nullptr);  // (for the driver's calls under way)
  failures_of_every_one = 0;
  failing_every_one = true;
}

EveryHostAllocationFails::~EveryHostAllocationFails() { failing_every_one = false; }

std::uint64_t EveryHostAllocationFails::failures() const noexcept { return failures_of_every_one; }

bool host_allocation_faults_reach_the_library() {
  EveryHostAllocationFails no_host_memory;
  try {
    (void)cuemm::error_name(cuemm::cuda::CUDA_ERROR_OUT_OF_MEMORY);  // (longer than a short string's room)
  } catch (const std::bad_alloc&) {
  }
  return no_host_memory.failures() > 0;
}

void fail_host_allocation_until_thread_exit(std::uint64_t nth, std::atomic<bool>& struck) {
  struck = false;
  arm(nth, &struck);  // (never disarmed: the thread's end takes its thread_locals, these with them)
}

}  // namespace cuemm::testing

#include "support/replaced_operator_new.hpp"  // (with fail_this_one() above)
