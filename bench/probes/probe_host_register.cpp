// What cuMemHostRegister answers for ranges a program should not register:
// sizes that wrap past 2^64, ranges past the end of a mapping or across an
// unmapped hole, read-only pages, unaligned and overlapping ranges. The
// simulated driver answers as the library given runs it, so running this
// against libcuda.so.1 and libcuemm_simdriver.so side by side compares them.
// H100 (driver of CUDA 13, 2026-11-27): 0 for two pages, one byte into them,
// a read-only page with CU_MEMHOSTREGISTER_READ_ONLY, the second page beside
// a registered first and the stack; 712 (already registered) for an overlap;
// 801 (not supported) for 2^63 bytes; 1 (invalid value) for the rest. The
// simulated driver answers the same, but 1 for 2^63 bytes. Zero bytes:
// cuMemHostAlloc succeeds with a null pointer (mapped or not), which
// cuMemFreeHost takes, as it takes nullptr; cuMemAlloc and cuMemAllocManaged
// answer 1. The simulated driver too.
// Build and run (either machine):
//   g++ -O2 -std=c++17 -o /tmp/probe_host_register bench/probes/probe_host_register.cpp -ldl
//   /tmp/probe_host_register libcuda.so.1; /tmp/probe_host_register build/lib/libcuemm_simdriver.so
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

using CUresult = int;
using Init = CUresult (*)(unsigned);
using DeviceGet = CUresult (*)(int*, int);
using Retain = CUresult (*)(void**, int);
using SetCurrent = CUresult (*)(void*);
using Register = CUresult (*)(void*, std::size_t, unsigned);
using Unregister = CUresult (*)(void*);
using HostAlloc = CUresult (*)(void**, std::size_t, unsigned);
using FreeHost = CUresult (*)(void*);
using Alloc = CUresult (*)(unsigned long long*, std::size_t);
using AllocManaged = CUresult (*)(unsigned long long*, std::size_t, unsigned);

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "libcuda.so.1";
  void* library = dlopen(path, RTLD_NOW);
  if (!library) {
    std::printf("cannot load %s: %s\n", path, dlerror());
    return 1;
  }
  auto get = [&](const char* name) {
    void* symbol = dlsym(library, name);
    if (!symbol) {
      std::printf("%s lacks %s\n", path, name);
      std::exit(1);
    }
    return symbol;
  };
  auto init = reinterpret_cast<Init>(get("cuInit"));
  auto device_get = reinterpret_cast<DeviceGet>(get("cuDeviceGet"));
  auto retain = reinterpret_cast<Retain>(get("cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<SetCurrent>(get("cuCtxSetCurrent"));
  auto register_host = reinterpret_cast<Register>(get("cuMemHostRegister_v2"));
  auto unregister_host = reinterpret_cast<Unregister>(get("cuMemHostUnregister"));
  int device = 0;
  void* context = nullptr;
  if (init(0) || device_get(&device, 0) || retain(&context, device) || set_current(context)) {
    std::printf("no context\n");
    return 1;
  }
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto map = [&](std::size_t bytes, int protection) {
    void* memory = mmap(nullptr, bytes, protection, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return static_cast<char*>(memory);
  };
  auto attempt = [&](const char* what, void* pointer, std::size_t size, unsigned flags = 0) {
    const CUresult result = register_host(pointer, size, flags);
    std::printf("%-58s %d\n", what, result);
    if (result == 0) unregister_host(pointer);
  };
  char* two_pages = map(2 * page, PROT_READ | PROT_WRITE);
  attempt("two pages", two_pages, 2 * page);
  attempt("two pages, size 2^64-1", two_pages, SIZE_MAX);
  attempt("two pages, size 2^63", two_pages, std::size_t{1} << 63);
  attempt("two pages, 1 GiB from them (past the mapping)", two_pages, std::size_t{1} << 30);
  attempt("two pages, three pages from them", two_pages, 3 * page);
  attempt("one byte into them, 100 bytes", two_pages + 1, 100);
  char* holed = map(3 * page, PROT_READ | PROT_WRITE);
  munmap(holed + page, page);
  attempt("three pages whose middle one is unmapped", holed, 3 * page);
  char* read_only = map(page, PROT_READ);
  attempt("a read-only page", read_only, page);
  attempt("a read-only page, CU_MEMHOSTREGISTER_READ_ONLY", read_only, page, 0x08);
  char* no_access = map(page, PROT_NONE);
  attempt("a page with no access", no_access, page);
  attempt("flags 0x10 (unknown)", two_pages, page, 0x10);
  const CUresult first = register_host(two_pages, page, 0);
  attempt("the second page while the first is registered", two_pages + page, page);
  attempt("both pages while the first is registered", two_pages, 2 * page);
  if (first == 0) unregister_host(two_pages);
  int on_stack[1024];
  attempt("4 KiB of the stack", on_stack, sizeof on_stack);
  attempt("null, one page", nullptr, page);
  attempt("two pages, size 0", two_pages, 0);

  // Zero bytes from the allocating calls.
  auto host_alloc = reinterpret_cast<HostAlloc>(get("cuMemHostAlloc"));
  auto free_host = reinterpret_cast<FreeHost>(get("cuMemFreeHost"));
  auto alloc = reinterpret_cast<Alloc>(get("cuMemAlloc_v2"));
  auto alloc_managed = reinterpret_cast<AllocManaged>(get("cuMemAllocManaged"));
  for (const unsigned flags : {0u, 2u}) {
    void* host = reinterpret_cast<void*>(1);
    const CUresult result = host_alloc(&host, 0, flags);
    std::printf("%-58s %d (pointer %s)\n", flags ? "cuMemHostAlloc of 0 bytes, mapped" : "cuMemHostAlloc of 0 bytes",
                result, host ? "not null" : "null");
    if (result == 0) std::printf("%-58s %d\n", "  cuMemFreeHost of it", free_host(host));
  }
  std::printf("%-58s %d\n", "cuMemFreeHost(nullptr)", free_host(nullptr));
  unsigned long long block = 0;
  std::printf("%-58s %d\n", "cuMemAlloc of 0 bytes", alloc(&block, 0));
  std::printf("%-58s %d\n", "cuMemAllocManaged of 0 bytes", alloc_managed(&block, 0, 1));
  return 0;
}
