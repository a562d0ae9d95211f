// Does cuMemFree (or cuMemAlloc) wait for queued kernels? The pool gives
// spares back with cuMemFree at its peak, and a training loop that queues
// milliseconds of work ahead would lose that lead if it did. Then the same
// for cuMemFreeHost, cuMemUnmap and cuMemRelease.
// A spin kernel of about 50 ms runs on the legacy stream, on a blocking
// stream and on a non-blocking one; meanwhile the host times cuMemFree of a
// block the kernel does not touch, and cuMemAlloc. Build and run on the GPU
// machine (docs/pool-measurements.md has its figures):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_free_stall bench/probes/probe_free_stall.cpp
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_free_stall
#include <cstddef>
#include <cstdio>
#include <initializer_list>

#include "spin_kernel.hpp"

using probe::Clock;
using probe::us_since;

int main() {
  const probe::SpinKernel kernel;

  CUstream blocking, non_blocking;
  CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  CHECK(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));
  struct Case {
    const char* name;
    CUstream stream;
  } cases[] = {{"legacy stream", CU_STREAM_LEGACY}, {"blocking stream", blocking},
               {"non-blocking stream", non_blocking}, {"none (idle GPU)", nullptr}};
  for (const std::size_t bytes : {std::size_t{2} << 20, std::size_t{64} << 20}) {
    for (const Case& c : cases) {
      for (int round = 0; round < 3; ++round) {
        CUdeviceptr spare = 0;
        CHECK(cuMemAlloc(&spare, bytes));
        CHECK(cuCtxSynchronize());
        const auto launched = Clock::now();
        if (c.stream) kernel.launch_fifty_ms(c.stream);
        auto at = Clock::now();
        CHECK(cuMemFree(spare));
        const double free_us = us_since(at);
        CUdeviceptr fresh = 0;
        at = Clock::now();
        CHECK(cuMemAlloc(&fresh, bytes));
        const double alloc_us = us_since(at);
        const double before_sync_us = us_since(launched);
        CHECK(cuCtxSynchronize());
        const double total_us = us_since(launched);
        std::printf("%3zu MiB, kernel on %-20s cuMemFree %9.1f us  cuMemAlloc %9.1f us  (kernel done %8.0f us after launch; "
                    "host back %8.0f us after)\n",
                    bytes >> 20, c.name, free_us, alloc_us, total_us, before_sync_us);
        CHECK(cuMemFree(fresh));
      }
    }
  }

  // The other ways memory goes back: pinned host memory (the pinned host
  // pool's evictions) and the expandable arena's unmapped pages.
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t granularity = 0;
  CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  for (const Case& c : cases) {
    for (int round = 0; round < 2; ++round) {
      void* host = nullptr;
      CHECK(cuMemHostAlloc(&host, 2 << 20, 0));
      CUdeviceptr range = 0;
      CHECK(cuMemAddressReserve(&range, granularity, 0, 0, 0));
      CUmemGenericAllocationHandle handle;
      CHECK(cuMemCreate(&handle, granularity, &prop, 0));
      CHECK(cuMemMap(range, granularity, 0, handle, 0));
      CUmemAccessDesc access = {};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CHECK(cuMemSetAccess(range, granularity, &access, 1));
      CHECK(cuCtxSynchronize());
      if (c.stream) kernel.launch_fifty_ms(c.stream);
      auto at = Clock::now();
      CHECK(cuMemFreeHost(host));
      const double free_host_us = us_since(at);
      at = Clock::now();
      CHECK(cuMemUnmap(range, granularity));
      const double unmap_us = us_since(at);
      at = Clock::now();
      CHECK(cuMemRelease(handle));
      const double release_us = us_since(at);
      CHECK(cuMemAddressFree(range, granularity));
      CHECK(cuCtxSynchronize());
      std::printf("kernel on %-20s cuMemFreeHost (2 MiB) %9.1f us  cuMemUnmap %9.1f us  cuMemRelease %9.1f us\n", c.name,
                  free_host_us, unmap_us, release_us);
    }
  }

  // What the pool reads to decide: the legacy stream's query while the
  // kernel runs on each kind of stream (the per-thread one too).
  Case query_cases[] = {{"legacy stream", CU_STREAM_LEGACY}, {"blocking stream", blocking},
                        {"non-blocking stream", non_blocking}, {"per-thread stream", CU_STREAM_PER_THREAD}};
  for (const Case& c : query_cases) {
    kernel.launch_fifty_ms(c.stream);
    const CUresult legacy = cuStreamQuery(CU_STREAM_LEGACY);
    CHECK(cuCtxSynchronize());
    std::printf("kernel on %-20s the legacy stream's query reads %s\n", c.name,
                legacy == CUDA_ERROR_NOT_READY ? "busy" : legacy == CUDA_SUCCESS ? "idle" : "an error");
  }
  return 0;
}
