// cuemm/managers/detail/size_classes.hpp: the size classes of the pool's
// per-thread caches.
//
// Note [Size classes]
// Requests up to kLargestCachedSize are rounded up to a class: 256-byte steps
// up to 4 KiB, then sixteen classes per power of two (at most 1/16 = 6.25%
// over the request). Every block of a class has the class's size, so a block
// freed by one request can serve any other request of its class without
// looking at the allocator's index. (Eight classes per power of two rounded
// up twice as much: simulated driver, RMM's random workload, seeds 1-16,
// peak reserved over live up to 1 MiB with 512 MiB live 1.166 -> 1.153, up to
// 256 KiB with 64 MiB 1.195 -> 1.168, up to 64 KiB with 16 MiB 1.373 ->
// 1.327; larger sizes and threads the same or better.) 144 classes, so a
// class index fits in the low eight bits of a 256-byte-aligned address.
#pragma once

#include <array>
#include <bit>
#include <cstddef>

namespace cuemm::detail {

inline constexpr std::size_t kSmallestClass = 256;
inline constexpr std::size_t kLinearClassLimit = 4096;
inline constexpr std::size_t kLargestCachedSize = std::size_t{1} << 20;
inline constexpr int kClassesPerDoubling = 16;
inline constexpr int kLinearClasses = static_cast<int>(kLinearClassLimit / kSmallestClass);
inline constexpr int kSizeClassCount =
    kLinearClasses +
    kClassesPerDoubling * (std::bit_width(kLargestCachedSize) - std::bit_width(kLinearClassLimit));

// The class of a request, or -1 when it is too large to be cached (or zero).
constexpr int size_class_of(std::size_t size) noexcept {
  if (size == 0 || size > kLargestCachedSize) return -1;
  if (size <= kLinearClassLimit) return static_cast<int>((size + kSmallestClass - 1) / kSmallestClass) - 1;
  const int power = std::bit_width(size - 1) - 1;  // size is in (2^power, 2^(power+1)]
  // Steps are powers of two: a shift, not a division (a 64-bit divide was a
  // sixth of a 64 KiB pair on the H100 machine's host, in the allocation and
  // again in the free).
  const int step_shift = power - std::countr_zero(static_cast<unsigned>(kClassesPerDoubling));
  const std::size_t above = size - (std::size_t{1} << power);
  const int sub = static_cast<int>((above + (std::size_t{1} << step_shift) - 1) >> step_shift);  // 1..8
  return kLinearClasses + (power - (std::bit_width(kLinearClassLimit) - 1)) * kClassesPerDoubling + sub - 1;
}

// The bytes every block of class `size_class` has, computed.
constexpr std::size_t size_class_bytes_of(int size_class) noexcept {
  if (size_class < kLinearClasses) return (static_cast<std::size_t>(size_class) + 1) * kSmallestClass;
  const int above = size_class - kLinearClasses;
  const int power = std::bit_width(kLinearClassLimit) - 1 + above / kClassesPerDoubling;
  const std::size_t base = std::size_t{1} << power;
  return base + (static_cast<std::size_t>(above % kClassesPerDoubling) + 1) * (base / kClassesPerDoubling);
}

// The same, looked up: every cached allocation and free asks it, and one
// load is a tenth of the instructions of the branches and shifts above.
inline constexpr auto kSizeClassBytes = [] {
  std::array<std::size_t, kSizeClassCount> bytes{};
  for (int c = 0; c < kSizeClassCount; ++c) bytes[static_cast<std::size_t>(c)] = size_class_bytes_of(c);
  return bytes;
}();
constexpr std::size_t size_class_bytes(int size_class) noexcept {
  return kSizeClassBytes[static_cast<std::size_t>(size_class)];
}

static_assert(kSizeClassCount == 144);
static_assert(size_class_of(1) == 0 && size_class_bytes(0) == 256);
static_assert(size_class_of(4096) == 15 && size_class_of(4097) == 16 && size_class_bytes(16) == 4352);
static_assert(size_class_of(kLargestCachedSize) == kSizeClassCount - 1);
static_assert(std::has_single_bit(static_cast<unsigned>(kClassesPerDoubling)));
static_assert(size_class_bytes(kSizeClassCount - 1) == kLargestCachedSize);

}  // namespace cuemm::detail
