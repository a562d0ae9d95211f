// address_shard.hpp: which of 2^bits shards a block's address belongs to, for
// records kept in shards under locks of their own (the tracking adaptor's,
// the async manager's, an adaptor's stream-ordered blocks).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuemm::util {

// Blocks are at least 256-byte aligned and a pool hands out neighbours: the
// bits above the alignment are multiplied through, so neighbours spread.
constexpr std::size_t address_shard(std::uintptr_t address, int bits) noexcept {
  return static_cast<std::size_t>((address >> 8) * 0x9E3779B97F4A7C15ull >> (64 - bits));
}

}  // namespace cuemm::util
