// own_lines.hpp: how far apart two threads' hot data must lie.
#pragma once

#include <cstddef>

namespace cuemm::util {

// Alignment (and so size) for a small object that one thread writes on every
// allocation. 64 bytes is a cache line, but x86 CPUs prefetch lines in
// aligned pairs, so two threads' 64-byte objects side by side in one 128-byte
// pair can still move between their CPUs. Where such objects lie is the
// heap's choice: a slot made by a thread that ended is reused by a new one,
// beside whatever the heap put there.
inline constexpr std::size_t kOwnLines = 128;

}  // namespace cuemm::util
