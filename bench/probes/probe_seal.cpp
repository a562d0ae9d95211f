// Seal alternatives on the real driver: a legacy-stream query, an event record+query,
// and a stream write of an epoch into mapped host memory (then a plain load to check it).
// Build and run on the GPU machine (docs/pool-measurements.md has its figures):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_seal bench/probes/probe_seal.cpp \
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_seal
#include <cuda.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
using clk = std::chrono::steady_clock;
static double ns(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::nano>(b - a).count(); }
template <class F> static double med(int n, F f) {
  std::vector<double> t(n);
  for (auto& x : t) { auto a = clk::now(); f(); x = ns(a, clk::now()); }
  std::sort(t.begin(), t.end()); return t[n / 2];
}
#define CK(x) do { CUresult r = (x); if (r) { const char* s; cuGetErrorName(r, &s); std::printf("%s: %s\n", #x, s); } } while (0)
static const char* kPtx = R"(.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 n) { .reg .u64 %r<4>; .reg .pred %p<2>; ld.param.u64 %r1, [n]; mov.u64 %r2, 0;
L: add.u64 %r2, %r2, 1; setp.lt.u64 %p1, %r2, %r1; @%p1 bra L; ret; }
)";
int main() {
  CK(cuInit(0)); CUdevice d; cuDeviceGet(&d, 0); CUcontext c; cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  int memops = 0; cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, d);
  std::printf("stream mem ops supported: %d\n", memops);
  volatile unsigned* word = nullptr; CK(cuMemHostAlloc((void**)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr dword = 0; CK(cuMemHostGetDevicePointer(&dword, (void*)word, 0));
  CUevent ev; cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  auto report = [&](const char* when) {
    double q = med(20000, [] { cuStreamQuery(CU_STREAM_LEGACY); });
    double rec = med(20000, [&] { cuEventRecord(ev, CU_STREAM_LEGACY); });
    double eq = med(20000, [&] { cuEventQuery(ev); });
    unsigned v = word[0];
    double wr = med(20000, [&] { cuStreamWriteValue32(CU_STREAM_LEGACY, dword, ++v, 0); });
    cuCtxSynchronize();
    // latency: enqueue a write, spin until the host sees it
    std::vector<double> lat(2000);
    for (auto& x : lat) { auto a = clk::now(); unsigned want = ++v; cuStreamWriteValue32(CU_STREAM_LEGACY, dword, want, 0); while (word[0] != want) {} x = ns(a, clk::now()); }
    std::sort(lat.begin(), lat.end());
    double load = med(20000, [&] { (void)word[0]; });
    std::printf("%-34s query %6.0f  record %6.0f  eventquery %6.0f  write %6.0f  write->seen %6.0f (p90 %6.0f)  load %4.0f ns\n", when, q, rec, eq, wr, lat[1000], lat[1800], load);
  };
  report("fresh");
  CUmodule m; CK(cuModuleLoadData(&m, kPtx)); CUfunction f; CK(cuModuleGetFunction(&f, m, "spin"));
  report("module loaded");
  unsigned long long n = 10; void* args[] = {&n};
  CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_LEGACY, args, nullptr)); cuCtxSynchronize();
  report("after a kernel on legacy");
  CUstream s; cuStreamCreate(&s, CU_STREAM_DEFAULT);
  CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr)); cuCtxSynchronize();
  report("after a kernel on a blocking stream");
  std::thread([&] { cuCtxSetCurrent(c); cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, args, nullptr); cuCtxSynchronize(); }).join();
  report("after a kernel on a per-thread");
  // 16 threads: queries vs writes at once
  for (int mode = 0; mode < 3; ++mode) {
    std::atomic<int> go{0}; std::vector<std::thread> th; const int per = 5000; auto t0 = clk::now();
    for (int i = 0; i < 16; ++i) th.emplace_back([&, i] { cuCtxSetCurrent(c); while (!go) {} unsigned v = i << 20;
      for (int k = 0; k < per; ++k) { if (mode == 0) cuStreamQuery(CU_STREAM_LEGACY); else if (mode == 1) cuStreamWriteValue32(CU_STREAM_LEGACY, dword + 4 * (i + 1), ++v, 0); else (void)word[0]; } });
    t0 = clk::now(); go = 1; for (auto& t : th) t.join(); cuCtxSynchronize();
    std::printf("16 threads, %s: %.0f ns per call (all threads)\n", mode == 0 ? "legacy queries" : mode == 1 ? "stream writes" : "loads", ns(t0, clk::now()) / (16.0 * per));
  }
  report("end");
}
