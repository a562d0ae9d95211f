// While one thread waits in cuMemFree for a busy GPU, do other threads' driver
// calls wait too? probe_free_stall.cpp showed that cuMemFree waits for all
// queued work, on any stream; if the wait holds no lock the others need, the
// pool can hand its give-backs to a thread of its own and never make the
// program's thread wait, whatever stream keeps the GPU busy.
// Part 1: a 50 ms kernel on a non-blocking stream; thread B frees a spare
// with cuMemFree; 2 ms later thread A times the calls a program makes.
// Part 2: idle GPU: thread A's cuMemAlloc alone, then while thread B frees
// blocks in a loop (a lock shared with cuMemFree would show as a slower alloc).
// Part 3: cuMemFreeAsync of a cuMemAlloc block (not documented as allowed).
// Part 4: does an event recorded for the whole context (cuCtxRecordEvent,
// CUDA 12.5) read busy for a kernel on any stream, where the legacy stream's
// query reads idle for one on a non-blocking stream? And what each costs.
// Build and run on the GPU machine:
//   g++ -O2 -std=c++17 -pthread -I/usr/local/cuda/include -o /tmp/probe_free_beside bench/probes/probe_free_beside.cpp
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_free_beside
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <thread>
#include <vector>

#include "spin_kernel.hpp"

using probe::Clock;
using probe::us_since;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int main() {
  const probe::SpinKernel kernel;
  const CUcontext context = kernel.context;
  CUstream busy, other;
  CHECK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));

  // Part 1.
  std::printf("part 1: thread B in cuMemFree behind a 50 ms kernel on a non-blocking stream; thread A meanwhile:\n");
  for (int round = 0; round < 3; ++round) {
    CUdeviceptr spare = 0, kept = 0;
    CHECK(cuMemAlloc(&spare, 64 << 20));
    CHECK(cuMemAlloc(&kept, 2 << 20));
    CHECK(cuCtxSynchronize());
    kernel.launch_fifty_ms(busy);
    std::atomic<bool> freeing{false};
    double free_us = 0;
    std::thread releaser([&] {
      CHECK(cuCtxSetCurrent(context));
      freeing = true;
      const auto at = Clock::now();
      CHECK(cuMemFree(spare));
      free_us = us_since(at);
    });
    while (!freeing) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto at = Clock::now();
    CUdeviceptr fresh = 0;
    CHECK(cuMemAlloc(&fresh, 2 << 20));
    const double alloc_us = us_since(at);
    at = Clock::now();
    kernel.launch(0, other);
    const double launch_us = us_since(at);
    at = Clock::now();
    CHECK(cuEventRecord(event, other));
    const double record_us = us_since(at);
    at = Clock::now();
    const CUresult query = cuStreamQuery(other);
    const double query_us = us_since(at);
    at = Clock::now();
    CHECK(cuMemsetD8Async(kept, 1, 2 << 20, other));
    const double memset_us = us_since(at);
    at = Clock::now();
    CHECK(cuStreamSynchronize(other));
    const double sync_us = us_since(at);
    at = Clock::now();
    CHECK(cuMemFree(fresh));
    const double own_free_us = us_since(at);
    releaser.join();
    CHECK(cuCtxSynchronize());
    CHECK(cuMemFree(kept));
    std::printf("  B's cuMemFree %8.0f us | A: cuMemAlloc %7.1f  cuLaunchKernel %7.1f  cuEventRecord %7.1f  "
                "cuStreamQuery %7.1f (%s)  cuMemsetD8Async %7.1f  cuStreamSynchronize %7.1f  A's own cuMemFree %8.0f us\n",
                free_us, alloc_us, launch_us, record_us, query_us, query == CUDA_SUCCESS ? "done" : "not ready", memset_us,
                sync_us, own_free_us);
  }

  // Part 2.
  std::printf("part 2: idle GPU, thread A's cuMemAlloc (2 MiB) + cuMemFree, median of 200:\n");
  for (int round = 0; round < 2; ++round) {
    auto time_allocs = [&] {
      std::vector<double> times;
      std::vector<CUdeviceptr> blocks(200);
      for (auto& block : blocks) {
        const auto at = Clock::now();
        CHECK(cuMemAlloc(&block, 2 << 20));
        times.push_back(us_since(at));
      }
      for (auto block : blocks) CHECK(cuMemFree(block));
      return median(times);
    };
    const double alone = time_allocs();
    std::vector<CUdeviceptr> to_free(400);
    for (auto& block : to_free) CHECK(cuMemAlloc(&block, 4 << 20));
    std::atomic<bool> stop{false};
    std::size_t freed = 0;
    std::thread releaser([&] {
      CHECK(cuCtxSetCurrent(context));
      while (!stop && freed < to_free.size()) CHECK(cuMemFree(to_free[freed++]));
    });
    const double beside = time_allocs();
    stop = true;
    releaser.join();
    for (std::size_t i = freed; i < to_free.size(); ++i) CHECK(cuMemFree(to_free[i]));
    std::printf("  alone %6.1f us, while thread B frees (it freed %zu) %6.1f us\n", alone, freed, beside);
  }

  // Part 3.
  {
    CUdeviceptr block = 0;
    CHECK(cuMemAlloc(&block, 2 << 20));
    kernel.launch_fifty_ms(busy);
    const auto at = Clock::now();
    const CUresult r = cuMemFreeAsync(block, other);
    const double us = us_since(at);
    const char* name = "?";
    cuGetErrorName(r, &name);
    CHECK(cuCtxSynchronize());
    std::printf("part 3: cuMemFreeAsync of a cuMemAlloc block beside the kernel: %s in %.1f us\n", name, us);
    if (r != CUDA_SUCCESS) CHECK(cuMemFree(block));
  }

  // Part 4.
  {
    CUstream blocking;
    CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    struct Case {
      const char* name;
      CUstream stream;
    } cases[] = {{"legacy stream", CU_STREAM_LEGACY}, {"blocking stream", blocking},
                 {"non-blocking stream", busy}, {"per-thread stream", CU_STREAM_PER_THREAD}, {"none (idle)", nullptr}};
    auto name_of = [](CUresult r) { return r == CUDA_SUCCESS ? "idle" : r == CUDA_ERROR_NOT_READY ? "busy" : "an error"; };
    for (const Case& c : cases) {
      if (c.stream) kernel.launch_fifty_ms(c.stream);
      const CUresult legacy = cuStreamQuery(CU_STREAM_LEGACY);
      std::vector<double> record_times, query_times;
      CUresult whole = CUDA_SUCCESS;
      for (int i = 0; i < 200; ++i) {
        auto at = Clock::now();
        CHECK(cuCtxRecordEvent(context, event));
        record_times.push_back(us_since(at));
        at = Clock::now();
        whole = cuEventQuery(event);
        query_times.push_back(us_since(at));
      }
      std::vector<double> legacy_times;
      for (int i = 0; i < 200; ++i) {
        const auto at = Clock::now();
        (void)cuStreamQuery(CU_STREAM_LEGACY);
        legacy_times.push_back(us_since(at));
      }
      CHECK(cuCtxSynchronize());
      std::printf("part 4: kernel on %-20s legacy stream's query reads %-5s (%.2f us); the context's event reads %-5s "
                  "(cuCtxRecordEvent %.2f us + cuEventQuery %.2f us)\n",
                  c.name, name_of(legacy), median(legacy_times), name_of(whole), median(record_times),
                  median(query_times));
    }
  }
  return 0;
}
