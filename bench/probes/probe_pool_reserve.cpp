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

#define CK(x)                                                     \
  do {                                                            \
    CUresult r = (x);                                             \
    if (r) {                                                      \
      const char* s;                                              \
      cuGetErrorName(r, &s);                                      \
      std::printf("%s: %s (line %d)\n", #x, s, __LINE__);         \
      return 1;                                                   \
    }                                                             \
  } while (0)

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
  CK(cuInit(0));
  CUdevice device;
  CK(cuDeviceGet(&device, 0));
  CUcontext context;
  CK(cuDevicePrimaryCtxRetain(&context, device));
  CK(cuCtxSetCurrent(context));
  size_t free0 = 0, total = 0;
  CK(cuMemGetInfo(&free0, &total));
  std::printf("device: %.2f GiB free of %.2f\n", free0 / 1073741824.0, total / 1073741824.0);
  const std::uint64_t kMax = UINT64_MAX;
  CUstream stream;
  CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  std::printf("1. reserved after one live block (threshold max), and after its free + sync:\n");
  for (std::uint64_t size : {std::uint64_t{256}, 64 * 1024 * std::uint64_t{1}, 1 * kMiB, 3 * kMiB, 33 * kMiB, 100 * kMiB}) {
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p;
    CK(cuMemAllocFromPoolAsync(&p, size, pool, stream));
    const std::uint64_t live = reserved(pool);
    CK(cuMemFreeAsync(p, stream));
    CK(cuStreamSynchronize(stream));
    std::printf("   %10llu B: reserved %llu B live, %llu B after (used %llu)\n", (unsigned long long)size,
                (unsigned long long)live, (unsigned long long)reserved(pool), (unsigned long long)used(pool));
    CK(cuMemPoolDestroy(pool));
  }

  std::printf("2. a 1 GiB block freed; reserved and device free (MiB) at each step:\n");
  for (std::uint64_t threshold : {std::uint64_t{0}, 256 * kMiB, kMax}) {
    for (int how = 0; how < 3; ++how) {
      CUmemoryPool pool = make_pool(device, threshold);
      CUdeviceptr p;
      CK(cuMemAllocFromPoolAsync(&p, 1024 * kMiB, pool, stream));
      CK(cuStreamSynchronize(stream));
      const std::uint64_t free_live = device_free();
      CK(cuMemFreeAsync(p, stream));
      const std::uint64_t before = reserved(pool), free_before = device_free();
      CUevent event;
      CK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
      CK(cuEventRecord(event, stream));
      const char* sync = how == 0 ? "stream" : how == 1 ? "event" : "context";
      if (how == 0) CK(cuStreamSynchronize(stream));
      if (how == 1) CK(cuEventSynchronize(event));
      if (how == 2) CK(cuCtxSynchronize());
      std::printf("   threshold %s, %-7s sync: reserved %llu -> %llu, device free %llu -> %llu -> %llu\n",
                  threshold == kMax ? "max" : threshold == 0 ? "0" : "256M", sync,
                  (unsigned long long)(before / kMiB), (unsigned long long)(reserved(pool) / kMiB),
                  (unsigned long long)(free_live / kMiB), (unsigned long long)(free_before / kMiB),
                  (unsigned long long)(device_free() / kMiB));
      // Does a query (no sync) release anything? (Only asked once per threshold.)
      CK(cuEventDestroy(event));
      CK(cuMemPoolDestroy(pool));
    }
  }

  std::printf("3. cuMemPoolTrimTo (threshold max; 4 blocks of 256 MiB freed):\n");
  for (std::uint64_t keep : {std::uint64_t{0}, 100 * kMiB, 300 * kMiB, 2048 * kMiB}) {
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p[4];
    for (auto& q : p) CK(cuMemAllocFromPoolAsync(&q, 256 * kMiB, pool, stream));
    for (auto& q : p) CK(cuMemFreeAsync(q, stream));
    CK(cuStreamSynchronize(stream));
    const std::uint64_t before = reserved(pool);
    CK(cuMemPoolTrimTo(pool, keep));
    std::printf("   keep %llu MiB: reserved %llu -> %llu MiB\n", (unsigned long long)(keep / kMiB),
                (unsigned long long)(before / kMiB), (unsigned long long)(reserved(pool) / kMiB));
    CK(cuMemPoolDestroy(pool));
  }
  {
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p, q;
    CK(cuMemAllocFromPoolAsync(&p, 256 * kMiB, pool, stream));
    CK(cuMemAllocFromPoolAsync(&q, 256 * kMiB, pool, stream));
    CK(cuMemFreeAsync(p, stream));
    CK(cuStreamSynchronize(stream));
    CK(cuMemPoolTrimTo(pool, 0));
    std::printf("   one of two 256 MiB blocks live, trim to 0: reserved %llu MiB, used %llu MiB\n",
                (unsigned long long)(reserved(pool) / kMiB), (unsigned long long)(used(pool) / kMiB));
    CK(cuMemFreeAsync(q, stream));
    CK(cuStreamSynchronize(stream));
    CK(cuMemPoolDestroy(pool));
  }

  std::printf("4. a pool keeps 3/4 of the device's free memory (threshold max, freed, synchronised):\n");
  {
    const std::uint64_t kept_bytes = device_free() / 4 * 3 / (2 * kMiB) * (2 * kMiB);
    CUmemoryPool pool = make_pool(device, kMax);
    CUdeviceptr p;
    CK(cuMemAllocFromPoolAsync(&p, kept_bytes, pool, stream));
    CK(cuMemFreeAsync(p, stream));
    CK(cuStreamSynchronize(stream));
    std::printf("   kept %llu MiB, reserved %llu MiB, device free %llu MiB\n", (unsigned long long)(kept_bytes / kMiB),
                (unsigned long long)(reserved(pool) / kMiB), (unsigned long long)(device_free() / kMiB));
    const std::uint64_t ask = device_free() + kept_bytes / 2;
    CUdeviceptr other = 0;
    CUresult result = cuMemAlloc(&other, ask);
    std::printf("   cuMemAlloc of %llu MiB (free + half the kept): %s; pool reserved after %llu MiB\n",
                (unsigned long long)(ask / kMiB), name(result), (unsigned long long)(reserved(pool) / kMiB));
    if (result == CUDA_SUCCESS) CK(cuMemFree(other));
    CUmemoryPool second = make_pool(device, kMax);
    result = cuMemAllocFromPoolAsync(&other, ask, second, stream);
    if (result == CUDA_SUCCESS) result = cuStreamSynchronize(stream);
    std::printf("   another pool's allocation of %llu MiB: %s; first pool reserved after %llu MiB\n",
                (unsigned long long)(ask / kMiB), name(result), (unsigned long long)(reserved(pool) / kMiB));
    if (result == CUDA_SUCCESS) {
      CK(cuMemFreeAsync(other, stream));
      CK(cuStreamSynchronize(stream));
    }
    CK(cuMemPoolTrimTo(second, 0));
    CK(cuMemPoolDestroy(second));
    cuMemGetInfo(&free0, &total);
    CK(cuMemPoolDestroy(pool));
    std::printf("   after the pools' destruction: device free %llu MiB\n", (unsigned long long)(device_free() / kMiB));
  }

  std::printf("5. a pool keeps many 64 MiB pieces with live blocks between; then one large request:\n");
  {
    CUmemoryPool pool = make_pool(device, kMax);
    const std::uint64_t piece = 64 * kMiB;
    const std::uint64_t count = device_free() / piece * 9 / 10;
    std::vector<CUdeviceptr> blocks(count);
    for (auto& b : blocks) CK(cuMemAllocFromPoolAsync(&b, piece, pool, stream));
    for (std::size_t i = 0; i < blocks.size(); i += 2) CK(cuMemFreeAsync(blocks[i], stream));
    CK(cuStreamSynchronize(stream));
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
    if (result == CUDA_SUCCESS) CK(cuMemFreeAsync(large, stream));
    for (std::size_t i = 1; i < blocks.size(); i += 2) CK(cuMemFreeAsync(blocks[i], stream));
    CK(cuStreamSynchronize(stream));
    CK(cuMemPoolDestroy(pool));
  }
  std::printf("6. cuMemGetAddressRange of pool blocks (base: the block's start, 0 or other):\n");
  for (int exportable = 0; exportable < 2; ++exportable) {
    CUmemPoolProps properties{};
    properties.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
    properties.handleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    CUmemoryPool pool;
    CK(cuMemPoolCreate(&pool, &properties));
    for (std::uint64_t size : {std::uint64_t{80}, std::uint64_t{4096}, kMiB, 64 * kMiB}) {
      CUdeviceptr block;
      CK(cuMemAllocFromPoolAsync(&block, size, pool, stream));
      for (int after_sync = 0; after_sync < 2; ++after_sync) {
        if (after_sync) CK(cuStreamSynchronize(stream));
        const CUdeviceptr asked = block + (after_sync && size > 8 ? 8 : 0);
        CUdeviceptr base = 1;
        size_t length = 1;
        const CUresult result = cuMemGetAddressRange(&base, &length, asked);
        std::printf("   exportable %d, %8llu B, %s: %s, base %s, size %zu\n", exportable, (unsigned long long)size,
                    after_sync ? "synchronised, 8 B inside" : "queued, at its start", name(result),
                    base == block ? "its start" : base == 0 ? "0" : "other", length);
      }
      CK(cuMemFreeAsync(block, stream));
    }
    CK(cuStreamSynchronize(stream));
    CK(cuMemPoolDestroy(pool));
  }
  std::printf("done\n");
  return 0;
}
