// What a stream-ordered pool (cuMemPoolCreate) keeps of the memory freed into
// it, when it gives it back, and whether memory it keeps is lost to others:
// the facts the simulated driver's pools follow (sim/api/stream_ordered_pools.cpp).
//  1. The step of its reserve: reserved after one block of each size.
//  2. Freed with the release threshold at 0 and at its maximum: reserved before
//     and after a synchronisation (stream, event, context), cuMemGetInfo's free.
//  3. cuMemPoolTrimTo with bytes to keep.
//  4. A pool's kept memory against cuMemAlloc and against another pool: does
//     the driver take it back for them, or do they run out of memory?
//  5. A pool whose kept memory is in pieces: does a larger request reuse it?
//  6. cuMemGetAddressRange of a pool's block (exportable or not, before and
//     after its allocation ran, at its start and inside it).
// Build and run on the GPU machine:
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_pool_reserve bench/probes/probe_pool_reserve.cpp
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_pool_reserve
// (On the simulated driver: link build/lib/libcuemm_simdriver.so in place of -lcuda.)
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "spin_kernel.hpp"  // CHECK, use_primary_context

namespace {
constexpr std::uint64_t kMiB = 1 << 20;

std::uint64_t reserved(CUmemoryPool pool) {
  std::uint64_t value = 0;
  cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &value);
  return value;
}
std::uint64_t used(CUmemoryPool pool) {
  std::uint64_t value = 0;
  cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &value);
  return value;
}
std::uint64_t device_free() {
  size_t free = 0, total = 0;
  cuMemGetInfo(&free, &total);
  return free;
}
const char* name(CUresult result) {
  const char* text = "?";
  cuGetErrorName(result, &text);
  return text;
}
CUmemoryPool make_pool(CUdevice device, std::uint64_t threshold) {
  CUmemPoolProps properties{};
  properties.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  CUmemoryPool pool = nullptr;
  if (cuMemPoolCreate(&pool, &properties) != CUDA_SUCCESS) return nullptr;
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
  return pool;
}
}  // namespace

int main() {
  CUdevice device;
  probe::use_primary_context(&device);
  size_t free0 = 0, total = 0;
  CHECK(cuMemGetInfo(&free0, &total));
  std::printf("device: %.2f GiB free of %.2f\n", free0 / 1073741824.0, total / 1073741824.0);
  const std::uint64_t kMax = UINT64_MAX;
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  std::printf("1. reserved after one live block (threshold max), and after its free + sync:\n");
  for (std::uint64_t size : {std::uint64_t{256}, 64 * 1024 * std::uint64_t{1}, 1 * kMiB, 3 * kMiB, 33 * kMiB, 100 * kMiB}) {
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p;
    CHECK(cuMemAllocFromPoolAsync(&p, size, pool, stream));
    const std::uint64_t live = reserved(pool);
    CHECK(cuMemFreeAsync(p, stream));
    CHECK(cuStreamSynchronize(stream));
    std::printf("   %10llu B: reserved %llu B live, %llu B after (used %llu)\n", (unsigned long long)size,
                (unsigned long long)live, (unsigned long long)reserved(pool), (unsigned long long)used(pool));
    CHECK(cuMemPoolDestroy(pool));
  }

  std::printf("2. a 1 GiB block freed; reserved and device free (MiB) at each step:\n");
  for (std::uint64_t threshold : {std::uint64_t{0}, 256 * kMiB, kMax}) {
    for (int how = 0; how < 3; ++how) {
      CUmemoryPool pool = make_pool(device, threshold);
      CUdeviceptr p;
      CHECK(cuMemAllocFromPoolAsync(&p, 1024 * kMiB, pool, stream));
      CHECK(cuStreamSynchronize(stream));
      const std::uint64_t free_live = device_free();
      CHECK(cuMemFreeAsync(p, stream));
      const std::uint64_t before = reserved(pool), free_before = device_free();
      CUevent event;
      CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
      CHECK(cuEventRecord(event, stream));
      const char* sync = how == 0 ? "stream" : how == 1 ? "event" : "context";
      if (how == 0) CHECK(cuStreamSynchronize(stream));
      if (how == 1) CHECK(cuEventSynchronize(event));
      if (how == 2) CHECK(cuCtxSynchronize());
      std::printf("   threshold %s, %-7s sync: reserved %llu -> %llu, device free %llu -> %llu -> %llu\n",
                  threshold == kMax ? "max" : threshold == 0 ? "0" : "256M", sync,
                  (unsigned long long)(before / kMiB), (unsigned long long)(reserved(pool) / kMiB),
                  (unsigned long long)(free_live / kMiB), (unsigned long long)(free_before / kMiB),
                  (unsigned long long)(device_free() / kMiB));
      // Does a query (no sync) release anything? (Only asked once per threshold.)
      CHECK(cuEventDestroy(event));
      CHECK(cuMemPoolDestroy(pool));
    }
  }

  std::printf("3. cuMemPoolTrimTo (threshold max; 4 blocks of 256 MiB freed):\n");
  for (std::uint64_t keep : {std::uint64_t{0}, 100 * kMiB, 300 * kMiB, 2048 * kMiB}) {
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p[4];
    for (auto& q : p) CHECK(cuMemAllocFromPoolAsync(&q, 256 * kMiB, pool, stream));
    for (auto& q : p) CHECK(cuMemFreeAsync(q, stream));
    CHECK(cuStreamSynchronize(stream));
    const std::uint64_t before = reserved(pool);
    CHECK(cuMemPoolTrimTo(pool, keep));
    std::printf("   keep %llu MiB: reserved %llu -> %llu MiB\n", (unsigned long long)(keep / kMiB),
                (unsigned long long)(before / kMiB), (unsigned long long)(reserved(pool) / kMiB));
    CHECK(cuMemPoolDestroy(pool));
  }
  {
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p, q;
    CHECK(cuMemAllocFromPoolAsync(&p, 256 * kMiB, pool, stream));
    CHECK(cuMemAllocFromPoolAsync(&q, 256 * kMiB, pool, stream));
    CHECK(cuMemFreeAsync(p, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemPoolTrimTo(pool, 0));
    std::printf("   one of two 256 MiB blocks live, trim to 0: reserved %llu MiB, used %llu MiB\n",
                (unsigned long long)(reserved(pool) / kMiB), (unsigned long long)(used(pool) / kMiB));
    CHECK(cuMemFreeAsync(q, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemPoolDestroy(pool));
  }

  std::printf("4. a pool keeps 3/4 of the device's free memory (threshold max, freed, synchronised):\n");
  {
    const std::uint64_t kept_bytes = device_free() / 4 * 3 / (2 * kMiB) * (2 * kMiB);
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p;
    CHECK(cuMemAllocFromPoolAsync(&p, kept_bytes, pool, stream));
    CHECK(cuMemFreeAsync(p, stream));
    CHECK(cuStreamSynchronize(stream));
    std::printf("   kept %llu MiB, reserved %llu MiB, device free %llu MiB\n", (unsigned long long)(kept_bytes / kMiB),
                (unsigned long long)(reserved(pool) / kMiB), (unsigned long long)(device_free() / kMiB));
    const std::uint64_t ask = device_free() + kept_bytes / 2;
    CUdeviceptr other = 0;
    CUresult result = cuMemAlloc(&other, ask);
    std::printf("   cuMemAlloc of %llu MiB (free + half the kept): %s; pool reserved after %llu MiB\n",
                (unsigned long long)(ask / kMiB), name(result), (unsigned long long)(reserved(pool) / kMiB));
    if (result == CUDA_SUCCESS) CHECK(cuMemFree(other));
    CUmemoryPool second = make_pool(device, kMax);
    result = cuMemAllocFromPoolAsync(&other, ask, second, stream);
    if (result == CUDA_SUCCESS) result = cuStreamSynchronize(stream);
    std::printf("   another pool's allocation of %llu MiB: %s; first pool reserved after %llu MiB\n",
                (unsigned long long)(ask / kMiB), name(result), (unsigned long long)(reserved(pool) / kMiB));
    if (result == CUDA_SUCCESS) {
      CHECK(cuMemFreeAsync(other, stream));
      CHECK(cuStreamSynchronize(stream));
    }
    CHECK(cuMemPoolTrimTo(second, 0));
    CHECK(cuMemPoolDestroy(second));
    cuMemGetInfo(&free0, &total);
    CHECK(cuMemPoolDestroy(pool));
    std::printf("   after the pools' destruction: device free %llu MiB\n", (unsigned long long)(device_free() / kMiB));
  }

  std::printf("5. a pool keeps many 64 MiB pieces with live blocks between; then one large request:\n");
  {
    CUmemoryPool pool = make_pool(device, kMax);
    const std::uint64_t piece = 64 * kMiB;
    const std::uint64_t count = device_free() / piece * 9 / 10;
    std::vector<CUdeviceptr> blocks(count);
    for (auto& b : blocks) CHECK(cuMemAllocFromPoolAsync(&b, piece, pool, stream));
    for (std::size_t i = 0; i < blocks.size(); i += 2) CHECK(cuMemFreeAsync(blocks[i], stream));
    CHECK(cuStreamSynchronize(stream));
    const std::uint64_t held = reserved(pool) - used(pool);
    const std::uint64_t ask = device_free() + held / 2;
    std::printf("   %llu pieces, reserved %llu MiB, used %llu MiB, device free %llu MiB\n",
                (unsigned long long)count, (unsigned long long)(reserved(pool) / kMiB),
                (unsigned long long)(used(pool) / kMiB), (unsigned long long)(device_free() / kMiB));
    CUdeviceptr large = 0;
    CUresult result = cuMemAllocFromPoolAsync(&large, ask, pool, stream);
    if (result == CUDA_SUCCESS) result = cuStreamSynchronize(stream);
    std::printf("   the same pool's request of %llu MiB (free + half its kept pieces): %s; reserved %llu MiB\n",
                (unsigned long long)(ask / kMiB), name(result), (unsigned long long)(reserved(pool) / kMiB));
    if (result == CUDA_SUCCESS) CHECK(cuMemFreeAsync(large, stream));
    for (std::size_t i = 1; i < blocks.size(); i += 2) CHECK(cuMemFreeAsync(blocks[i], stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemPoolDestroy(pool));
  }
  std::printf("6. cuMemGetAddressRange of pool blocks (base: the block's start, 0 or other):\n");
  for (int exportable = 0; exportable < 2; ++exportable) {
    CUmemPoolProps properties{};
    properties.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
    properties.handleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &properties));
    for (std::uint64_t size : {std::uint64_t{80}, std::uint64_t{4096}, kMiB, 64 * kMiB}) {
      CUdeviceptr block;
      CHECK(cuMemAllocFromPoolAsync(&block, size, pool, stream));
      for (int after_sync = 0; after_sync < 2; ++after_sync) {
        if (after_sync) CHECK(cuStreamSynchronize(stream));
        const CUdeviceptr asked = block + (after_sync && size > 8 ? 8 : 0);
        CUdeviceptr base = 1;
        size_t length = 1;
        const CUresult result = cuMemGetAddressRange(&base, &length, asked);
        std::printf("   exportable %d, %8llu B, %s: %s, base %s, size %zu\n", exportable, (unsigned long long)size,
                    after_sync ? "synchronised, 8 B inside" : "queued, at its start", name(result),
                    base == block ? "its start" : base == 0 ? "0" : "other", length);
      }
      CHECK(cuMemFreeAsync(block, stream));
    }
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemPoolDestroy(pool));
  }
  std::printf("done\n");
  return 0;
}
