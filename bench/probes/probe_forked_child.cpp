// What libcuda answers a child forked after the parent called cuInit (and
// made a context and a block), and a child forked before the parent's
// first call: the simulated driver must answer the same (sim_state.hpp,
// forked_after_init) for cuemm's refusal in such a child to be tested in CI.
// Build and run on the GPU machine:
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include -o /tmp/probe_forked_child bench/probes/probe_forked_child.cpp
//     -L/usr/local/cuda/lib64/stubs -lcuda && /tmp/probe_forked_child
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

namespace {

// In a child: the codes of the calls a memory manager makes, one line.
void calls_in_child(const char* when, CUcontext parents_context, CUdeviceptr parents_block) {
  int version = 0, count = -1;
  CUcontext current = nullptr;
  CUdeviceptr block = 0;
  std::size_t free_bytes = 0, total = 0;
  const CUresult init = cuInit(0);
  const CUresult get_version = cuDriverGetVersion(&version);
  const CUresult device_count = cuDeviceGetCount(&count);
  const CUresult get_current = cuCtxGetCurrent(&current);
  const CUresult set_current = parents_context ? cuCtxSetCurrent(parents_context) : CUDA_SUCCESS;
  const CUresult alloc = cuMemAlloc(&block, 4096);
  const CUresult info = cuMemGetInfo(&free_bytes, &total);
  const CUresult free_parents = parents_block ? cuMemFree(parents_block) : CUDA_SUCCESS;
  const char* name = nullptr;
  const CUresult error_name = cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name);
  std::printf("%s: cuInit %d, cuDriverGetVersion %d (%d), cuDeviceGetCount %d (%d), cuCtxGetCurrent %d, "
              "cuCtxSetCurrent(parent's) %d, cuMemAlloc %d, cuMemGetInfo %d, cuMemFree(parent's block) %d, "
              "cuGetErrorName %d\n",
              when, init, get_version, version, device_count, count, get_current, set_current, alloc, info,
              free_parents, error_name);
  std::fflush(stdout);
}

void in_child(const char* when, CUcontext context, CUdeviceptr block) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    calls_in_child(when, context, block);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
}

}  // namespace

int main() {
  in_child("forked before the parent's first call", nullptr, 0);
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  in_child("forked after cuInit", nullptr, 0);
  CUdevice device;
  CUcontext context;
  cuDeviceGet(&device, 0);
  cuDevicePrimaryCtxRetain(&context, device);
  cuCtxSetCurrent(context);
  CUdeviceptr block = 0;
  cuMemAlloc(&block, 1 << 20);
  in_child("forked with a context and a block", context, block);
  std::printf("parent afterwards: cuMemFree %d\n", cuMemFree(block));
  return 0;
}
