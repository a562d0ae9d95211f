// random_workload.hpp: RMM's random-allocations workload, as a list of
// operations: allocate while under the live cap, otherwise (or at random)
// free a random live block; sizes uniform up to a maximum. For `cuemm random`
// and the benchmarks (no cuemm dependency, so PyTorch's anchor uses it too).
// Also a training-like workload whose sizes change between phases, and three
// more programs' patterns: small blocks beside large temporaries, inference
// requests of random batch sizes, and a queue of buffers freed oldest first.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
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

// How a training-like workload draws its sizes.
enum class TrainingShapes {
  varied,     // each step picks its activations' sizes anew from a few round sizes (inputs whose shapes vary)
  same,       // every step repeats the first one's (a fixed-size model of round sizes)
  per_layer,  // each layer keeps sizes of its own, any byte count, drawn once (a model whose tensors all differ)
};

// `cuemm random --pattern training`'s defaults, which the benchmarks run too.
inline constexpr std::size_t kTrainingLayers = 60;
inline constexpr std::size_t kTrainingSteps = 30;

// A training-like workload, whose sizes change between phases: `layers`
// parameters allocated first; then `steps` steps, each a forward pass that
// allocates an activation per layer with a scratch block of half its size
// allocated and freed beside it, a backward pass that frees the activations
// in reverse, each with a gradient of its size allocated and freed beside
// it, and the parameters' gradients allocated and freed; the parameters last.
// Parameters are 2 KiB to 16 MiB and activations 32 KiB to 8 MiB: with
// `varied` and `same`, round sizes (batch 16, 32 or 64 per seed, times a few
// widths); with `per_layer`, sizes drawn log-uniformly over those ranges.
inline std::vector<RandomOperation> training_operations(std::size_t layers, std::size_t steps, unsigned seed,
                                                        TrainingShapes shapes_drawn = TrainingShapes::varied) {
  std::mt19937_64 random(seed);
  auto pick = [&](std::initializer_list<std::size_t> choices) { return choices.begin()[random() % choices.size()]; };
  auto log_uniform = [&](std::size_t low, std::size_t high) {
    std::uniform_real_distribution<double> exponent(std::log2(static_cast<double>(low)), std::log2(static_cast<double>(high)));
    return static_cast<std::size_t>(std::exp2(exponent(random)));
  };
  const bool per_layer = shapes_drawn == TrainingShapes::per_layer;
  std::vector<RandomOperation> operations;
  std::uint64_t next = 0;
  auto allocate = [&](std::size_t size) {
    operations.push_back({true, next, size});
    return std::make_pair(next++, size);
  };
  auto free = [&](std::pair<std::uint64_t, std::size_t> block) { operations.push_back({false, block.first, block.second}); };
  std::vector<std::pair<std::uint64_t, std::size_t>> parameters;
  for (std::size_t l = 0; l < layers; ++l)
    parameters.push_back(allocate(per_layer ? log_uniform(2 << 10, 16 << 20)
                                            : pick({std::size_t{512} * 4, std::size_t{256} * 256 * 4,
                                                    std::size_t{1024} * 1024 * 4, std::size_t{4096} * 1024 * 4})));
  const std::size_t batch = per_layer ? 0 : pick({16, 32, 64});
  auto activation_size = [&] {
    return per_layer ? log_uniform(32 << 10, 8 << 20) : batch * pick({512, 1024, 2048, 4096, 8192}) * 4 * pick({1, 2, 4});
  };
  std::vector<std::size_t> shapes;
  if (shapes_drawn != TrainingShapes::varied)
    for (std::size_t l = 0; l < layers; ++l) shapes.push_back(activation_size());
  for (std::size_t step = 0; step < steps; ++step) {
    std::vector<std::pair<std::uint64_t, std::size_t>> activations;
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t size = shapes.empty() ? activation_size() : shapes[l];
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

// Long-lived small blocks beside large temporaries, as a program that keeps
// many small arrays while it makes and drops large scratch buffers: each of
// `count` steps allocates a block of 1-256 KiB that stays (one at random goes
// once 1,500 are live), and three steps in ten also a temporary of 8-96 MiB,
// freed at once. No two temporaries need be of one size.
inline std::vector<RandomOperation> temporaries_operations(std::size_t count, unsigned seed) {
  std::mt19937_64 random(seed);
  std::vector<RandomOperation> operations;
  std::vector<std::pair<std::uint64_t, std::size_t>> kept;
  std::uint64_t next = 0;
  for (std::size_t step = 0; step < count; ++step) {
    const std::size_t small = (1 + random() % 256) << 10;
    operations.push_back({true, next, small});
    kept.emplace_back(next++, small);
    if (random() % 10 < 3) {
      const std::size_t temporary = (8 + random() % 89) << 20;
      operations.push_back({true, next, temporary});
      operations.push_back({false, next++, temporary});
    }
    if (kept.size() > 1500) {
      const std::size_t victim = random() % kept.size();
      operations.push_back({false, kept[victim].first, kept[victim].second});
      kept[victim] = kept.back();
      kept.pop_back();
    }
  }
  for (const auto& [id, size] : kept) operations.push_back({false, id, size});
  return operations;
}

// Inference requests of random batch sizes: 50 weights of 16 KiB to 4 MiB
// stay; each of `requests` requests picks a batch of 1-64 and runs 30
// layers, each allocating an activation of the batch times its width
// (4-256 KiB), the one before last freed as each is made (two live at once).
inline std::vector<RandomOperation> inference_operations(std::size_t requests, unsigned seed) {
  std::mt19937_64 random(seed);
  std::vector<RandomOperation> operations;
  std::uint64_t next = 0;
  std::vector<std::pair<std::uint64_t, std::size_t>> weights;
  for (int w = 0; w < 50; ++w) {
    const std::size_t size = (16 + random() % 4081) << 10;
    operations.push_back({true, next, size});
    weights.emplace_back(next++, size);
  }
  std::vector<std::size_t> widths;
  for (int l = 0; l < 30; ++l) widths.push_back((4 + random() % 253) << 10);
  for (std::size_t r = 0; r < requests; ++r) {
    const std::size_t batch = 1 + random() % 64;
    std::vector<std::pair<std::uint64_t, std::size_t>> live;
    for (const std::size_t width : widths) {
      operations.push_back({true, next, batch * width});
      live.emplace_back(next++, batch * width);
      if (live.size() > 2) {
        operations.push_back({false, live.front().first, live.front().second});
        live.erase(live.begin());
      }
    }
    for (const auto& [id, size] : live) operations.push_back({false, id, size});
  }
  for (const auto& [id, size] : weights) operations.push_back({false, id, size});
  return operations;
}

// A pipeline's queue of buffers in flight: each of `count` steps allocates a
// block of a size uniform from 1 byte to `max_size`, and once `depth` blocks
// are live frees the oldest first (a data loader's batches, a stream of
// requests): holes open where the queue's tail was, while its head asks for
// new sizes.
inline std::vector<RandomOperation> queue_operations(std::size_t max_size, std::size_t depth, std::size_t count,
                                                     unsigned seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<std::size_t> sizes(1, max_size);
  std::vector<RandomOperation> operations;
  operations.reserve(2 * count);
  std::deque<RandomOperation> live;  // oldest first
  auto free_oldest = [&] {
    operations.push_back({false, live.front().id, live.front().size});
    live.pop_front();
  };
  for (std::uint64_t next = 0; next < count; ++next) {
    operations.push_back({true, next, sizes(random)});
    live.push_back(operations.back());
    if (live.size() > depth) free_oldest();
  }
  while (!live.empty()) free_oldest();
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
