// sim/api/modules.cpp: the simulated driver's modules, functions and kernel
// launches.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

namespace {
// Finds the names of the kernels a PTX text defines (".entry name(").
std::set<std::string> ptx_entries(const char* text) {
  std::set<std::string> entries;
  const std::string ptx(text);
  for (std::size_t at = ptx.find(".entry"); at != std::string::npos; at = ptx.find(".entry", at + 6)) {
    std::size_t begin = at + 6;
    while (begin < ptx.size() && std::isspace(static_cast<unsigned char>(ptx[begin]))) ++begin;
    std::size_t end = begin;
    while (end < ptx.size() && (std::isalnum(static_cast<unsigned char>(ptx[end])) || ptx[end] == '_' ||
                                ptx[end] == '$' || ptx[end] == '.'))
      ++end;
    if (end > begin) entries.insert(ptx.substr(begin, end - begin));
  }
  return entries;
}

CUresult load_module(Fn entry, CUmodule* out, const void* image) {
  SIM_BEGIN_AS(entry);
  SIM_CONTEXT();
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  const char* text = static_cast<const char*>(image);
  if (std::memcmp(text, "\x7f" "ELF", 4) == 0) return CUDA_ERROR_NOT_SUPPORTED;  // cubins: no
  if (!std::strstr(text, ".version") || !std::strstr(text, ".target")) return CUDA_ERROR_INVALID_PTX;
  auto module = std::make_unique<Module>();
  module->context = context;
  module->entries = ptx_entries(text);
  *out = reinterpret_cast<CUmodule>(module.get());
  s.modules.emplace(module.get(), std::move(module));
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuModuleLoadData(CUmodule* out, const void* image) {
  return load_module(Fn::cuModuleLoadData, out, image);
}

SIM_EXPORT CUresult cuModuleLoadDataEx(CUmodule* out, const void* image, unsigned, int*, void**) {
  return load_module(Fn::cuModuleLoadDataEx, out, image);
}

SIM_EXPORT CUresult cuModuleUnload(CUmodule handle) {
  SIM_BEGIN(cuModuleUnload);
  auto it = s.modules.find(reinterpret_cast<Module*>(handle));
  if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& function : it->second->functions) s.functions.erase(function.second.get());
  s.modules.erase(it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetFunction(CUfunction* out, CUmodule handle, const char* name) {
  SIM_BEGIN(cuModuleGetFunction);
  auto it = s.modules.find(reinterpret_cast<Module*>(handle));
  if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
  Module& module = *it->second;
  if (!module.entries.count(name)) return CUDA_ERROR_NOT_FOUND;
  auto& function = module.functions[name];
  if (!function) {
    function = std::make_unique<Function>(Function{&module, name});
    s.functions.emplace(function.get(), &module);
  }
  *out = reinterpret_cast<CUfunction>(function.get());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr*, std::size_t*, CUmodule handle, const char*) {
  SIM_BEGIN(cuModuleGetGlobal);
  if (!s.modules.count(reinterpret_cast<Module*>(handle))) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_ERROR_NOT_FOUND;  // module globals are not simulated
}

namespace {
// Whether kernels of `device` may use `memory`: its own device's memory; a peer's
// cuMemAlloc memory once peer access is enabled; a driver pool's and mapped
// memory only where granted (cuMemPoolSetAccess, cuMemSetAccess), as on a GPU.
// Host and managed memory, and memory opened from another process, every device may use.
bool reachable_from(const State& s, const Allocation& memory, int device) {
  switch (memory.kind) {
    case AllocationKind::Device:
      if (memory.device == device) return true;
      if (memory.pool) return memory.pool->peers_granted.count(device) != 0;
      return s.devices[device]->peers_enabled.count(memory.device) != 0;
    case AllocationKind::VirtualMapping: return memory.granted.count(device) != 0;
    default: return true;
  }
}
}  // namespace

SIM_EXPORT CUresult cuLaunchKernel(CUfunction handle, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream stream, void** params, void** extra) {
  SIM_BEGIN(cuLaunchKernel);
  auto* function = reinterpret_cast<Function*>(handle);
  if (!s.functions.count(function)) return CUDA_ERROR_INVALID_HANDLE;
  const EmulatedKernel* kernel = find_emulated_kernel(function->name);
  if (!kernel || extra) {
    std::fprintf(stderr, "cuemm simulated driver: kernel '%s' cannot run here (no host emulation)\n",
                 function->name.c_str());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!params && !kernel->parameter_sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
  SIM_STREAM(queue, stream);
  const int device = queue->context()->device->ordinal;
  // Parameters are copied now: the caller may reuse its storage at once.
  std::vector<std::vector<char>> copies;
  for (std::size_t i = 0; i < kernel->parameter_sizes.size(); ++i) {
    const char* bytes = static_cast<const char*>(params[i]);
    copies.emplace_back(bytes, bytes + kernel->parameter_sizes[i]);
    std::uintptr_t address = 0;
    if (copies.back().size() != sizeof address) continue;
    std::memcpy(&address, bytes, sizeof address);
    if (const Allocation* memory = s.find(address); memory && !reachable_from(s, *memory, device)) {
      // A GPU faults in the kernel, and the error comes at the next synchronisation.
      std::fprintf(stderr,
                   "cuemm simulated driver: kernel '%s' on device %d was given %#llx, memory of device %d "
                   "that device %d may not use\n",
                   function->name.c_str(), device, static_cast<unsigned long long>(address), memory->device, device);
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
  }
  return queue_or_capture(s, queue, [kernel, copies = std::move(copies)] { kernel->run(copies); });
}

SIM_EXPORT CUresult cuFuncGetAttribute(int* value, int attribute, CUfunction handle) {
  SIM_BEGIN(cuFuncGetAttribute);
  if (!value || !s.functions.count(reinterpret_cast<Function*>(handle))) return CUDA_ERROR_INVALID_VALUE;
  *value = attribute == 0 ? 1024 : 0;  // MAX_THREADS_PER_BLOCK; sizes and registers read 0
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncSetCacheConfig(CUfunction handle, int) {
  SIM_BEGIN(cuFuncSetCacheConfig);
  return s.functions.count(reinterpret_cast<Function*>(handle)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_EXPORT CUresult cuLinkCreate_v2(unsigned, int*, void**, void*) {
  SIM_BEGIN(cuLinkCreate);
  return CUDA_ERROR_NOT_SUPPORTED;  // no linker in the simulation
}

SIM_EXPORT CUresult cuProfilerStart() {
  SIM_ENTER(cuProfilerStart);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuProfilerStop() {
  SIM_ENTER(cuProfilerStop);
  return CUDA_SUCCESS;
}
