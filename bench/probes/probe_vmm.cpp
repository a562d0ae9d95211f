// What remapping physical pages costs on the real driver, against cuMemAlloc:
// could large blocks of varying sizes be built from pooled 2 MiB handles?
// Build and run on the GPU machine (docs/pool-measurements.md has its figures):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_vmm bench/probes/probe_vmm.cpp \
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_vmm
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
#define CK(x) do { CUresult r = (x); if (r) { const char* s; cuGetErrorName(r, &s); std::printf("%s: %s\n", #x, s); return 1; } } while (0)
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
int main() {
  CK(cuInit(0)); CUdevice d; cuDeviceGet(&d, 0); CUcontext c; cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  const size_t page = 2 << 20;
  for (size_t mib : {2, 8, 32, 64}) {
    std::vector<double> t;
    for (int i = 0; i < 30; ++i) { CUdeviceptr p; auto a = clk::now(); CK(cuMemAlloc(&p, mib << 20)); CK(cuMemFree(p)); t.push_back(us(a, clk::now())); }
    std::printf("cuMemAlloc+cuMemFree %zu MiB: %.1f us\n", mib, median(t));
  }
  CUmemAllocationProp prop{}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, d};
  std::vector<CUmemGenericAllocationHandle> chunks(32);
  { auto a = clk::now(); for (auto& h : chunks) CK(cuMemCreate(&h, page, &prop, 0)); std::printf("cuMemCreate 2 MiB: %.1f us each\n", us(a, clk::now()) / 32); }
  CUdeviceptr va; const size_t span = size_t{1} << 30; CK(cuMemAddressReserve(&va, span, 0, 0, 0));
  CUmemAccessDesc access{}; access.location = prop.location; access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (size_t n : {1, 4, 16, 32}) {
    std::vector<double> map, set, unmap, all;
    for (int i = 0; i < 30; ++i) {
      CUdeviceptr at = va + (i % 8) * (64 << 20);
      auto a = clk::now();
      for (size_t k = 0; k < n; ++k) CK(cuMemMap(at + k * page, page, 0, chunks[k], 0));
      auto b = clk::now();
      CK(cuMemSetAccess(at, n * page, &access, 1));
      auto e = clk::now();
      CK(cuMemUnmap(at, n * page));
      auto f = clk::now();
      map.push_back(us(a, b)); set.push_back(us(b, e)); unmap.push_back(us(e, f)); all.push_back(us(a, f));
    }
    std::printf("%2zu chunks of 2 MiB (%3zu MiB): map %.1f us, set access %.1f us, unmap %.1f us, all %.1f us\n", n,
                n * 2, median(map), median(set), median(unmap), median(all));
  }
  // One larger handle mapped whole.
  for (size_t mib : {8, 32, 64}) {
    CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, mib << 20, &prop, 0));
    std::vector<double> all;
    for (int i = 0; i < 30; ++i) {
      auto a = clk::now();
      CK(cuMemMap(va, mib << 20, 0, h, 0)); CK(cuMemSetAccess(va, mib << 20, &access, 1)); CK(cuMemUnmap(va, mib << 20));
      all.push_back(us(a, clk::now()));
    }
    std::printf("one %zu MiB handle: map+set access+unmap %.1f us\n", mib, median(all));
    cuMemRelease(h);
  }
  // With GPU work queued (a memset on the legacy stream): does unmap wait for it?
  {
    CUdeviceptr big; CK(cuMemAlloc(&big, size_t{4} << 30));
    for (size_t k = 0; k < 16; ++k) CK(cuMemMap(va + k * page, page, 0, chunks[k], 0));
    CK(cuMemSetAccess(va, 16 * page, &access, 1));
    auto a = clk::now();
    for (int r = 0; r < 20; ++r) CK(cuMemsetD8Async(big, r, size_t{4} << 30, 0));
    auto b = clk::now();
    CK(cuMemUnmap(va, 16 * page));
    auto e = clk::now();
    CK(cuCtxSynchronize());
    auto f = clk::now();
    std::printf("with 80 GiB of memset queued: queue %.1f us, unmap %.1f us, then synchronize %.1f us\n", us(a, b), us(b, e), us(e, f));
    cuMemFree(big);
  }
  return 0;
}
