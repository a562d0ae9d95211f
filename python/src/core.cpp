// cuemm._core: the C++ managers, for the Numba plugin (cuemm/numba_plugin.py).
//
// One Bridge per device: the manager chosen by name (with the CUEMM_* options
// of the environment), always wrapped in statistics and, when asked, in an
// in-memory CSV log. Allocations come back as Allocation objects, whose
// release() gives the memory back (Numba's finalizer calls it). C++ errors
// become Python exceptions: InvalidArgument -> ValueError, OutOfMemory ->
// MemoryError, the others -> RuntimeError (CudaError keeps its code).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fstream>
#include <sstream>

#include "cuemm/cuemm.hpp"

namespace py = pybind11;
using namespace cuemm;

namespace {

// A Python object kept alive by C++ (a pinned range's owner); dropped with the GIL held.
std::shared_ptr<const void> hold_python_object(py::object object) {
  auto* held = new py::object(std::move(object));
  return std::shared_ptr<const void>(held, [](const void* pointer) {
    auto* object = static_cast<py::object*>(const_cast<void*>(pointer));
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete object;
  });
}

class Allocation {
 public:
  explicit Allocation(std::shared_ptr<MemoryPointer> memory) : memory_(std::move(memory)) {}
  std::uintptr_t address() const { return checked().handle(); }
  std::uintptr_t host_address() const { return checked().host_pointer(); }
  std::size_t size() const { return checked().size(); }
  bool alive() const noexcept { return memory_ != nullptr; }
  void release() {
    std::shared_ptr<MemoryPointer> memory = std::move(memory_);
    py::gil_scoped_release unlocked;  // giving back may wait for the GPU
    memory.reset();
  }
  const std::shared_ptr<MemoryPointer>& memory() const {
    checked();
    return memory_;
  }

 private:
  const MemoryPointer& checked() const {
    if (!memory_) throw StateError("this cuemm allocation was already released");
    return *memory_;
  }
  std::shared_ptr<MemoryPointer> memory_;
};

class Bridge {
 public:
  Bridge(int device, const std::string& manager, bool log) : context_(&Device::get(device).primary_context()) {
    std::unique_ptr<BaseMemoryManager> made = make_bundled_memory_manager(manager, context_);
    made = std::make_unique<StatisticsAdaptor>(context_, std::move(made));
    if (log) made = std::make_unique<LoggingAdaptor>(context_, std::move(made), log_text_);
    if (const std::string adaptors = adaptors_from_environment(); !adaptors.empty())
      made = wrap_with_adaptors(context_, std::move(made), adaptors);
    manager_ = std::move(made);
    name_ = manager;
  }

  void initialize() { manager_->initialize(); }

  Allocation memalloc(long long size) {
    return Allocation(call({}, [&] { return manager_->memalloc(checked_size(size, "memalloc")); }));
  }
  // `site` names the Python caller for the log and the leak report.
  Allocation memalloc_at(long long size, std::string site) {
    return Allocation(call(std::move(site), [&] { return manager_->memalloc(checked_size(size, "memalloc")); }));
  }
  Allocation memhostalloc(long long size, bool mapped, bool portable, bool wc, std::string site) {
    return Allocation(call(std::move(site), [&] {
      return manager_->memhostalloc(checked_size(size, "memhostalloc"), mapped, portable, wc);
    }));
  }
  Allocation mempin(py::object owner, std::uintptr_t pointer, long long size, bool mapped) {
    if (pointer == 0) throw InvalidArgument("mempin: the pointer is null");
    auto held = hold_python_object(std::move(owner));
    return Allocation(call({}, [&] {
      return manager_->mempin(held, reinterpret_cast<void*>(pointer), checked_size(size, "mempin"), mapped);
    }));
  }
  Allocation memallocmanaged(long long size, bool attach_global) {
    return Allocation(call({}, [&] { return manager_->memallocmanaged(checked_size(size, "memallocmanaged"), attach_global); }));
  }

  // (handle bytes, offset of [address, address + size) in the exported allocation, size)
  py::tuple ipc_handle(std::uintptr_t address, long long size) {
    auto view = std::make_shared<MemoryPointer>(context_, address, checked_size(size, "get_ipc_handle"));
    IpcHandle handle = [&] {
      py::gil_scoped_release unlocked;
      return manager_->get_ipc_handle(view);
    }();
    const auto& raw = handle.handle();
    return py::make_tuple(py::bytes(raw.reserved, sizeof raw.reserved), handle.offset(), handle.size());
  }

  py::tuple memory_info() {
    const MemoryInfo info = manager_->get_memory_info();
    return py::make_tuple(info.free, info.total);
  }

  void reset() {
    py::gil_scoped_release unlocked;
    manager_->reset();
  }

  std::shared_ptr<CleanupGuard> defer_cleanup() { return std::make_shared<CleanupGuard>(manager_->defer_cleanup()); }

  py::dict statistics() const {
    const MemoryStatistics stats = find_adaptor<StatisticsAdaptor>(*manager_)->statistics();
    py::dict out;
    for (MemoryKind kind : {MemoryKind::Device, MemoryKind::Managed, MemoryKind::Pinned, MemoryKind::Mapped}) {
      const AllocationCounts& c = stats.of(kind);
      py::dict counts;
      counts["current_bytes"] = c.current_bytes;
      counts["peak_bytes"] = c.peak_bytes;
      counts["total_bytes"] = c.total_bytes;
      counts["current_count"] = c.current_count;
      counts["peak_count"] = c.peak_count;
      counts["total_count"] = c.total_count;
      out[to_string(kind)] = counts;
    }
    out["reserved_bytes"] = stats.reserved_bytes;
    out["failed_allocations"] = stats.failed_allocations;
    py::dict histogram;
    for (int i = 0; i < 64; ++i)
      if (stats.device_size_histogram[i]) histogram[py::int_(std::size_t{1} << i)] = stats.device_size_histogram[i];
    out["device_size_histogram"] = histogram;
    out["manager"] = name_;
    out["summary"] = stats.summary();
    return out;
  }

  bool logging() const noexcept { return find_adaptor<LoggingAdaptor>(*manager_) != nullptr; }
  std::string log_text() {
    auto* log = find_adaptor<LoggingAdaptor>(*manager_);
    if (!log) return {};
    log->flush();
    return log_text_.str();
  }

 private:
  static std::size_t checked_size(long long size, const char* call) {
    if (size < 0) throw InvalidArgument(std::string(call) + ": size must not be negative (got " + std::to_string(size) + ")");
    return static_cast<std::size_t>(size);
  }
  template <typename Allocate>
  std::shared_ptr<MemoryPointer> call(std::string site, Allocate&& allocate) {
    py::gil_scoped_release unlocked;  // other Python threads run while the driver works
    if (site.empty()) return allocate();
    ScopedCallSite named(std::move(site));
    return allocate();
  }

  Context* context_;
  std::ostringstream log_text_;  // declared before manager_: the log adaptor writes here until it goes
  std::unique_ptr<BaseMemoryManager> manager_;
  std::string name_;
};

}  // namespace

PYBIND11_MODULE(_core, module) {
  module.doc() = "cuemm's C++ memory managers (see cuemm.numba_plugin)";

  // Never destroyed: a static Python object would be released after the interpreter is gone.
  static auto& cuda_error = *new py::exception<CudaError>(module, "CudaError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const CudaError& e) {
      py::object type = py::reinterpret_borrow<py::object>(cuda_error.ptr());
      py::object instance = type(e.what());
      instance.attr("code") = e.code();
      instance.attr("code_name") = e.code_name();
      PyErr_SetObject(cuda_error.ptr(), instance.ptr());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const NotSupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<Allocation>(module, "Allocation")
      .def_property_readonly("address", &Allocation::address)
      .def_property_readonly("host_address", &Allocation::host_address)
      .def_property_readonly("size", &Allocation::size)
      .def_property_readonly("alive", &Allocation::alive)
      .def("release", &Allocation::release, "Gives the memory back (once; later calls do nothing)");

  py::class_<CleanupGuard, std::shared_ptr<CleanupGuard>>(module, "CleanupGuard")
      .def("__enter__", [](std::shared_ptr<CleanupGuard> self) { return self; })
      .def("__exit__", [](CleanupGuard& self, py::args) { self.release(); });

  py::class_<Bridge>(module, "Bridge")
      .def(py::init<int, const std::string&, bool>(), py::arg("device"), py::arg("manager"), py::arg("log") = false)
      .def("initialize", &Bridge::initialize)
      .def("memalloc", &Bridge::memalloc, py::arg("size"))
      .def("memalloc_at", &Bridge::memalloc_at, py::arg("size"), py::arg("site"))
      .def("memhostalloc", &Bridge::memhostalloc, py::arg("size"), py::arg("mapped") = false,
           py::arg("portable") = false, py::arg("wc") = false, py::arg("site") = "")
      .def("mempin", &Bridge::mempin, py::arg("owner"), py::arg("pointer"), py::arg("size"), py::arg("mapped") = false)
      .def("memallocmanaged", &Bridge::memallocmanaged, py::arg("size"), py::arg("attach_global") = true)
      .def("ipc_handle", &Bridge::ipc_handle, py::arg("address"), py::arg("size"))
      .def("memory_info", &Bridge::memory_info)
      .def("reset", &Bridge::reset)
      .def("defer_cleanup", &Bridge::defer_cleanup)
      .def("statistics", &Bridge::statistics)
      .def_property_readonly("logging", &Bridge::logging)
      .def("log_text", &Bridge::log_text);

  module.def("bundled_managers", &bundled_memory_managers);
  module.def("memory_plot_svg", [](const std::string& log_text) {
    std::istringstream in(log_text);
    return memory_plot_svg(read_memory_log(in, "the log"));
  }, py::arg("log_text"), "An SVG picture of memory in use over time, from a cuemm CSV log");
  module.def("current_device", [] {
    cuda::CUdevice device = 0;
    CUEMM_CU(cuCtxGetDevice, &device);
    return device;
  }, "The device of the calling thread's current CUDA context");
  module.def("driver_kind", [] { return simulation::active() ? "simulated" : "cuda"; });
}
