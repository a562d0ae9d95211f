// tests/support/replaced_operator_new.hpp: the global operator new and
// delete, over malloc, failing an allocation wherever the including file's
// `bool fail_this_one() noexcept` says so. A process takes one replacement:
// one file of a program or library includes this, after declaring that
// function (host_allocation_faults.cpp in the test programs,
// preloaded_host_faults.cpp in the library preloaded into Python).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

bool fail_this_one() noexcept;

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

constexpr std::size_t kPlain = alignof(std::max_align_t);

}  // namespace

void* operator new(std::size_t size) { return take_or_throw(size, kPlain); }
void* operator new[](std::size_t size) { return take_or_throw(size, kPlain); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return take_or_throw(size, static_cast<std::size_t>(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return take_or_throw(size, static_cast<std::size_t>(alignment));
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return take_or_null(size, kPlain); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return take_or_null(size, kPlain); }
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
void operator delete(void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { std::free(pointer); }
