// round_up.hpp: the one rounding rule for sizes and addresses.
#pragma once

#include <cstddef>

namespace cuemm::util {

// `value` rounded up to a multiple of `granularity` (> 0; need not be a power of two).
constexpr std::size_t round_up(std::size_t value, std::size_t granularity) noexcept {
  return (value + granularity - 1) / granularity * granularity;
}

}  // namespace cuemm::util
