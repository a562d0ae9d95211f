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

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

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

void* take(std::size_t size, std::size_t alignment) noexcept {
  if (size == 0) size = 1;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(size);
  void* pointer = nullptr;
  return posix_memalign(&pointer, alignment, size) == 0 ? pointer : nullptr;
}

void* take_or_throw(std::size_t size, std::size_t alignment) {
  if (fail_this_one()) throw std::bad_alloc();
  for (;;) {
    if (void* pointer = take(size, alignment)) return pointer;
    std::new_handler handler = std::get_new_handler();
    if (!handler) throw std::bad_alloc();
    handler();
  }
}

void* take_or_null(std::size_t size, std::size_t alignment) noexcept {
  if (fail_this_one()) return nullptr;
  return take(size, alignment);
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

void* operator new(std::size_t size) { return take_or_throw(size, 0); }
void* operator new[](std::size_t size) { return take_or_throw(size, 0); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return take_or_throw(size, static_cast<std::size_t>(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return take_or_throw(size, static_cast<std::size_t>(alignment));
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return take_or_null(size, 0); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return take_or_null(size, 0); }
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return take_or_null(size, static_cast<std::size_t>(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return take_or_null(size, static_cast<std::size_t>(alignment));
}
void operator delete(void* pointer) noexcept { std::free(pointer); }
void operator delete[](void* pointer) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::size_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::size_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::align_val_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::align_val_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::size_t, std::align_val_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::size_t, std::align_val_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete[](void* pointer, const std::nothrow_t&) noexcept { std::free(pointer); }
