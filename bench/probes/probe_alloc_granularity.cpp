// What one cuMemAlloc of an odd size takes from the device: the pool rounds a
// segment of its own up to whole 2 MiB pages (DedicatedSegments::segment_size)
// on the belief that the driver does too. Measured here:
//  1. For each size, 32 blocks at once: the device's free memory lost per
//     block (cuMemGetInfo), and the spacing of their addresses.
//  2. Whether the driver places a later small block in the idle end of a
//     large one's last page (its address inside [base + size, base + the
//     size rounded up to 2 MiB)).
// Build and run on the GPU machine:
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_alloc_granularity
//     bench/probes/probe_alloc_granularity.cpp -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_alloc_granularity
// (On the simulated driver: link build/lib/libcuemm_simdriver.so in place of -lcuda.)
// On the H100 (driver 580.159.04, 2026-11-28): 2 MiB + 1 byte and 3 MiB took
// 4 MiB each, 4 MiB + 1 byte to 6 MiB took 6, 8.06 MiB took 10, 64 KiB and
// 1 MiB blocks took their size (side by side in shared pages); small blocks
// after a 4.2 or 5 MiB one went to a new page (2 MiB more), none in its idle
// end. The simulated driver charges cuMemAlloc the same way (kDevicePage).
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "spin_kernel.hpp"  // CHECK, use_primary_context

namespace {
constexpr std::uint64_t kKiB = 1 << 10;
constexpr std::uint64_t kMiB = 1 << 20;

std::uint64_t device_free() {
  size_t free = 0, total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  return free;
}
}  // namespace

int main() {
  probe::use_primary_context();

  std::printf("size | free memory lost per block | smallest address step | largest\n");
  constexpr int kBlocks = 32;
  for (const std::uint64_t size :
       {64 * kKiB, 1 * kMiB, 2 * kMiB, 2 * kMiB + 1, 3 * kMiB, 4 * kMiB + 1, 4 * kMiB + 200 * kKiB, 5 * kMiB,
        6 * kMiB, 8 * kMiB - 64 * kKiB, 8 * kMiB + 64 * kKiB, 33 * kMiB}) {
    const std::uint64_t before = device_free();
    std::vector<CUdeviceptr> blocks(kBlocks);
    for (auto& block : blocks) CHECK(cuMemAlloc(&block, size));
    const std::uint64_t lost = before - device_free();
    std::vector<CUdeviceptr> sorted = blocks;
    std::sort(sorted.begin(), sorted.end());
    std::uint64_t least = UINT64_MAX, most = 0;
    for (std::size_t i = 1; i < sorted.size(); ++i) {
      least = std::min<std::uint64_t>(least, sorted[i] - sorted[i - 1]);
      most = std::max<std::uint64_t>(most, sorted[i] - sorted[i - 1]);
    }
    for (auto block : blocks) CHECK(cuMemFree(block));
    std::printf("%llu B | %.3f MiB | %.3f MiB | %.3f MiB\n", static_cast<unsigned long long>(size), double(lost) / kBlocks / kMiB,
                double(least) / kMiB, double(most) / kMiB);
  }

  // 2. Small blocks after a large one of an odd size.
  for (const std::uint64_t large : {4 * kMiB + 200 * kKiB, 5 * kMiB}) {
    const std::uint64_t before = device_free();
    CUdeviceptr base = 0;
    CHECK(cuMemAlloc(&base, large));
    const std::uint64_t after_large = device_free();
    const std::uint64_t page_end = base + (large + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
    int inside = 0;
    std::vector<CUdeviceptr> small(8);
    for (auto& block : small) {
      CHECK(cuMemAlloc(&block, 128 * kKiB));
      if (block >= base + large && block < page_end) ++inside;
    }
    const std::uint64_t after_small = device_free();
    std::printf("large %.3f MiB: lost %.3f MiB; then 8 blocks of 128 KiB: %d inside its last page's idle end, "
                "lost %.3f MiB more\n",
                double(large) / kMiB, double(before - after_large) / kMiB, inside,
                double(after_large - after_small) / kMiB);
    for (auto block : small) CHECK(cuMemFree(block));
    CHECK(cuMemFree(base));
  }
  return 0;
}
