// A library for LD_PRELOAD that can fail one C++ allocation of a thread on
// purpose, in a process the tests do not build (Python running cuemm's
// module): its global operator new and delete stand in for the C++ runtime's
// in every library that takes them from it (libcuemm, the Python module),
// while Python's own allocations are malloc's and untouched.
// tests/support/host_allocation_faults.cpp does the same inside a test
// program; this one is armed from Python through ctypes:
//
//   faults = ctypes.CDLL(None)             # (the preloaded library's symbols)
//   faults.cuemm_host_faults_arm(3)         # fail this thread's third allocation from now
//   ...                                     # the call under test
//   faults.cuemm_host_faults_fired()        # whether it came to the third
//   faults.cuemm_host_faults_arm(0)         # disarm
//
// Allocations inside a simulated driver call never fail: the driver's own
// host memory is not what the tests are about.
#include <dlfcn.h>

#include <cstdint>

namespace {

thread_local std::uint64_t countdown = 0;
thread_local bool fired = false;
thread_local const int* driver_calls_under_way = nullptr;

bool fail_this_one() noexcept {
  if (countdown == 0) return false;
  if (driver_calls_under_way && *driver_calls_under_way > 0) return false;
  if (--countdown != 0) return false;
  fired = true;
  return true;
}

}  // namespace

extern "C" {

// Fails the calling thread's nth C++ allocation from now (0: none).
__attribute__((visibility("default"))) void cuemm_host_faults_arm(std::uint64_t nth) {
  // The simulated driver's count of its calls under way on this thread,
  // where it is loaded (looked up now: the lookup itself may allocate).
  driver_calls_under_way = nullptr;
  if (nth != 0) {
    if (void* driver = dlopen("libcuemm_simdriver.so", RTLD_NOW | RTLD_NOLOAD)) {
      using Lookup = int* (*)();
      if (auto lookup = reinterpret_cast<Lookup>(dlsym(driver, "cuemmSimDriverCallsUnderWay")))
        driver_calls_under_way = lookup();
      dlclose(driver);  // (NOLOAD took a reference of its own)
    }
  }
  fired = false;
  countdown = nth;
}

// Whether the armed allocation failed since the last arming.
__attribute__((visibility("default"))) int cuemm_host_faults_fired() { return fired ? 1 : 0; }

}  // extern "C"

#include "support/replaced_operator_new.hpp"  // (with fail_this_one() above)
