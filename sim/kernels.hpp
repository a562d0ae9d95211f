// kernels.hpp: host emulations of the kernels the simulated driver can run.
//
// The simulation cannot execute PTX. It loads PTX modules (finding their
// .entry names) and runs a launch only when a host emulation of that kernel is
// registered here; launching any other kernel fails with
// CUDA_ERROR_NOT_SUPPORTED. The CUDA sources of these kernels are in
// kernels/test_kernels.cu, and the same PTX runs on a real GPU.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace cuemm::sim {

struct EmulatedKernel {
  std::vector<std::size_t> parameter_sizes;
  // Receives copies of the parameters, taken when the launch was queued.
  std::function<void(const std::vector<std::vector<char>>& parameters)> run;
};

// nullptr when the kernel has no emulation.
const EmulatedKernel* find_emulated_kernel(const std::string& name);

}  // namespace cuemm::sim
