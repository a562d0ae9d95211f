// cuemm/managers/detail/replay_clock.hpp: the time the pool's seals go by,
// which a replay may set.
//
// The pool seals at most once per interval of steady_clock time, so which
// frees a seal covers depends on how fast the calls came. On the simulated
// driver that is the host's speed from run to run, and one seed's
// reserved-over-live moved by up to 0.06 between runs of one build. A replay
// (`cuemm replay`, `cuemm random`) that sets this clock and advances it by
// each operation's time, the log's or a fixed one, makes every run of the
// same operations seal at the same points.
#pragma once

#include <atomic>
#include <cstdint>

namespace cuemm::detail {

// steady_clock ticks; null: steady_clock itself. Set before the pool's first
// call and cleared after its last, by one replay at a time.
extern std::atomic<const std::atomic<std::int64_t>*> replay_clock;

}  // namespace cuemm::detail
