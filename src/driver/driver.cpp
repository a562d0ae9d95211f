#include "cuemm/driver/driver.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

namespace cuemm::driver {
namespace {

constexpr const char* kSimulatedDriverName = "libcuemm_simdriver.so";

std::atomic<Driver*> loaded_driver{nullptr};
std::mutex load_mutex;

void note_fork_in_child() noexcept { detail::forked_after_load.store(true, std::memory_order_relaxed); }

// Resolves every entry of CUEMM_DRIVER_FUNCTIONS; the first symbol found wins.
void resolve(void* library, Functions& functions) {
  auto find = [library](std::string_view symbols) -> void* {
    while (!symbols.empty()) {
      const auto bar = symbols.find('|');
      const std::string symbol(symbols.substr(0, bar));
      if (void* address = dlsym(library, symbol.c_str())) return address;
      if (bar == std::string_view::npos) break;
      symbols.remove_prefix(bar + 1);
    }
    return nullptr;
  };
#define CUEMM_DRIVER_RESOLVE(name, symbols, params) \
  functions.name = reinterpret_cast<CUresult(*) params>(find(symbols));
  CUEMM_DRIVER_FUNCTIONS(CUEMM_DRIVER_RESOLVE)
#undef CUEMM_DRIVER_RESOLVE
}

// The folder libcuemm was loaded from: the simulated driver is installed beside it.
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return {};
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string{} : path.substr(0, slash + 1);
}

std::string dl_error() {
  const char* text = dlerror();
  return text ? text : "unknown dlopen error";
}

}  // namespace

std::atomic<bool> detail::forked_after_load{false};

bool Driver::is_loaded() noexcept { return loaded_driver.load(std::memory_order_acquire) != nullptr; }

const Driver& Driver::get() {
  if (Driver* driver = loaded_driver.load(std::memory_order_acquire)) [[likely]]
    return *driver;
  std::lock_guard lock(load_mutex);
  if (Driver* driver = loaded_driver.load(std::memory_order_acquire)) return *driver;
  Driver* driver = load();  // throws, leaving nothing loaded, so a later call retries
  // (Note [A child forked after the driver was loaded]; a child forked before
  // this loads the driver itself, which works.)
  pthread_atfork(nullptr, nullptr, note_fork_in_child);
  loaded_driver.store(driver, std::memory_order_release);
  return *driver;
}

void* Driver::symbol(const char* name) const noexcept { return dlsym(library_, name); }

Driver* Driver::load() {
  const char* mode_text = std::getenv("CUEMM_DRIVER");
  const std::string mode = mode_text && *mode_text ? mode_text : "auto";
  if (mode != "auto" && mode != "cuda" && mode != "sim") {
    throw InvalidArgument("CUEMM_DRIVER must be auto, cuda or sim (got '" + mode + "')");
  }

  auto driver = new Driver();  // lives until exit: objects may call the driver during shutdown
  std::string why_not_cuda;
  if (mode != "sim") {
    for (const char* name : {"libcuda.so.1", "libcuda.so"}) {
      if ((driver->library_ = dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
        driver->path_ = name;
        break;
      }
      why_not_cuda = dl_error();
    }
    if (driver->library_) {
      resolve(driver->library_, driver->functions_);
      int count = 0;
      CUresult result = driver->functions_.cuInit ? driver->functions_.cuInit(0) : CUDA_ERROR_NOT_SUPPORTED;
      if (result == CUDA_SUCCESS) result = driver->functions_.cuDeviceGetCount(&count);
      if (result == CUDA_SUCCESS && count > 0) {
        driver->kind_ = Kind::Cuda;
        driver->functions_.cuDriverGetVersion(&driver->version_);
        return driver;
      }
      why_not_cuda = result != CUDA_SUCCESS ? "cuInit failed with " + std::to_string(result)
                                            : std::string("it sees no device");
      dlclose(driver->library_);
      driver->library_ = nullptr;
      driver->functions_ = {};
    }
    if (mode == "cuda") {
      delete driver;
      throw Error("CUEMM_DRIVER=cuda, but libcuda.so.1 is not usable: " + why_not_cuda);
    }
  }

  const char* sim_path = std::getenv("CUEMM_SIM_DRIVER");
  std::string path = sim_path && *sim_path ? sim_path : own_directory() + kSimulatedDriverName;
  driver->library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!driver->library_ && !(sim_path && *sim_path)) {
    path = kSimulatedDriverName;  // fall back to the loader's search path
    driver->library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!driver->library_) {
    const std::string reason = dl_error();
    delete driver;
    throw Error("cannot load the simulated CUDA driver '" + path + "': " + reason);
  }
  if (!dlsym(driver->library_, "cuemmSimIsSimulated")) {
    delete driver;
    throw Error("'" + path + "' is not the cuemm simulated driver (no cuemmSimIsSimulated)");
  }
  driver->path_ = path;
  driver->kind_ = Kind::Simulated;
  resolve(driver->library_, driver->functions_);
  if (const CUresult result = driver->functions_.cuInit(0); result != CUDA_SUCCESS) {
    delete driver;
    throw CudaError(result, "cuInit", "simulated driver " + path);
  }
  driver->functions_.cuDriverGetVersion(&driver->version_);
  if (mode == "auto") {
    std::fprintf(stderr, "cuemm: no usable CUDA GPU (%s); using the simulated driver %s\n",
                 why_not_cuda.c_str(), path.c_str());
  }
  return driver;
}

void throw_cuda_error(CUresult code, const char* call) {
  if (code == CUDA_ERROR_OUT_OF_MEMORY) throw OutOfMemory(call, 0);
  throw CudaError(code, call);
}

void throw_allocation_error(CUresult code, const char* call, std::size_t bytes) {
  if (code == CUDA_ERROR_OUT_OF_MEMORY) throw OutOfMemory(call, bytes);
  throw CudaError(code, call, "requested " + describe_bytes(bytes));
}

void throw_in_forked_child(const char* call) { throw CudaError(CUDA_ERROR_NOT_INITIALIZED, call); }

void throw_missing_function(const char* call) {
  throw CudaError(CUDA_ERROR_NOT_SUPPORTED, call,
                  "the loaded driver (" + Driver::get().library_path() + ") does not export it");
}

}  // namespace cuemm::driver
