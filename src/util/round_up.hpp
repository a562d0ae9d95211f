// round_up.hpp: the one rounding rule for sizes and addresses.
#pragma once

#include <cstddef>

namespace cuemm::util {

// `value` rounded up to a multiple of `granularity` (> 0; need not be a power of two).
// A power of two is masked rather than divided: a 64-bit divide is tens of
// cycles, which hot paths (the pinned pool's block size) felt on the H100's host.
constexpr std::size_t round_up(std::size_t value, std::size_t granularity) noexcept {
  if ((granularity & (granularity - 1)) == 0) return (value + granularity - 1) & ~(granularity - 1);
  return (value + granularity - 1) / granularity * granularity;
}

static_assert(round_up(5, 4) == 8 && round_up(8, 4) == 8 && round_up(7, 3) == 9 && round_up(0, 256) == 0);

}  // namespace cuemm::util
