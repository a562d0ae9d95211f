// Can one physical page be mapped at two addresses, so that a block may be
// assembled from the free ends of pages the expandable arena has mapped
// (Note [Expandable arena]), and what does assembling one cost?
// docs/pool-measurements.md ("Blocks assembled from the free ends of pages") has its figures.
// Build and run on the GPU machine:
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_assembled_block \
//     bench/probes/probe_assembled_block.cpp -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_assembled_block
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "spin_kernel.hpp"  // use_primary_context

using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
#define CK(x)                                                   \
  do {                                                          \
    CUresult r_ = (x);                                          \
    if (r_) {                                                   \
      const char* s_;                                           \
      cuGetErrorName(r_, &s_);                                  \
      std::printf("%s (line %d): %s\n", #x, __LINE__, s_);     \
      return 1;                                                 \
    }                                                           \
  } while (0)

// Whether every 32-bit word of [address, address + bytes) holds `value`.
static bool holds(CUdeviceptr address, std::size_t bytes, std::uint32_t value) {
  std::vector<std::uint32_t> words(bytes / 4);
  if (cuMemcpyDtoH(words.data(), address, bytes)) return false;
  return std::all_of(words.begin(), words.end(), [&](std::uint32_t w) { return w == value; });
}

int main() {
  CUdevice device;
  probe::use_primary_context(&device);
  const std::size_t page = std::size_t{2} << 20, half = page / 2, quarter = page / 4;
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  CUmemAccessDesc access{};
  access.location = properties.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  // The arena: pages A and B mapped two pages apart, holding the arena's
  // blocks (0xAA..., 0xBB...) but for A's last quarter and B's first half,
  // which are free: each too small for a block of 3/4 of a page.
  CUmemGenericAllocationHandle a, b;
  CK(cuMemCreate(&a, page, &properties, 0));
  CK(cuMemCreate(&b, page, &properties, 0));
  CUdeviceptr arena;
  CK(cuMemAddressReserve(&arena, 4 * page, page, 0, 0));
  CK(cuMemMap(arena, page, 0, a, 0));
  CK(cuMemMap(arena + 2 * page, page, 0, b, 0));
  CK(cuMemSetAccess(arena, page, &access, 1));
  CK(cuMemSetAccess(arena + 2 * page, page, &access, 1));
  CK(cuMemsetD32(arena, 0xAAAAAAAA, page / 4));
  CK(cuMemsetD32(arena + 2 * page, 0xBBBBBBBB, page / 4));
  CK(cuMemsetD32(arena + page - quarter, 0x11111111, quarter / 4));  // A's free end
  CK(cuMemsetD32(arena + 2 * page, 0x22222222, half / 4));           // B's free start

  // The assembled block: A then B mapped side by side at addresses of their
  // own; the block is A's last quarter and B's first half, contiguous there.
  CUdeviceptr own;
  CK(cuMemAddressReserve(&own, 2 * page, page, 0, 0));
  CK(cuMemMap(own, page, 0, a, 0));
  CK(cuMemMap(own + page, page, 0, b, 0));
  CK(cuMemSetAccess(own, 2 * page, &access, 1));
  const CUdeviceptr block = own + page - quarter;
  const std::size_t block_bytes = quarter + half;
  const bool reads = holds(block, quarter, 0x11111111) && holds(block + quarter, half, 0x22222222);
  // Written through the block (one memset across the seam, on the GPU), read through the arena.
  CK(cuMemsetD32(block, 0x33333333, block_bytes / 4));
  CK(cuCtxSynchronize());
  const bool writes = holds(arena + page - quarter, quarter, 0x33333333) && holds(arena + 2 * page, half, 0x33333333);
  // The arena's own blocks beside it are untouched.
  const bool apart = holds(arena, page - quarter, 0xAAAAAAAA) && holds(arena + 2 * page + half, half, 0xBBBBBBBB);
  // A copy on the GPU across the seam, from the arena's pages to the block.
  CK(cuMemsetD32(arena + page - quarter, 0x44444444, quarter / 4));
  CK(cuMemsetD32(arena + 2 * page, 0x55555555, half / 4));
  CUdeviceptr scratch;
  CK(cuMemAlloc(&scratch, block_bytes));
  CK(cuMemcpyDtoD(scratch, block, block_bytes));
  const bool copies = holds(scratch, quarter, 0x44444444) && holds(scratch + quarter, half, 0x55555555);
  std::printf("one page at two addresses: read %s, written %s, neighbours %s, copied across the seam %s\n",
              reads ? "ok" : "WRONG", writes ? "ok" : "WRONG", apart ? "untouched" : "CHANGED", copies ? "ok" : "WRONG");
  // Unmapping the block's addresses leaves the arena's mapping of the same pages.
  CK(cuMemUnmap(own, 2 * page));
  std::printf("after the block's unmap, the arena still reads its pages: %s\n",
              holds(arena + page - quarter, quarter, 0x44444444) ? "ok" : "WRONG");

  // What assembling costs: addresses reserved per block, or carved from one
  // reservation; blocks of two pages (both ends reused) and three (a new
  // middle page, its cuMemCreate included), against cuMemAlloc of the size.
  CUdeviceptr region;
  const std::size_t region_pages = 256;
  CK(cuMemAddressReserve(&region, region_pages * page, page, 0, 0));
  for (const int pages : {2, 3, 4}) {
    std::vector<double> reserved_each, carved, undone, allocated;
    for (int round = 0; round < 40; ++round) {
      const CUdeviceptr at = region + (round % 32) * 8 * page;
      auto t0 = clk::now();
      CUdeviceptr va;
      CK(cuMemAddressReserve(&va, pages * page, page, 0, 0));
      CK(cuMemMap(va, page, 0, a, 0));
      for (int k = 1; k + 1 < pages; ++k) {
        CUmemGenericAllocationHandle middle;
        CK(cuMemCreate(&middle, page, &properties, 0));
        CK(cuMemMap(va + k * page, page, 0, middle, 0));
        CK(cuMemRelease(middle));  // (freed with its mapping)
      }
      CK(cuMemMap(va + (pages - 1) * page, page, 0, b, 0));
      CK(cuMemSetAccess(va, pages * page, &access, 1));
      auto t1 = clk::now();
      CK(cuMemUnmap(va, pages * page));
      CK(cuMemAddressFree(va, pages * page));
      auto t2 = clk::now();
      CK(cuMemMap(at, page, 0, a, 0));
      for (int k = 1; k + 1 < pages; ++k) {
        CUmemGenericAllocationHandle middle;
        CK(cuMemCreate(&middle, page, &properties, 0));
        CK(cuMemMap(at + k * page, page, 0, middle, 0));
        CK(cuMemRelease(middle));
      }
      CK(cuMemMap(at + (pages - 1) * page, page, 0, b, 0));
      CK(cuMemSetAccess(at, pages * page, &access, 1));
      auto t3 = clk::now();
      CK(cuMemUnmap(at, pages * page));
      auto t4 = clk::now();
      CUdeviceptr plain;
      CK(cuMemAlloc(&plain, (pages - 1) * page + quarter));
      CK(cuMemFree(plain));
      auto t5 = clk::now();
      reserved_each.push_back(us(t0, t1) + us(t1, t2));
      carved.push_back(us(t2, t3) + us(t3, t4));
      undone.push_back(us(t3, t4));
      allocated.push_back(us(t4, t5));
    }
    std::printf("a block over %d pages (%d new): assembled and undone %.1f us with its own reservation, %.1f us "
                "carved from one (of which the unmap %.1f); cuMemAlloc+cuMemFree of %.2f MiB %.1f us\n",
                pages, pages - 2, median(reserved_each), median(carved), median(undone),
                ((pages - 1) * page + quarter) / 1048576.0, median(allocated));
  }
  return reads && writes && apart && copies ? 0 : 2;
}
