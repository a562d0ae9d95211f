// What does a large block of its own cost the pool, from the driver's
// allocation to its give-back, made with cuMemAlloc/cuMemFree against one
// physical handle mapped into reserved addresses (cuMemCreate, cuMemMap,
// cuMemSetAccess; cuMemUnmap, cuMemRelease)? cuMemFree waits for all queued
// work (probe_free_stall.cpp); cuMemUnmap does not. Random sizes of 4-64 MiB
// (whole 2 MiB pages), with the GPU idle and with a kernel of about 50 us
// queued on one of 4 streams before each block (the pool's
// RandomSizesBesideKernels benchmark queues fills so). Build and run on the
// GPU machine (docs/pool-measurements.md has its figures):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_segment_lifecycle
//     bench/probes/probe_segment_lifecycle.cpp -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_segment_lifecycle
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

#include "spin_kernel.hpp"

using probe::Clock;
using probe::us_since;

namespace {

constexpr std::size_t kPage = std::size_t{2} << 20;
constexpr int kBlocks = 200;

struct Way {
  const char* name;
  // Makes a block of `bytes` and returns its address; `handle` for the give-back.
  CUdeviceptr (*make)(std::size_t bytes, CUmemGenericAllocationHandle* handle, CUdeviceptr reserved);
  void (*give_back)(CUdeviceptr base, std::size_t bytes, CUmemGenericAllocationHandle handle, bool own_range);
  bool own_range;  // reserves and frees its own addresses, not a slice of one reservation
  CUmemAllocationHandleType handle_type;
};

CUmemAllocationHandleType g_handle_type = CU_MEM_HANDLE_TYPE_NONE;

CUdeviceptr make_with_alloc(std::size_t bytes, CUmemGenericAllocationHandle*, CUdeviceptr) {
  CUdeviceptr base = 0;
  CHECK(cuMemAlloc(&base, bytes));
  return base;
}
void give_back_with_free(CUdeviceptr base, std::size_t, CUmemGenericAllocationHandle, bool) { CHECK(cuMemFree(base)); }

CUdeviceptr make_mapped(std::size_t bytes, CUmemGenericAllocationHandle* handle, CUdeviceptr reserved) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = g_handle_type;
  CHECK(cuMemCreate(handle, bytes, &prop, 0));
  CUdeviceptr base = reserved;
  if (!base) CHECK(cuMemAddressReserve(&base, bytes, kPage, 0, 0));
  CHECK(cuMemMap(base, bytes, 0, *handle, 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(base, bytes, &access, 1));
  return base;
}
void give_back_mapped(CUdeviceptr base, std::size_t bytes, CUmemGenericAllocationHandle handle, bool own_range) {
  CHECK(cuMemUnmap(base, bytes));
  CHECK(cuMemRelease(handle));
  if (own_range) CHECK(cuMemAddressFree(base, bytes));
}

}  // namespace

int main() {
  const probe::SpinKernel kernel;
  const unsigned long long fifty_us = kernel.fifty_ms_cycles / 1000;
  std::vector<CUstream> streams(4);
  for (CUstream& stream : streams) CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr window = 0;  // one reservation that the mapped blocks without their own range take slices of
  const std::size_t window_bytes = std::size_t{64} << 30;
  CHECK(cuMemAddressReserve(&window, window_bytes, kPage, 0, 0));

  std::mt19937_64 random(1);
  std::vector<std::size_t> sizes(kBlocks);
  for (std::size_t& bytes : sizes) bytes = (std::uniform_int_distribution<std::size_t>(4 << 20, 64 << 20)(random) + kPage - 1) & ~(kPage - 1);

  const Way ways[] = {
      {"cuMemAlloc + cuMemFree", make_with_alloc, give_back_with_free, true, CU_MEM_HANDLE_TYPE_NONE},
      {"one handle, own range", make_mapped, give_back_mapped, true, CU_MEM_HANDLE_TYPE_NONE},
      {"one handle, slice of a range", make_mapped, give_back_mapped, false, CU_MEM_HANDLE_TYPE_NONE},
      {"one fd handle, slice of a range", make_mapped, give_back_mapped, false, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
  };
  for (int round = 0; round < 3; ++round) {
    for (const bool busy : {false, true}) {
      for (const Way& way : ways) {
        g_handle_type = way.handle_type;
        CHECK(cuCtxSynchronize());
        std::vector<double> make_us, give_back_us;
        const auto start = Clock::now();
        // Up to 8 blocks live at a time, given back oldest first, as the pool's spares go.
        struct Live { CUdeviceptr base; std::size_t bytes; CUmemGenericAllocationHandle handle; };
        std::vector<Live> live;
        std::size_t next_slice = 0;
        for (int i = 0; i < kBlocks; ++i) {
          if (busy) kernel.launch(fifty_us, streams[i % streams.size()]);
          Live block{0, sizes[i], 0};
          auto at = Clock::now();
          CUdeviceptr slice = 0;
          if (!way.own_range) {
            slice = window + next_slice;
            next_slice = (next_slice + (std::size_t{64} << 20)) % window_bytes;
          }
          block.base = way.make(block.bytes, &block.handle, slice);
          make_us.push_back(us_since(at));
          live.push_back(block);
          if (live.size() > 8) {
            at = Clock::now();
            way.give_back(live.front().base, live.front().bytes, live.front().handle, way.own_range);
            give_back_us.push_back(us_since(at));
            live.erase(live.begin());
          }
        }
        const double host_us = us_since(start);
        CHECK(cuCtxSynchronize());
        const double all_us = us_since(start);
        for (const Live& block : live) way.give_back(block.base, block.bytes, block.handle, way.own_range);
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        std::printf("round %d, %-4s %-34s make %7.1f us, give back %7.1f us (medians); host %8.0f us, with the "
                    "GPU's work %8.0f us for %d blocks\n",
                    round, busy ? "busy" : "idle", way.name, median(make_us), median(give_back_us), host_us, all_us,
                    kBlocks);
      }
    }
  }
  CHECK(cuMemAddressFree(window, window_bytes));
  return 0;
}
