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

#include <array>
#include <atomic>
#include <optional>
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

// The GIL for one call into a manager. With `until_blocking`, it is kept
// until the call may block (cuemm's BlockingHook: a driver call, or a lock
// another thread holds) and other Python threads run from then until the call
// returns: a block from a thread's cache comes back without giving the GIL up
// at all, which cost more than that allocation. Blocking with the GIL held
// could deadlock (a stream callback may need it to finish), hence not simply
// keeping it. Without, it is given up at once: the manager may block without
// telling, as a log adaptor writing a file does.
class GilForCall final : public BlockingHook {
 public:
  explicit GilForCall(bool until_blocking) noexcept : scope_(*this) {
    if (!until_blocking) before_blocking();
  }
  ~GilForCall() {
    if (saved_) PyEval_RestoreThread(saved_);
  }
  GilForCall(const GilForCall&) = delete;
  GilForCall& operator=(const GilForCall&) = delete;
  void before_blocking() noexcept override {
    if (!saved_) saved_ = PyEval_SaveThread();
  }

 private:
  PyThreadState* saved_ = nullptr;
  ScopedBlockingHook scope_;
};

PyObject* cuda_error_type = nullptr;  // cuemm._core.CudaError, made when the module loads

// Sets the Python exception for a C++ one: InvalidArgument -> ValueError,
// OutOfMemory -> MemoryError, NotSupported -> NotImplementedError, CudaError ->
// cuemm._core.CudaError (with code and code_name), other cuemm errors ->
// RuntimeError. Returns false for exceptions that are not cuemm's.
bool set_python_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemory& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const CudaError& e) {
    py::object instance = py::reinterpret_borrow<py::object>(cuda_error_type)(e.what());
    instance.attr("code") = e.code();
    instance.attr("code_name") = e.code_name();
    PyErr_SetObject(cuda_error_type, instance.ptr());
  } catch (const InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const NotSupported& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what());
  } catch (const Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    return false;
  }
  return true;
}

// For code outside pybind11's dispatcher: any exception, as Python's.
void set_python_error_from_any(std::exception_ptr error) noexcept {
  try {
    if (set_python_error(error)) return;
    std::rethrow_exception(error);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "cuemm: unknown C++ exception");
  }
}

// A size argument from Python, or false with the error set: a TypeError for
// a non-integer, a ValueError for a negative one and an OverflowError past
// 2**63, each naming the call and the size. Every size the bridge takes
// comes through here.
bool size_argument(PyObject* size_object, const char* call, std::size_t* size) {
  static PyObject* const zero_size = PyLong_FromLong(0);  // kept for the process
  const long long value = PyLong_AsLongLong(size_object);
  if (value >= 0) {
    *size = static_cast<std::size_t>(value);
    return true;
  }
  if (value == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return false;
    PyErr_Clear();
    if (PyObject_RichCompareBool(size_object, zero_size, Py_LT) != 1) {
      PyErr_Format(PyExc_OverflowError, "%s: size %S bytes is larger than any allocation can be (at most 2**63 - 1)",
                   call, size_object);
      return false;
    }
  }
  PyErr_Format(PyExc_ValueError, "%s: size must not be negative (got %S)", call, size_object);
  return false;
}

// The same for pybind11's bindings, which take sizes as Python objects for it.
std::size_t python_size(py::handle size, const char* call) {
  std::size_t value;
  if (!size_argument(size.ptr(), call, &value)) throw py::error_already_set();
  return value;
}

// --- Allocation: what every allocation returns to Python ---
//
// A plain CPython type rather than a pybind11 class: Numba makes one per
// allocation, and pybind11's per-instance bookkeeping (type lookup by name,
// instance registry) cost more than the pool's whole allocate+free (measured
// on the simulated driver: 1.0 us a pair through pybind11 objects, against
// the pool's 50 ns).
//
// On the device fast path it holds what the bridge's outermost adaptor's
// upstream gave (over the pool a bare block, else that manager's pointer) and
// gives it back through that adaptor (ManagerAdaptor::memalloc_unwrapped): no
// pointer object of the adaptor's own per allocation.
struct PyAllocation {
  PyObject_HEAD
  ManagerAdaptor::Unwrapped held;  // held.held() is false once released
  ManagerAdaptor* adaptor;  // gives `held` back when set; otherwise dropping held.memory does
  PyObject* adaptor_owner;  // keeps `adaptor` alive (its Bridge)
  bool gil_until_blocking;  // GilForCall's choice for giving it back
};

// Gives `held` back, through `adaptor` when set; the GIL is released while
// that may block (it may wait for the GPU, and a stream callback may need the
// GIL to finish).
void give_back(ManagerAdaptor::Unwrapped& held, ManagerAdaptor* adaptor, bool gil_until_blocking) noexcept {
  GilForCall gil(gil_until_blocking);
  if (adaptor && !driver::in_forked_child())  // (a forked child's blocks are the parent's: dropped)
    adaptor->release_unwrapped(held);
  else
    held.memory.reset();
}

// Gives the memory back, once. What is held is taken out first, with the GIL:
// another thread may look at this object meanwhile (it then holds nothing).
void release_allocation(PyAllocation* self) noexcept {
  if (!self->held.held()) return;
  ManagerAdaptor::Unwrapped held = std::exchange(self->held, {});
  give_back(held, self->adaptor, self->gil_until_blocking);
  Py_CLEAR(self->adaptor_owner);
}

void allocation_dealloc(PyObject* object) {
  auto* self = reinterpret_cast<PyAllocation*>(object);
  release_allocation(self);
  self->held.~Unwrapped();
  PyTypeObject* type = Py_TYPE(object);
  type->tp_free(object);
  Py_DECREF(type);  // instances of a heap type hold a reference to it
}

// What the allocation holds, or null with RuntimeError set when it was released.
const ManagerAdaptor::Unwrapped* live(PyObject* object) {
  const ManagerAdaptor::Unwrapped& held = reinterpret_cast<PyAllocation*>(object)->held;
  if (held.held()) return &held;
  PyErr_SetString(PyExc_RuntimeError, "this cuemm allocation was already released");
  return nullptr;
}

PyObject* allocation_address(PyObject* object, void*) {
  const ManagerAdaptor::Unwrapped* held = live(object);
  return held ? PyLong_FromUnsignedLongLong(held->handle()) : nullptr;
}
PyObject* allocation_host_address(PyObject* object, void*) {
  const ManagerAdaptor::Unwrapped* held = live(object);
  return held ? PyLong_FromUnsignedLongLong(held->memory ? held->memory->host_pointer() : 0) : nullptr;
}
PyObject* allocation_size(PyObject* object, void*) {
  const ManagerAdaptor::Unwrapped* held = live(object);
  return held ? PyLong_FromSize_t(held->memory ? held->memory->size() : held->block.size) : nullptr;
}
PyObject* allocation_alive(PyObject* object, void*) {
  return PyBool_FromLong(reinterpret_cast<PyAllocation*>(object)->held.held());
}
PyObject* allocation_release(PyObject* object, PyObject*) {
  release_allocation(reinterpret_cast<PyAllocation*>(object));
  Py_RETURN_NONE;
}

PyGetSetDef allocation_properties[] = {
    {"address", allocation_address, nullptr, "the device address (RuntimeError once released)", nullptr},
    {"host_address", allocation_host_address, nullptr, "the host address of host memory, else 0", nullptr},
    {"size", allocation_size, nullptr, "bytes", nullptr},
    {"alive", allocation_alive, nullptr, "False once released", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};
PyMethodDef allocation_methods[] = {
    {"release", allocation_release, METH_NOARGS, "Gives the memory back (once; later calls do nothing)"},
    {nullptr, nullptr, 0, nullptr}};
PyType_Slot allocation_slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(allocation_dealloc)},
                                  {Py_tp_getset, allocation_properties},
                                  {Py_tp_methods, allocation_methods},
                                  {Py_tp_doc, const_cast<char*>("A cuemm allocation; release() or dropping it gives the memory back")},
                                  {0, nullptr}};
PyType_Spec allocation_spec{"cuemm._core.Allocation", sizeof(PyAllocation), 0, Py_TPFLAGS_DEFAULT, allocation_slots};
PyTypeObject* allocation_type = nullptr;  // made when the module loads; never freed

// A new Python Allocation owning `held`, given back through `adaptor` (kept
// alive by `adaptor_owner`) when that is set (the GIL is held). On failure,
// `held` goes back at once.
PyObject* new_allocation(ManagerAdaptor::Unwrapped&& held, ManagerAdaptor* adaptor, PyObject* adaptor_owner,
                         bool gil_until_blocking) noexcept {
  auto* self = PyObject_New(PyAllocation, allocation_type);
  if (!self) {
    give_back(held, adaptor, gil_until_blocking);
    return nullptr;
  }
  new (&self->held) ManagerAdaptor::Unwrapped(std::move(held));
  self->adaptor = adaptor;
  Py_XINCREF(adaptor_owner);
  self->adaptor_owner = adaptor_owner;
  self->gil_until_blocking = gil_until_blocking;
  return reinterpret_cast<PyObject*>(self);
}

// A new Python Allocation owning `memory` (the GIL is held).
py::object wrap_allocation(std::shared_ptr<MemoryPointer> memory, bool gil_until_blocking) {
  PyObject* self = new_allocation({std::move(memory), {}, 0}, nullptr, nullptr, gil_until_blocking);
  if (!self) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
}

// --- StreamAllocation: a block allocated on a stream (cuemm.device_array(stream=...)) ---
//
// Given back on the same stream (StreamOrderedAllocator::deallocate); when
// that stream or another may take it again is the manager's rule
// (cuemm/stream_ordered.py). It keeps the Python stream object alive until
// then, as the free is queued on that stream.
struct PyStreamAllocation {
  PyObject_HEAD
  StreamOrderedAllocator* allocator;  // null once released
  PyObject* owner;                    // the Bridge, which keeps `allocator` alive
  PyObject* stream_owner;             // the Python stream (or None), kept until the free is queued
  const std::atomic<std::uint64_t>* resets;  // the Bridge's count of resets
  std::uint64_t resets_at_allocation;        // a reset since gave the block back already
  cuda::CUstream stream;
  cuda::CUdeviceptr address;
  std::size_t size;
  bool gil_until_blocking;
};

// Gives the block back on its stream, once (the GIL is held; given up while
// the manager may block).
void release_stream_allocation(PyStreamAllocation* self) noexcept {
  StreamOrderedAllocator* allocator = std::exchange(self->allocator, nullptr);
  if (!allocator) return;
  if (self->resets->load(std::memory_order_acquire) == self->resets_at_allocation && !driver::in_forked_child()) {
    GilForCall gil(self->gil_until_blocking);
    allocator->deallocate(self->address, self->size, self->stream);
  }
  Py_CLEAR(self->stream_owner);  // (may destroy the stream: its queued free still runs)
  Py_CLEAR(self->owner);
}

void stream_allocation_dealloc(PyObject* object) {
  release_stream_allocation(reinterpret_cast<PyStreamAllocation*>(object));
  PyTypeObject* type = Py_TYPE(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyObject* stream_allocation_address(PyObject* object, void*) {
  const auto* self = reinterpret_cast<PyStreamAllocation*>(object);
  if (self->allocator) return PyLong_FromUnsignedLongLong(self->address);
  PyErr_SetString(PyExc_RuntimeError, "this cuemm allocation was already released");
  return nullptr;
}
PyObject* stream_allocation_size(PyObject* object, void*) {
  return PyLong_FromSize_t(reinterpret_cast<PyStreamAllocation*>(object)->size);
}
PyObject* stream_allocation_stream(PyObject* object, void*) {
  return PyLong_FromVoidPtr(reinterpret_cast<PyStreamAllocation*>(object)->stream);
}
PyObject* stream_allocation_alive(PyObject* object, void*) {
  return PyBool_FromLong(reinterpret_cast<PyStreamAllocation*>(object)->allocator != nullptr);
}
PyObject* stream_allocation_release(PyObject* object, PyObject*) {
  release_stream_allocation(reinterpret_cast<PyStreamAllocation*>(object));
  Py_RETURN_NONE;
}

PyGetSetDef stream_allocation_properties[] = {
    {"address", stream_allocation_address, nullptr, "the device address (RuntimeError once released)", nullptr},
    {"size", stream_allocation_size, nullptr, "bytes", nullptr},
    {"stream", stream_allocation_stream, nullptr, "the stream's handle, on which the block is given back", nullptr},
    {"alive", stream_allocation_alive, nullptr, "False once released", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};
PyMethodDef stream_allocation_methods[] = {
    {"release", stream_allocation_release, METH_NOARGS,
     "Gives the block back on its stream (once; later calls do nothing)"},
    {nullptr, nullptr, 0, nullptr}};
PyType_Slot stream_allocation_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(stream_allocation_dealloc)},
    {Py_tp_getset, stream_allocation_properties},
    {Py_tp_methods, stream_allocation_methods},
    {Py_tp_doc, const_cast<char*>("Device memory allocated on a stream; release() or dropping it gives it back "
                                  "on that stream")},
    {0, nullptr}};
PyType_Spec stream_allocation_spec{"cuemm._core.StreamAllocation", sizeof(PyStreamAllocation), 0,
                                   Py_TPFLAGS_DEFAULT, stream_allocation_slots};
PyTypeObject* stream_allocation_type = nullptr;  // made when the module loads; never freed

// The handler cuemm.on_out_of_memory() set, or None; read and set with the
// GIL. (Never destroyed: allocations may run while the interpreter ends.)
py::object& out_of_memory_handler() {
  static auto* handler = new py::object(py::none());
  return *handler;
}

// Whether the handler asks to try the allocation that ran out again. An
// allocation inside the handler that runs out does not call it again. Its
// Python exception, if it raises, fails the allocation. The GIL is held.
bool out_of_memory_handler_retries(const OutOfMemory& error, int attempt) {
  static thread_local bool handling = false;
  const py::object handler = out_of_memory_handler();  // (the handler may replace itself)
  if (handling || handler.is_none()) return false;
  handling = true;
  struct Done {
    ~Done() { handling = false; }
  } done;
  const py::object answer = handler(error.requested(), attempt);
  const int retry = PyObject_IsTrue(answer.ptr());
  if (retry < 0) throw py::error_already_set();
  if (retry == 0) return false;
  throw_if_no_retry_is_left(error, attempt);
  return true;
}

// What release_unused_memory() gave back, as the dict Python sees.
py::dict released_memory_dict(const ReleasedMemory& released) {
  py::dict out;
  out["device_bytes"] = released.device_bytes;
  out["pinned_host_bytes"] = released.pinned_host_bytes;
  out["deferred_frees"] = released.deferred_frees;
  out["deferred_bytes"] = released.deferred_bytes;
  return out;
}

class Bridge {
 public:
  Bridge(int device, const std::string& manager, bool log) : context_(&Device::get(device).primary_context()) {
    std::unique_ptr<BaseMemoryManager> made = make_bundled_memory_manager(manager, context_);
    made = std::make_unique<StatisticsAdaptor>(context_, std::move(made));
    if (log) {
      made = std::make_unique<LoggingAdaptor>(context_, std::move(made), log_text_);
      memory_log_ = static_cast<LoggingAdaptor*>(made.get());
    }
    if (const std::string adaptors = adaptors_from_environment(); !adaptors.empty())
      made = wrap_with_adaptors(context_, std::move(made), adaptors);
    manager_ = std::move(made);
    name_ = manager;
    // A log adaptor may write a file under its lock without telling.
    gil_until_blocking_ = find_adaptor<LoggingAdaptor>(*manager_) == nullptr;
    outermost_adaptor_ = dynamic_cast<ManagerAdaptor*>(manager_.get());
  }

  // Each entry into the manager first refuses in a forked child, whose
  // manager is the parent's copy (Note [A child forked after the driver was
  // loaded], cuemm/driver/driver.hpp).
  void initialize() {
    driver::refuse_in_forked_child("initialize");
    GilForCall gil(gil_until_blocking_);
    manager_->initialize();
    initialized_.store(true, std::memory_order_release);
  }

  // The fast path's memalloc (Allocator): the new Allocation. Through
  // the outermost adaptor without its pointer, when there is one;
  // `bridge_object` is this bridge's Python object, which the Allocation keeps.
  PyObject* memalloc_held(std::size_t size, PyObject* bridge_object) {
    if (!outermost_adaptor_) return memalloc(size).release().ptr();
    driver::refuse_in_forked_child("memalloc");
    ManagerAdaptor::Unwrapped held =
        call({}, [&] { return outermost_adaptor_->memalloc_unwrapped(size); });
    PyObject* allocation = new_allocation(std::move(held), outermost_adaptor_, bridge_object, gil_until_blocking_);
    if (!allocation) throw py::error_already_set();
    return allocation;
  }

  py::object memalloc(std::size_t size) {
    driver::refuse_in_forked_child("memalloc");
    return wrap(call({}, [&] { return manager_->memalloc(size); }));
  }
  // `site` names the Python caller for the log and the leak report.
  py::object memalloc_at(std::size_t size, std::string site) {
    driver::refuse_in_forked_child("memalloc");
    return wrap(call(site, [&] { return manager_->memalloc(size); }));
  }
  py::object memhostalloc(std::size_t size, bool mapped, bool portable, bool wc, std::string site) {
    driver::refuse_in_forked_child("memhostalloc");
    return wrap(call(site, [&] {
      return manager_->memhostalloc(size, mapped, portable, wc);
    }));
  }
  py::object mempin(py::object owner, std::uintptr_t pointer, std::size_t size, bool mapped) {
    if (pointer == 0) throw InvalidArgument("mempin: the pointer is null");
    driver::refuse_in_forked_child("mempin");
    // (None owns nothing: such a pin is not cached past its release.)
    auto held = owner.is_none() ? nullptr : hold_python_object(std::move(owner));
    return wrap(call({}, [&] {
      return manager_->mempin(held, reinterpret_cast<void*>(pointer), size, mapped);
    }));
  }
  py::object memallocmanaged(std::size_t size, bool attach_global) {
    driver::refuse_in_forked_child("memallocmanaged");
    return wrap(call({}, [&] { return manager_->memallocmanaged(size, attach_global); }));
  }

  // `size` bytes on `stream` (a handle; `stream_owner` is its Python object),
  // as a StreamAllocation given back on that stream; `bridge_object` is this
  // bridge's Python object. NotImplementedError where the manager has no
  // stream-ordered calls (the default manager).
  py::object allocate_on_stream(std::size_t size, std::uintptr_t stream, py::object stream_owner, std::string site,
                                py::object bridge_object) {
    driver::refuse_in_forked_child("allocate_on_stream");
    StreamOrderedAllocator* ordered = stream_ordered_allocator(*manager_);
    if (!ordered)
      throw NotSupported("allocating " + std::to_string(size) + " bytes on a stream: device " +
                         std::to_string(context_->device().id()) + "'s cuemm manager is '" + name_ +
                         "', which has no stream-ordered calls (CUEMM_MEMORY_MANAGER=pool or async have them)");
    if (!initialized_.load(std::memory_order_acquire)) initialize();
    const auto handle = reinterpret_cast<cuda::CUstream>(stream);
    const cuda::CUdeviceptr address = call(site, [&] { return ordered->allocate(size, handle); });
    const std::uint64_t resets = resets_.load(std::memory_order_acquire);  // (after: see reset())
    auto* self = PyObject_New(PyStreamAllocation, stream_allocation_type);
    if (!self) {
      GilForCall gil(gil_until_blocking_);
      ordered->deallocate(address, size, handle);
      throw py::error_already_set();
    }
    self->allocator = ordered;
    self->owner = bridge_object.release().ptr();
    self->stream_owner = stream_owner.release().ptr();
    self->resets = &resets_;
    self->resets_at_allocation = resets;
    self->stream = handle;
    self->address = address;
    self->size = size;
    self->gil_until_blocking = gil_until_blocking_;
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
  }

  // (handle bytes, offset of [address, address + size) in the exported allocation, size, and
  // cuemm's serialised handle where the driver has no handle for the memory, else None)
  py::tuple ipc_handle(std::uintptr_t address, std::size_t size) {
    driver::refuse_in_forked_child("get_ipc_handle");
    auto view = std::make_shared<MemoryPointer>(context_, address, size);
    IpcHandle handle = [&] {
      py::gil_scoped_release unlocked;
      return manager_->get_ipc_handle(view);
    }();
    const auto& raw = handle.handle();
    // Without a driver handle (an exportable stream-ordered pool, the expandable
    // arena), cuemm opens its own serialised handle.
    py::object exported = py::none();
    if (!handle.has_driver_handle()) {
      const std::vector<std::uint8_t> bytes = handle.to_bytes();
      exported = py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    return py::make_tuple(py::bytes(raw.reserved, sizeof raw.reserved), handle.offset(), handle.size(), exported);
  }

  py::tuple memory_info() {
    driver::refuse_in_forked_child("get_memory_info");
    const MemoryInfo info = [&] {
      py::gil_scoped_release unlocked;  // asks the driver
      return manager_->get_memory_info();
    }();
    return py::make_tuple(info.free, info.total);
  }

  void reset() {
    driver::refuse_in_forked_child("reset");
    py::gil_scoped_release unlocked;
    // Counted first: a block whose allocation read the count before this was
    // made before it, and the reset gives it back.
    resets_.fetch_add(1, std::memory_order_acq_rel);
    initialized_.store(false, std::memory_order_release);
    manager_->reset();
  }

  std::shared_ptr<CleanupGuard> defer_cleanup() {
    driver::refuse_in_forked_child("defer_cleanup");
    py::gil_scoped_release unlocked;  // may take a manager's lock
    return std::make_shared<CleanupGuard>(manager_->defer_cleanup());
  }

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
    if (auto* pool = find_adaptor<PoolMemoryManager>(*manager_)) {
      const PoolStatistics p = [&] {
        py::gil_scoped_release unlocked;  // takes the pool's lock
        return pool->statistics();
      }();
      py::dict figures;
      figures["reserved_bytes"] = p.reserved_bytes;
      figures["in_use_bytes"] = p.in_use_bytes;
      figures["quarantined_bytes"] = p.quarantined_bytes;
      figures["cached_bytes"] = p.cached_bytes;
      figures["segments"] = p.segments;
      figures["free_blocks"] = p.free_blocks;
      figures["seals"] = p.seals;
      figures["driver_allocations"] = p.driver_allocations;
      figures["driver_frees"] = p.driver_frees;
      figures["spares_taken_over"] = p.spares_taken_over;
      figures["blocks_assembled"] = p.blocks_assembled;
      figures["gpu_waits_avoided"] = p.gpu_waits_avoided;
      figures["queued_large_frees"] = p.queued_large_frees;
      figures["queued_small_frees"] = p.queued_small_frees;
      out["pool"] = figures;
    }
    // The pinned host pool that the pool and async managers use (seals: how
    // often a released block had to wait for the GPU's queued work).
    if (auto* host_only = find_adaptor<HostOnlyMemoryManager>(*manager_)) {
      const std::optional<PinnedHostPoolStatistics> h = [&]() -> std::optional<PinnedHostPoolStatistics> {
        py::gil_scoped_release unlocked;  // takes the host pool's lock
        PinnedHostPool* host_pool = host_only->pinned_host_pool();
        if (!host_pool) return std::nullopt;
        return host_pool->statistics();
      }();
      if (h) {
        py::dict figures;
        figures["allocated_bytes"] = h->allocated_bytes;
        figures["cached_bytes"] = h->cached_bytes;
        figures["cached_registrations"] = h->cached_registrations;
        figures["hits"] = h->hits;
        figures["front_hits"] = h->front_hits;
        figures["misses"] = h->misses;
        figures["seals"] = h->seals;
        out["pinned_host_pool"] = figures;
      }
    }
    return out;
  }

  // release_unused_memory() of the manager, as a dict of its four figures.
  py::dict release_unused_memory() {
    driver::refuse_in_forked_child("release_unused_memory");
    const ReleasedMemory released = [&] {
      py::gil_scoped_release unlocked;  // takes the pools' locks and waits for the GPU
      return cuemm::release_unused_memory(*manager_);
    }();
    return released_memory_dict(released);
  }

  // The pool's segments by address, as dicts (PoolMemoryManager::segments()).
  py::list segments() const {
    auto* pool = find_adaptor<PoolMemoryManager>(*manager_);
    if (!pool) {
      throw py::value_error("cuemm.segments() lists the pool manager's segments; this device's manager is '" + name_ +
                            "' (CUEMM_MEMORY_MANAGER=pool)");
    }
    const std::vector<PoolSegment> segments = [&] {
      py::gil_scoped_release unlocked;  // takes the pool's lock
      return pool->segments();
    }();
    py::list out;
    for (const PoolSegment& segment : segments) {
      py::dict entry;
      entry["kind"] = to_string(segment.kind);
      entry["address"] = segment.address;
      entry["size"] = segment.size;
      entry["mapped_bytes"] = segment.mapped_bytes;
      entry["free_bytes"] = segment.free_bytes;
      entry["free_blocks"] = segment.free_blocks;
      entry["largest_free_block"] = segment.largest_free_block;
      out.append(entry);
    }
    return out;
  }

  bool logging() const noexcept { return find_adaptor<LoggingAdaptor>(*manager_) != nullptr; }
  // Whether an adaptor keeps call sites: a log, or tracking's leak report.
  bool wants_call_sites() const noexcept { return logging() || find_adaptor<TrackingAdaptor>(*manager_) != nullptr; }

  // The tracking adaptor's outstanding allocations, oldest first, as dicts.
  py::list outstanding() const {
    py::list out;
    for (const AllocationRecord& record : tracking().outstanding()) {
      py::dict entry;
      entry["kind"] = to_string(record.kind);
      entry["address"] = record.address;
      entry["size"] = record.size;
      entry["start"] = record.start;
      entry["call_site"] = record.call_site;
      out.append(std::move(entry));
    }
    return out;
  }
  std::string leak_report() const { return tracking().leak_report(); }
  const TrackingAdaptor& tracking() const {
    const auto* tracking = find_adaptor<TrackingAdaptor>(*manager_);
    if (!tracking)
      throw StateError("cuemm tracks no allocations: add the tracking adaptor (CUEMM_ADAPTORS=tracking, or "
                       "use_cuemm_for_numba(adaptors=\"tracking\")) before the first allocation");
    return *tracking;
  }

  // The log write_log() and plot() read: log=True's in memory, else the log
  // adaptor's file (CUEMM_ADAPTORS=log, log_file=...).
  std::string log_text() {
    LoggingAdaptor* log = memory_log_ ? memory_log_ : find_adaptor<LoggingAdaptor>(*manager_);
    if (!log)
      throw StateError("cuemm keeps no log: call use_cuemm_for_numba(log=True) (in memory) or add the log "
                       "adaptor (adaptors=\"log\", log_file=...; CUEMM_LOG=1 or CUEMM_ADAPTORS=log) first");
    return log->text();
  }

 private:
  py::object wrap(std::shared_ptr<MemoryPointer> memory) const {
    return wrap_allocation(std::move(memory), gil_until_blocking_);
  }
  // Runs `allocate` with the GIL given back while it may block; on
  // OutOfMemory, asks the handler of cuemm.on_out_of_memory() whether to try
  // again (with the GIL: outside every lock of cuemm's).
  template <typename Allocate>
  auto call(const std::string& site, Allocate&& allocate) -> decltype(allocate()) {
    for (int attempt = 1;; ++attempt) {
      try {
        GilForCall gil(gil_until_blocking_);  // other Python threads run while the driver works
        if (site.empty()) return allocate();
        ScopedCallSite named(site);
        return allocate();
      } catch (const OutOfMemory& error) {
        if (!out_of_memory_handler_retries(error, attempt)) throw;
      }
    }
  }

  Context* context_;
  std::ostringstream log_text_;  // declared before manager_: the log adaptor writes here until it goes
  LoggingAdaptor* memory_log_ = nullptr;  // log=True's, which writes log_text_ (within manager_)
  std::unique_ptr<BaseMemoryManager> manager_;
  std::string name_;
  bool gil_until_blocking_ = true;
  ManagerAdaptor* outermost_adaptor_ = nullptr;  // manager_, when it is an adaptor
  std::atomic<bool> initialized_{false};  // initialize() ran since the last reset()
  std::atomic<std::uint64_t> resets_{0};   // StreamAllocations made before a reset give nothing back
};

// --- Allocator: Bridge.memalloc and memhostalloc without pybind11's dispatcher ---
//
// Numba's memalloc calls this once per allocation: a METH_O method on a plain
// type holding the bridge, which parses one int and no keyword arguments, and
// also makes the pointer object Numba wants (the type given at construction:
// cuda.bindings' CUdeviceptr or ctypes' c_uint64), which costs less here than
// reading the address and calling the type from Python.
//
// The pointer objects are reused per address: a pool hands the same addresses
// out again and again, and making a cuda.bindings CUdeviceptr costs more than
// the pool's whole allocation (130 ns on the H100 machine). Numba never
// changes a pointer object it was given, so one object may serve every
// allocation at its address. The cache is used with the GIL held.
class PointerObjects {
 public:
  // A new reference to a pointer object for `address`, or null with the error set.
  PyObject* get(PyObject* type, std::uintptr_t address) {
    Slot& slot = slots_[(address * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits)];
    if (slot.object && slot.address == address) [[likely]] {
      Py_INCREF(slot.object);
      return slot.object;
    }
    PyObject* number = PyLong_FromUnsignedLongLong(address);
    PyObject* made = number ? PyObject_CallOneArg(type, number) : nullptr;
    Py_XDECREF(number);
    if (!made) return nullptr;
    Py_XDECREF(slot.object);
    Py_INCREF(made);
    slot = {address, made};
    return made;
  }
  void clear() noexcept {
    for (Slot& slot : slots_) Py_CLEAR(slot.object);
  }

 private:
  static constexpr int kSlotBits = 10;  // a pool hands addresses out again in turn (its caches are rings)
  struct Slot {
    std::uintptr_t address;
    PyObject* object;
  };
  std::array<Slot, std::size_t{1} << kSlotBits> slots_{};
};

PyObject* allocation_attribute = nullptr;  // "_allocation", interned when the module loads

// Makes memory_type(context, pointer, size) objects without running their
// __init__: the attributes one instance got, stored again in the same order
// (so the instance shares its type's attribute layout, as one made by
// __init__ does), with the pointer and the size put in. A Python __init__
// (MemoryPointer's stores nine attributes) cost more than the pool's
// allocation and the rest of this path together. (H100 machine, one process:
// device_array at 0.94-1.04x of the do-nothing plugin this way, 0.99-1.11x
// through __init__.)
//
// Which attributes hold the pointer and the size is learnt, not assumed: two
// instances are made through __init__ with different arguments, and every
// attribute must then be either the same object in both or the argument
// itself. Anything else (a value computed from the arguments, a fresh object
// per instance) leaves the prototype unlearnt and memalloc_memory calls the
// type, so a Numba whose pointer class does more stays correct.
class InstancePrototype {
 public:
  // Learns from memory_type(context, ...); false (with no error set) where the type does not fit.
  bool learn(PyObject* memory_type, PyObject* context, PyObject* pointer_type) {
    if (!PyType_Check(memory_type)) return false;
    auto* type = reinterpret_cast<PyTypeObject*>(memory_type);
    if (type->tp_new != PyBaseObject_Type.tp_new || type->tp_setattro != PyObject_GenericSetAttr) return false;
    if (has_slots(type)) return false;  // what __init__ stores in slots is not in the instance's __dict__
    Sample first(memory_type, context, pointer_type, 0x100000, 4096);
    Sample second(memory_type, context, pointer_type, 0x200000, 8192);
    const bool fits = first.attributes && second.attributes && learn_from(first, second);
    if (!fits) forget();
    PyErr_Clear();
    return fits;
  }
  bool learnt() const noexcept { return empty_ != nullptr; }

  // A new instance of `type` with `pointer`, `size` and `allocation` in place, or null with the error set.
  PyObject* make(PyObject* type, PyObject* pointer, PyObject* size, PyObject* allocation) const {
    PyObject* instance = PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(type), empty_, nullptr);
    if (!instance) return nullptr;
    for (const Attribute& attribute : attributes_) {
      PyObject* value = attribute.source == Source::Pointer ? pointer
                        : attribute.source == Source::Size  ? size
                                                            : attribute.value;
      if (PyObject_GenericSetAttr(instance, attribute.name, value) < 0) {
        Py_DECREF(instance);
        return nullptr;
      }
    }
    if (PyObject_GenericSetAttr(instance, allocation_attribute, allocation) < 0) Py_CLEAR(instance);
    return instance;
  }

  void forget() noexcept {
    for (Attribute& attribute : attributes_) {
      Py_CLEAR(attribute.name);
      Py_CLEAR(attribute.value);
    }
    attributes_.clear();
    Py_CLEAR(empty_);
  }

 private:
  enum class Source { Same, Pointer, Size };
  struct Attribute {
    PyObject* name;
    PyObject* value;  // for Source::Same
    Source source;
  };

  // One instance made through __init__ with the arguments it was given, and
  // its attributes (new references, or null).
  struct Sample {
    PyObject *pointer = nullptr, *size = nullptr, *instance = nullptr, *attributes = nullptr;
    Sample(PyObject* type, PyObject* context, PyObject* pointer_type, unsigned long long address, long long bytes) {
      PyObject* number = PyLong_FromUnsignedLongLong(address);
      pointer = number ? PyObject_CallOneArg(pointer_type, number) : nullptr;
      Py_XDECREF(number);
      size = PyLong_FromLongLong(bytes);
      if (!pointer || !size) return;
      PyObject* arguments[] = {context, pointer, size};
      instance = PyObject_Vectorcall(type, arguments, 3, nullptr);
      attributes = instance ? PyObject_GenericGetDict(instance, nullptr) : nullptr;  // in the order __init__ set them
    }
    ~Sample() {
      Py_XDECREF(attributes);
      Py_XDECREF(instance);
      Py_XDECREF(size);
      Py_XDECREF(pointer);
    }
  };

  // Whether a class in the type's MRO declares __slots__.
  static bool has_slots(PyTypeObject* type) {
    PyObject* mro = type->tp_mro;
    if (!mro || !PyTuple_Check(mro)) return true;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
      PyObject* base_dict = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict;
      if (base_dict && PyDict_GetItemString(base_dict, "__slots__")) return true;
    }
    return false;
  }

  bool learn_from(const Sample& first, const Sample& second) {
    if (PyDict_Size(first.attributes) != PyDict_Size(second.attributes)) return false;
    bool pointer_seen = false, size_seen = false;
    PyObject *name, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(first.attributes, &position, &name, &value)) {
      PyObject* other = PyDict_GetItemWithError(second.attributes, name);
      Source source;
      if (!other || !PyUnicode_Check(name))
        return false;
      else if (value == first.pointer && other == second.pointer)
        source = Source::Pointer, pointer_seen = true;
      else if (value == first.size && other == second.size)
        source = Source::Size, size_seen = true;
      else if (value == other)
        source = Source::Same;
      else
        return false;  // computed from the arguments, or made afresh per instance
      try {
        attributes_.push_back({name, source == Source::Same ? value : nullptr, source});
      } catch (...) {
        return false;
      }
      Py_INCREF(name);
      Py_XINCREF(attributes_.back().value);
    }
    if (!pointer_seen || !size_seen) return false;
    empty_ = PyTuple_New(0);
    return empty_ != nullptr;
  }

  std::vector<Attribute> attributes_;  // in the order __init__ stores them
  PyObject* empty_ = nullptr;          // (), for object.__new__; set once learnt
};

struct PyAllocator {
  PyObject_HEAD
  Bridge* bridge;
  PyObject* bridge_object;  // keeps the bridge alive
  PyObject* pointer_type;
  PyObject* memory_type;  // for memalloc_memory; may be None
  PyObject* context;      // its first argument
  PointerObjects pointers;
  InstancePrototype prototype;  // of memory_type, where it could be learnt
};

// A new Allocation and its pointer object (new references), or false with the error set.
bool allocate_with_pointer(PyAllocator* self, PyObject* size_object, PyObject** allocation, PyObject** pointer) {
  std::size_t size;
  if (!size_argument(size_object, "memalloc", &size)) return false;
  try {
    *allocation = self->bridge->memalloc_held(size, self->bridge_object);
  } catch (...) {
    set_python_error_from_any(std::current_exception());
    return false;
  }
  *pointer = self->pointers.get(self->pointer_type, reinterpret_cast<PyAllocation*>(*allocation)->held.handle());
  if (!*pointer) {
    Py_DECREF(*allocation);  // gives the memory back
    return false;
  }
  return true;
}

// memalloc(size) -> (Allocation, pointer object)
PyObject* allocator_memalloc(PyObject* object, PyObject* size_object) {
  PyObject *allocation, *pointer;
  if (!allocate_with_pointer(reinterpret_cast<PyAllocator*>(object), size_object, &allocation, &pointer))
    return nullptr;
  PyObject* pair = PyTuple_New(2);
  if (!pair) {
    Py_DECREF(allocation);
    Py_DECREF(pointer);
    return nullptr;
  }
  PyTuple_SET_ITEM(pair, 0, allocation);
  PyTuple_SET_ITEM(pair, 1, pointer);
  return pair;
}

// memalloc_memory(size) -> memory_type(context, pointer, size), its _allocation
// set: the whole of the Numba plugin's memalloc, with no Python frame.
PyObject* allocator_memalloc_memory(PyObject* object, PyObject* size_object) {
  auto* self = reinterpret_cast<PyAllocator*>(object);
  if (self->memory_type == Py_None) {
    PyErr_SetString(PyExc_TypeError, "memalloc_memory: this Allocator was made without a memory_type");
    return nullptr;
  }
  PyObject *allocation, *pointer;
  if (!allocate_with_pointer(self, size_object, &allocation, &pointer)) return nullptr;
  PyObject* memory;
  if (self->prototype.learnt()) {
    memory = self->prototype.make(self->memory_type, pointer, size_object, allocation);
  } else {
    PyObject* arguments[] = {self->context, pointer, size_object};
    memory = PyObject_Vectorcall(self->memory_type, arguments, 3, nullptr);
    if (memory && PyObject_SetAttr(memory, allocation_attribute, allocation) < 0) Py_CLEAR(memory);
  }
  Py_DECREF(pointer);
  Py_DECREF(allocation);  // the memory object holds it now, or it gives the memory back
  return memory;
}

// memhostalloc(size, mapped, portable, wc) -> Allocation of pinned (or
// mapped) host memory: Bridge.memhostalloc without pybind11's dispatcher,
// which cost as much as the pinned pool's whole allocation from Python.
PyObject* allocator_memhostalloc(PyObject* object, PyObject* const* arguments, Py_ssize_t count) {
  if (count != 4) {
    PyErr_Format(PyExc_TypeError, "memhostalloc(size, mapped, portable, wc) takes 4 arguments (%zd given)", count);
    return nullptr;
  }
  std::size_t size;
  if (!size_argument(arguments[0], "memhostalloc", &size)) return nullptr;
  int flags[3];
  for (int i = 0; i < 3; ++i)
    if ((flags[i] = PyObject_IsTrue(arguments[i + 1])) < 0) return nullptr;
  try {
    return reinterpret_cast<PyAllocator*>(object)
        ->bridge->memhostalloc(size, flags[0] != 0, flags[1] != 0, flags[2] != 0, std::string())
        .release()
        .ptr();
  } catch (...) {
    set_python_error_from_any(std::current_exception());
    return nullptr;
  }
}

void allocator_dealloc(PyObject* object) {
  auto* self = reinterpret_cast<PyAllocator*>(object);
  Py_XDECREF(self->bridge_object);
  Py_XDECREF(self->pointer_type);
  Py_XDECREF(self->memory_type);
  Py_XDECREF(self->context);
  self->pointers.clear();
  self->pointers.~PointerObjects();
  self->prototype.forget();
  self->prototype.~InstancePrototype();
  PyTypeObject* type = Py_TYPE(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyMethodDef allocator_methods[] = {
    {"memalloc", allocator_memalloc, METH_O,
     "memalloc(size) -> (Allocation of device memory, its address as the pointer type)"},
    {"memalloc_memory", allocator_memalloc_memory, METH_O,
     "memalloc_memory(size) -> memory_type(context, pointer, size) with ._allocation set to the Allocation"},
    {"memhostalloc", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(allocator_memhostalloc)),
     METH_FASTCALL, "memhostalloc(size, mapped, portable, wc) -> Allocation of pinned host memory"},
    {nullptr, nullptr, 0, nullptr}};
PyObject* allocator_makes_without_init(PyObject* object, void*) {
  return PyBool_FromLong(reinterpret_cast<PyAllocator*>(object)->prototype.learnt());
}
PyGetSetDef allocator_properties[] = {
    {"makes_without_init", allocator_makes_without_init, nullptr,
     "True where memalloc_memory copies a learnt instance's attributes rather than calling memory_type", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};
PyType_Slot allocator_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(allocator_dealloc)},
    {Py_tp_methods, allocator_methods},
    {Py_tp_getset, allocator_properties},
    {Py_tp_doc, const_cast<char*>("Bridge.memalloc and memhostalloc for the Numba plugin's hot paths")},
    {0, nullptr}};
PyType_Spec allocator_spec{"cuemm._core.Allocator", sizeof(PyAllocator), 0, Py_TPFLAGS_DEFAULT, allocator_slots};
PyTypeObject* allocator_type = nullptr;  // made when the module loads; never freed

py::object allocator_of(py::object bridge_object, py::object pointer_type, py::object memory_type, py::object context,
                        bool learn_memory_type) {
  if (!PyCallable_Check(pointer_type.ptr())) throw py::type_error("allocator: pointer_type must be callable");
  if (!memory_type.is_none() && !PyCallable_Check(memory_type.ptr()))
    throw py::type_error("allocator: memory_type must be callable or None");
  auto* self = PyObject_New(PyAllocator, allocator_type);
  if (!self) throw py::error_already_set();
  self->bridge = bridge_object.cast<Bridge*>();
  self->bridge_object = bridge_object.release().ptr();
  self->pointer_type = pointer_type.release().ptr();
  self->memory_type = memory_type.release().ptr();
  self->context = context.release().ptr();
  new (&self->pointers) PointerObjects();
  new (&self->prototype) InstancePrototype();
  py::object made = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
  if (self->memory_type != Py_None && learn_memory_type)
    self->prototype.learn(self->memory_type, self->context, self->pointer_type);
  return made;
}

}  // namespace

// Opens, in this process, an IPC handle that only cuemm can open (a block of
// an exportable stream-ordered pool), for cuemm.numba_plugin's IpcHandle.
class IpcImport {
 public:
  explicit IpcImport(const py::bytes& serialised) {
    const std::string text = serialised;
    handle_.emplace(IpcHandle::from_bytes(std::vector<std::uint8_t>(text.begin(), text.end())));
  }
  // The shared memory's address in device `device`'s primary context.
  std::uintptr_t open(int device) {
    py::gil_scoped_release unlocked;  // takes a descriptor from the exporter, and maps
    opened_ = handle_->open(Device::get(device).primary_context());
    return opened_->device_pointer();
  }
  void close() {
    py::gil_scoped_release unlocked;
    handle_->close();
    opened_.reset();
  }
  bool staged() const { return handle_->is_staged(); }

 private:
  std::optional<IpcHandle> handle_;
  std::shared_ptr<MemoryPointer> opened_;
};

PYBIND11_MODULE(_core, module) {
  module.doc() = "cuemm's C++ memory managers (see cuemm.numba_plugin)";

  // Never destroyed: a static Python object would be released after the interpreter is gone.
  static auto& cuda_error = *new py::exception<CudaError>(module, "CudaError", PyExc_RuntimeError);
  cuda_error_type = cuda_error.ptr();
  py::register_exception_translator([](std::exception_ptr error) {
    if (!set_python_error(error)) std::rethrow_exception(error);  // pybind11's own translators take it
  });

  allocation_attribute = PyUnicode_InternFromString("_allocation");
  if (!allocation_attribute) throw py::error_already_set();
  allocation_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&allocation_spec));
  if (!allocation_type) throw py::error_already_set();
  module.add_object("Allocation", reinterpret_cast<PyObject*>(allocation_type));
  stream_allocation_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&stream_allocation_spec));
  if (!stream_allocation_type) throw py::error_already_set();
  module.add_object("StreamAllocation", reinterpret_cast<PyObject*>(stream_allocation_type));
  allocator_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&allocator_spec));
  if (!allocator_type) throw py::error_already_set();
  module.add_object("Allocator", reinterpret_cast<PyObject*>(allocator_type));

  py::class_<CleanupGuard, std::shared_ptr<CleanupGuard>>(module, "CleanupGuard")
      .def("__enter__", [](std::shared_ptr<CleanupGuard> self) { return self; })
      .def("__exit__", [](CleanupGuard& self, py::args) {
        py::gil_scoped_release unlocked;  // the deferred cleanup may run now
        self.release();
      });

  py::class_<Bridge>(module, "Bridge")
      .def(py::init<int, const std::string&, bool>(), py::arg("device"), py::arg("manager"), py::arg("log") = false)
      .def("initialize", &Bridge::initialize)
      .def("memalloc", [](Bridge& bridge, py::handle size) { return bridge.memalloc(python_size(size, "memalloc")); },
           py::arg("size"))
      .def("memalloc_at",
           [](Bridge& bridge, py::handle size, std::string site) {
             return bridge.memalloc_at(python_size(size, "memalloc"), std::move(site));
           },
           py::arg("size"), py::arg("site"))
      .def("allocator", &allocator_of, py::arg("pointer_type") = py::module_::import("builtins").attr("int"),
           py::arg("memory_type") = py::none(), py::arg("context") = py::none(), py::arg("learn_memory_type") = true,
           "An Allocator for this bridge, whose memalloc and memhostalloc are the fast paths (addresses as "
           "pointer_type; memalloc_memory also makes memory_type(context, pointer, size), by copying a learnt "
           "instance's attributes where learn_memory_type and the type allow)")
      .def("memhostalloc",
           [](Bridge& bridge, py::handle size, bool mapped, bool portable, bool wc, std::string site) {
             return bridge.memhostalloc(python_size(size, "memhostalloc"), mapped, portable, wc, std::move(site));
           },
           py::arg("size"), py::arg("mapped") = false,
           py::arg("portable") = false, py::arg("wc") = false, py::arg("site") = "")
      .def("mempin",
           [](Bridge& bridge, py::object owner, std::uintptr_t pointer, py::handle size, bool mapped) {
             return bridge.mempin(std::move(owner), pointer, python_size(size, "mempin"), mapped);
           },
           py::arg("owner"), py::arg("pointer"), py::arg("size"), py::arg("mapped") = false)
      .def("memallocmanaged",
           [](Bridge& bridge, py::handle size, bool attach_global) {
             return bridge.memallocmanaged(python_size(size, "memallocmanaged"), attach_global);
           },
           py::arg("size"), py::arg("attach_global") = true)
      .def("ipc_handle",
           [](Bridge& bridge, std::uintptr_t address, py::handle size) {
             return bridge.ipc_handle(address, python_size(size, "get_ipc_handle"));
           },
           py::arg("address"), py::arg("size"))
      .def("allocate_on_stream",
           [](py::object self, py::handle size, std::uintptr_t stream, py::object stream_owner, std::string site) {
             return self.cast<Bridge&>().allocate_on_stream(python_size(size, "allocate_on_stream"), stream,
                                                             std::move(stream_owner), std::move(site), self);
           },
           py::arg("size"), py::arg("stream"), py::arg("stream_owner") = py::none(), py::arg("site") = "",
           "A StreamAllocation of `size` bytes, ready for work on `stream` (a CUstream handle) at once, given "
           "back on it when released or dropped; stream_owner (the stream's Python object) is kept alive until then")
      .def("memory_info", &Bridge::memory_info)
      .def("reset", &Bridge::reset)
      .def("defer_cleanup", &Bridge::defer_cleanup)
      .def("statistics", &Bridge::statistics)
      .def("release_unused_memory", &Bridge::release_unused_memory)
      .def("segments", &Bridge::segments)
      .def_property_readonly("wants_call_sites", &Bridge::wants_call_sites)
      .def("outstanding", &Bridge::outstanding)
      .def("leak_report", &Bridge::leak_report)
      .def("log_text", &Bridge::log_text);

  py::class_<IpcImport>(module, "IpcImport")
      .def(py::init<const py::bytes&>(), py::arg("serialised"))
      .def("open", &IpcImport::open, py::arg("device"))
      .def("close", &IpcImport::close)
      .def_property_readonly("staged", &IpcImport::staged);

  module.def("bundled_managers", &bundled_memory_managers);
  module.def("nothing_released", [] { return released_memory_dict(ReleasedMemory{}); },
             "release_unused_memory()'s dict where nothing went back (before cuemm serves a context)");
  module.def("settings_for_other_managers", &settings_for_other_managers, py::arg("manager"),
             "The settings in the environment that are options of bundled managers other than `manager`");
  module.def("check_memory_manager_settings", &check_memory_manager_settings, py::arg("manager"),
             "Checks the environment's settings for the bundled `manager` and its adaptors (ValueError names a bad one)");
  module.def("settings", [] {
    // (name, meaning, the bundled managers it is an option of): cuemm::settings().
    py::list rows;
    for (const Setting& setting : cuemm::settings()) {
      py::list managers;
      for (std::string_view name : setting.manager_names()) managers.append(std::string(name));
      rows.append(py::make_tuple(setting.name, setting.meaning, managers));
    }
    return rows;
  }, "Every environment variable cuemm reads: (name, meaning, the bundled managers it is an option of)");
  module.def("version", &cuemm::version);
  module.def("on_out_of_memory", [](py::object handler) {
    if (!handler.is_none() && !PyCallable_Check(handler.ptr()))
      throw py::type_error("on_out_of_memory: the handler must be callable (or None), not " +
                           std::string(Py_TYPE(handler.ptr())->tp_name));
    py::object previous = out_of_memory_handler();
    out_of_memory_handler() = std::move(handler);
    return previous;
  });
  module.def("memory_plot_svg", [](const std::string& log_text) {
    std::istringstream in(log_text);
    return memory_plot_svg(read_memory_log(in, "the log"));
  }, py::arg("log_text"), "An SVG picture of memory in use over time, from a cuemm CSV log");
  module.def("current_device", [] {
    cuda::CUdevice device = 0;
    CUEMM_CU(cuCtxGetDevice, &device);
    return device;
  }, "The device of the calling thread's current CUDA context");
  module.def("stream_device", [](std::uintptr_t handle) {
    // The device of the context the stream belongs to, so that an array is not
    // allocated in one device's pool on another device's stream.
    cuda::CUcontext owner = nullptr, current = nullptr;
    CUEMM_CU(cuStreamGetCtx, reinterpret_cast<cuda::CUstream>(handle), &owner);
    CUEMM_CU(cuCtxGetCurrent, &current);
    const bool pushed = owner != current;
    if (pushed) CUEMM_CU(cuCtxPushCurrent, owner);
    cuda::CUdevice device = 0;
    const cuda::CUresult got = CUEMM_CU_RESULT(cuCtxGetDevice, &device);
    cuda::CUcontext popped = nullptr;
    if (pushed) CUEMM_CU(cuCtxPopCurrent, &popped);
    if (got != cuda::CUDA_SUCCESS) throw CudaError(got, "cuCtxGetDevice");
    return device;
  }, py::arg("handle"), "The device whose context the stream `handle` belongs to (the current one for 0, 1 and 2)");
  module.def("driver_kind", [] { return simulation::active() ? "simulated" : "cuda"; });
}
