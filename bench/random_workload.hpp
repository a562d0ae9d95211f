// random_workload.hpp: RMM's random-allocations workload, as a list of
// operations: allocate while under the live cap, otherwise (or at random)
// free a random live block; sizes uniform up to a maximum. For `cuemm random`
// and the benchmarks (no cuemm dependency, so PyTorch's anchor uses it too).
// Also a training-like workload whose sizes change between phases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
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

// A training-like workload, whose sizes change between phases: `layers`
// parameters of 2 KiB to 16 MiB allocated first; then `steps` steps, each a
// forward pass that allocates an activation of 32 KiB to 8 MiB per layer
// (batch 16, 32 or 64 per seed) with a scratch block of half its size
// allocated and freed beside it, a backward pass that frees the activations
// in reverse, each with a gradient of its size allocated and freed beside
// it, and the parameters' gradients allocated and freed; the parameters last.
// Each step picks its activations' sizes anew (inputs whose shapes vary), or
// with `same_shapes` every step repeats the first one's (a fixed-size model).
inline std::vector<RandomOperation> training_operations(std::size_t layers, std::size_t steps, unsigned seed,
                                                        bool same_shapes = false) {
  std::mt19937_64 random(seed);
  auto pick = [&](std::initializer_list<std::size_t> choices) { return choices.begin()[random() % choices.size()]; };
  std::vector<RandomOperation> operations;
  std::uint64_t next = 0;
  auto allocate = [&](std::size_t size) {
    operations.push_back({true, next, size});
    return std::make_pair(next++, size);
  };
  auto free = [&](std::pair<std::uint64_t, std::size_t> block) { operations.push_back({false, block.first, block.second}); };
  std::vector<std::pair<std::uint64_t, std::size_t>> parameters;
  for (std::size_t l = 0; l < layers; ++l)
    parameters.push_back(allocate(pick({std::size_t{512} * 4, std::size_t{256} * 256 * 4, std::size_t{1024} * 1024 * 4,
                                        std::size_t{4096} * 1024 * 4})));
  const std::size_t batch = pick({16, 32, 64});
  auto activation_size = [&] { return batch * pick({512, 1024, 2048, 4096, 8192}) * 4 * pick({1, 2, 4}); };
  std::vector<std::size_t> shapes;
  if (same_shapes)
    for (std::size_t l = 0; l < layers; ++l) shapes.push_back(activation_size());
  for (std::size_t step = 0; step < steps; ++step) {
    std::vector<std::pair<std::uint64_t, std::size_t>> activations;
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t size = same_shapes ? shapes[l] : activation_size();
      activations.push_back(allocate(size));
      free(allocate(size / 2));
    }
    for (auto it = activations.rbegin(); it != activations.rend(); ++it) {
      const auto gradient = allocate(it->second);
      free(*it);
      free(gradient);
    }
    std::vector<std::pair<std::uint64_t, std::size_t>> gradients;
    for (const auto& parameter : parameters) gradients.push_back(allocate(parameter.second));
    for (const auto& gradient : gradients) free(gradient);
  }
  for (const auto& parameter : parameters) free(parameter);
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
