// random_workload.hpp: RMM's random-allocations workload, as a list of
// operations: allocate while under the live cap, otherwise (or at random)
// free a random live block; sizes uniform up to a maximum. For `cuemm random`
// and the benchmarks (no cuemm dependency, so PyTorch's anchor uses it too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace cuemm::workload {

struct RandomOperation {
  bool allocate;
  std::uint64_t id;  // pairs an allocation with its free: 0, 1, 2, ... in allocation order
  std::size_t size;
};

inline std::vector<RandomOperation> random_operations(std::size_t max_size, std::size_t count, std::size_t live_cap,
                                                      unsigned seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<std::size_t> sizes(1, max_size);
  std::vector<RandomOperation> operations;
  operations.reserve(count);
  std::vector<std::pair<std::uint64_t, std::size_t>> live;
  std::size_t live_bytes = 0;
  std::uint64_t next = 0;
  while (operations.size() < count) {
    const std::size_t size = sizes(random);
    const bool allocate = live.empty() || (live_bytes + size <= live_cap && random() % 2 == 0);
    if (allocate) {
      operations.push_back({true, next, size});
      live.emplace_back(next++, size);
      live_bytes += size;
    } else {
      const std::size_t victim = random() % live.size();
      operations.push_back({false, live[victim].first, live[victim].second});
      live_bytes -= live[victim].second;
      live[victim] = live.back();
      live.pop_back();
    }
  }
  return operations;
}

// The most bytes live at once along `operations`.
inline std::size_t peak_live_bytes(const std::vector<RandomOperation>& operations) {
  std::size_t live = 0, peak = 0;
  for (const RandomOperation& operation : operations) {
    live = operation.allocate ? live + operation.size : live - operation.size;
    peak = live > peak ? live : peak;
  }
  return peak;
}

}  // namespace cuemm::workload
