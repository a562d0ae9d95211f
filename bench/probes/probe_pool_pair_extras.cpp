// What the async manager adds to the driver's stream-ordered pool, call by
// call, from 1 and 16 threads. The driver's pool answers one thread at a
// time; do the calls around each pair (cuCtxGetCurrent, which ScopedContext
// makes for every request and free; a mutex of one shard of the record) wait
// in that same line? Pairs on the per-thread stream, from a pool of the
// probe's own (release threshold max), 1 MiB blocks:
//   plain          cuMemAllocFromPoolAsync + cuMemFreeAsync
//   +current       the same with cuCtxGetCurrent before each of the two calls
//   +lock          the same with a lock of one of 64 mutexes around each
// Build and run on the GPU machine (docs/pool-measurements.md has its figures):
//   g++ -O2 -std=c++17 -pthread -I/usr/local/cuda/include -o /tmp/probe_pool_pair_extras
//     bench/probes/probe_pool_pair_extras.cpp -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_pool_pair_extras
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "spin_kernel.hpp"

namespace {

enum class Extra { plain, current, lock };
const char* name(Extra extra) { return extra == Extra::plain ? "plain" : extra == Extra::current ? "+current" : "+lock"; }

struct alignas(64) Shard {
  std::mutex mutex;
};
std::array<Shard, 64> shards;

// ns a pair in aggregate: `threads` threads, `pairs` pairs each.
double run(CUcontext context, CUmemoryPool pool, Extra extra, int threads, int pairs) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      CHECK(cuCtxSetCurrent(context));
      ready.fetch_add(1);
      while (!go.load()) {
      }
      for (int i = 0; i < pairs; ++i) {
        CUdeviceptr pointer = 0;
        CUcontext current = nullptr;
        if (extra == Extra::current) CHECK(cuCtxGetCurrent(&current));
        CHECK(cuMemAllocFromPoolAsync(&pointer, 1 << 20, pool, CU_STREAM_PER_THREAD));
        if (extra == Extra::lock) std::lock_guard guard(shards[(pointer >> 8) * 0x9E3779B97F4A7C15ull >> 58].mutex);
        if (extra == Extra::current) CHECK(cuCtxGetCurrent(&current));
        if (extra == Extra::lock) std::lock_guard guard(shards[(pointer >> 8) * 0x9E3779B97F4A7C15ull >> 58].mutex);
        CHECK(cuMemFreeAsync(pointer, CU_STREAM_PER_THREAD));
      }
      CHECK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    });
  }
  while (ready.load() < threads) {
  }
  const auto start = probe::Clock::now();
  go = true;
  for (auto& worker : workers) worker.join();
  return probe::us_since(start) * 1000.0 / (static_cast<double>(threads) * pairs);
}

}  // namespace

int main() {
  CUdevice device;
  const CUcontext context = probe::use_primary_context(&device);
  CUmemPoolProps properties = {};
  properties.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  CUmemoryPool pool;
  CHECK(cuMemPoolCreate(&pool, &properties));
  unsigned long long threshold = ~0ull;
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  run(context, pool, Extra::plain, 16, 2000);  // (warm: the pool's memory, the threads' streams)
  for (int round = 0; round < 3; ++round) {
    for (const int threads : {1, 16}) {
      std::printf("round %d, %2d thread(s):", round, threads);
      for (const Extra extra : {Extra::plain, Extra::current, Extra::lock})
        std::printf("  %-8s %7.0f ns", name(extra), run(context, pool, extra, threads, threads == 1 ? 20000 : 4000));
      std::printf("\n");
    }
  }
  CHECK(cuMemPoolDestroy(pool));
  return 0;
}
