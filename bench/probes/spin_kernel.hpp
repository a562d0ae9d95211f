// What the driver probes share: a check that names the failed call, a clock,
// device 0's primary context made current,
// and a one-thread kernel that spins for a number of GPU clock cycles,
// calibrated to about 50 ms (a loop that counts would be optimised away).
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace probe {

using Clock = std::chrono::steady_clock;
inline double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

inline void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "?";
  cuGetErrorName(result, &name);
  std::printf("%s: %s\n", call, name);
  std::exit(1);
}
#define CHECK(x) ::probe::check((x), #x)

// Device 0's primary context, made current.
inline CUcontext use_primary_context(CUdevice* device_out = nullptr) {
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  if (device_out) *device_out = device;
  return context;
}

struct SpinKernel {
  CUcontext context = nullptr;
  CUfunction spin = nullptr;
  unsigned long long fifty_ms_cycles = 0;

  // Device 0's primary context, current; the kernel loaded and calibrated.
  SpinKernel() {
    static const char* kPtx = R"(.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 n) { .reg .u64 %r<5>; .reg .pred %p<2>; ld.param.u64 %r1, [n]; mov.u64 %r2, %clock64;
L: mov.u64 %r3, %clock64; sub.u64 %r4, %r3, %r2; setp.lt.u64 %p1, %r4, %r1; @%p1 bra L; ret; }
)";
    context = use_primary_context();
    CUmodule module;
    CHECK(cuModuleLoadData(&module, kPtx));
    CHECK(cuModuleGetFunction(&spin, module, "spin"));
    const unsigned long long probe_cycles = 1ull << 24;
    const auto start = Clock::now();
    launch(probe_cycles, CU_STREAM_LEGACY);
    CHECK(cuCtxSynchronize());
    const double calibration_us = us_since(start);
    fifty_ms_cycles = static_cast<unsigned long long>(probe_cycles * 50000.0 / calibration_us);
    std::printf("spin kernel: %.0f us for 2^24 cycles; using %llu for about 50 ms\n", calibration_us,
                fifty_ms_cycles);
  }
  void launch(unsigned long long cycles, CUstream stream) const {
    void* args[] = {&cycles};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr));
  }
  void launch_fifty_ms(CUstream stream) const { launch(fifty_ms_cycles, stream); }
};

}  // namespace probe
