// Kernels the tests launch. The simulated driver has host emulations of
// exactly these (sim/kernels.cpp); on a GPU the PTX below runs for real.
// Regenerate test_kernels.ptx with: nvcc -ptx -arch=compute_75 test_kernels.cu
#include <cstdint>

extern "C" __global__ void cuemm_fill_u32(std::uint32_t* out, std::uint32_t value, std::uint64_t count) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    out[i] = value;
}

extern "C" __global__ void cuemm_add_u32(std::uint32_t* data, std::uint32_t value, std::uint64_t count) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    data[i] += value;
}

// Busy for spin_ns nanoseconds, then fills: long-running work for stream-ordering tests.
extern "C" __global__ void cuemm_spin_fill_u32(std::uint32_t* out, std::uint32_t value, std::uint64_t count,
                                               std::uint64_t spin_ns) {
  std::uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    std::uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= spin_ns) break;
  }
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    out[i] = value;
}

// Busy until the host writes a non-zero word to `gate` (mapped host memory)
// or most_ns nanoseconds pass, then fills: work that stays queued for as long
// as a test needs, however slowly the host runs (tests/support's HeldKernel).
extern "C" __global__ void cuemm_held_fill_u32(const volatile std::uint32_t* gate, std::uint32_t* out,
                                               std::uint32_t value, std::uint64_t count, std::uint64_t most_ns) {
  std::uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*gate == 0) {
    std::uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= most_ns) break;
    __nanosleep(1000);
  }
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    out[i] = value;
}
