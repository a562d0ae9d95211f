// Which device memory a kernel on another GPU may use once peer access is
// enabled, on the real driver: cuMemAlloc's, memory mapped by cuMemMap (the
// pool's expandable arena) and the driver's stream-ordered pool (the async
// manager), each granted to its own device only or to the peer as well; and
// what granting the peer costs. Each case runs in a child process, since a
// kernel's illegal address leaves its context unusable.
// Build and run on a machine with two GPUs (docs/peer-access.md has its figures):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_peer bench/probes/probe_peer.cpp \
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_peer kernels/test_kernels.ptx
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
std::string ptx;

const char* name_of(CUresult result) {
  const char* name = "?";
  cuGetErrorName(result, &name);
  return name;
}
#define CK(x)                                                           \
  do {                                                                  \
    if (CUresult r = (x); r != CUDA_SUCCESS) {                          \
      std::printf("    %s: %s\n", #x, name_of(r));                      \
      return 2;                                                         \
    }                                                                   \
  } while (0)

constexpr std::size_t kBytes = std::size_t{2} << 20;
constexpr unsigned kWords = kBytes / 4;

struct Devices {
  CUdevice device[2];
  CUcontext context[2];
};

int open_both(Devices& d, bool enable_peer) {
  CK(cuInit(0));
  for (int i = 0; i < 2; ++i) {
    CK(cuDeviceGet(&d.device[i], i));
    CK(cuDevicePrimaryCtxRetain(&d.context[i], d.device[i]));
  }
  if (enable_peer) {
    CK(cuCtxSetCurrent(d.context[1]));
    CK(cuCtxEnablePeerAccess(d.context[0], 0));
  }
  return 0;
}

CUmemAccessDesc grant(int device) {
  CUmemAccessDesc access{};
  access.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

// Device 0's memory at `p` holds ones; a kernel on device 1 adds 5; the
// host reads sixes back, or the launch or its synchronisation fails.
int add_from_device_1(const Devices& d, CUdeviceptr p) {
  CK(cuCtxSetCurrent(d.context[0]));
  CK(cuMemsetD32(p, 1, kWords));
  CK(cuCtxSynchronize());
  CK(cuCtxSetCurrent(d.context[1]));
  CUmodule module;
  CUfunction add;
  CK(cuModuleLoadData(&module, ptx.c_str()));
  CK(cuModuleGetFunction(&add, module, "cuemm_add_u32"));
  unsigned value = 5;
  unsigned long long count = kWords;
  void* parameters[] = {&p, &value, &count};
  CK(cuLaunchKernel(add, 64, 1, 1, 256, 1, 1, 0, nullptr, parameters, nullptr));
  CK(cuCtxSynchronize());
  std::vector<unsigned> host(kWords);
  CK(cuMemcpyDtoH(host.data(), p, kBytes));
  const auto wrong = std::count_if(host.begin(), host.end(), [](unsigned v) { return v != 6; });
  std::printf("    kernel on device 1: %s\n", wrong ? "wrong values" : "ok");
  return wrong ? 1 : 0;
}

// Device 1 copies device 0's memory at `p` into its own.
int copy_to_device_1(const Devices& d, CUdeviceptr p) {
  CK(cuCtxSetCurrent(d.context[1]));
  CUdeviceptr mine;
  CK(cuMemAlloc(&mine, kBytes));
  CK(cuMemcpyDtoD(mine, p, kBytes));
  CK(cuCtxSynchronize());
  std::printf("    cuMemcpyDtoD to device 1 from device 1's context: ok\n");
  return 0;
}

int mapped(const Devices& d, bool grant_peer, bool copy) {
  CK(cuCtxSetCurrent(d.context[0]));
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemGenericAllocationHandle handle;
  CUdeviceptr p;
  CK(cuMemCreate(&handle, kBytes, &properties, 0));
  CK(cuMemAddressReserve(&p, kBytes, 0, 0, 0));
  CK(cuMemMap(p, kBytes, 0, handle, 0));
  const CUmemAccessDesc access[2] = {grant(0), grant(1)};
  CK(cuMemSetAccess(p, kBytes, access, grant_peer ? 2 : 1));
  return copy ? copy_to_device_1(d, p) : add_from_device_1(d, p);
}

int pooled(const Devices& d, bool grant_peer, bool copy) {
  CK(cuCtxSetCurrent(d.context[0]));
  CUmemPoolProps properties{};
  properties.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemoryPool pool;
  CK(cuMemPoolCreate(&pool, &properties));
  if (grant_peer) {
    const CUmemAccessDesc access = grant(1);
    CK(cuMemPoolSetAccess(pool, &access, 1));
  }
  CUdeviceptr p;
  CK(cuMemAllocFromPoolAsync(&p, kBytes, pool, nullptr));
  CK(cuCtxSynchronize());
  return copy ? copy_to_device_1(d, p) : add_from_device_1(d, p);
}

int allocated(const Devices& d, bool copy) {
  CK(cuCtxSetCurrent(d.context[0]));
  CUdeviceptr p;
  CK(cuMemAlloc(&p, kBytes));
  return copy ? copy_to_device_1(d, p) : add_from_device_1(d, p);
}

template <typename Case>
void in_child(const char* title, Case run) {
  std::printf("%s\n", title);
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    Devices d;
    int status = open_both(d, true);
    if (status == 0) status = run(d);
    std::fflush(stdout);
    _exit(status);
  }
  int status = 0;
  waitpid(child, &status, 0);
}

// Median microseconds of cuMemSetAccess on `bytes` freshly mapped, for 1 or 2 devices.
int time_set_access() {
  Devices d;
  if (open_both(d, false) != 0) return 2;
  CK(cuCtxSetCurrent(d.context[0]));
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  const CUmemAccessDesc access[2] = {grant(0), grant(1)};
  for (std::size_t mib : {2, 64}) {
    const std::size_t bytes = mib << 20;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr p;
    CK(cuMemCreate(&handle, bytes, &properties, 0));
    CK(cuMemAddressReserve(&p, bytes, 0, 0, 0));
    for (int devices : {1, 2}) {
      std::vector<double> times;
      for (int i = 0; i < 31; ++i) {
        CK(cuMemMap(p, bytes, 0, handle, 0));
        const auto began = clk::now();
        CK(cuMemSetAccess(p, bytes, access, devices));
        times.push_back(std::chrono::duration<double, std::micro>(clk::now() - began).count());
        CK(cuMemUnmap(p, bytes));
      }
      std::sort(times.begin(), times.end());
      std::printf("cuMemSetAccess of %zu MiB for %d device(s): %.1f us (median of 31)\n", mib, devices, times[15]);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: probe_peer kernels/test_kernels.ptx\n");
    return 2;
  }
  std::ifstream file(argv[1]);
  std::stringstream text;
  text << file.rdbuf();
  ptx = text.str();
  const pid_t child = fork();
  if (child == 0) {  // the parent stays without CUDA, so that it can fork the cases
    int count = 0, one_to_zero = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2) {
      std::printf("needs two devices (found %d)\n", count);
      std::fflush(stdout);
      _exit(3);
    }
    cuDeviceCanAccessPeer(&one_to_zero, 1, 0);
    std::printf("%d devices; device 1 can access device 0: %d\n", count, one_to_zero);
    std::fflush(stdout);
    _exit(one_to_zero ? 0 : 3);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 0;
  std::printf("Peer access enabled from device 1 to device 0 in every case below.\n");
  in_child("cuMemAlloc on device 0:", [](const Devices& d) { return allocated(d, false); });
  in_child("cuMemMap on device 0, access granted to device 0 and 1:", [](const Devices& d) { return mapped(d, true, false); });
  in_child("cuMemMap on device 0, access granted to device 0 only:", [](const Devices& d) { return mapped(d, false, false); });
  in_child("  the same, copied by device 1:", [](const Devices& d) { return mapped(d, false, true); });
  in_child("driver pool of device 0, access granted to device 1:", [](const Devices& d) { return pooled(d, true, false); });
  in_child("driver pool of device 0, no access granted:", [](const Devices& d) { return pooled(d, false, false); });
  in_child("  the same, copied by device 1:", [](const Devices& d) { return pooled(d, false, true); });
  const pid_t timer = fork();
  if (timer == 0) _exit(time_set_access());
  waitpid(timer, &status, 0);
  return 0;
}
