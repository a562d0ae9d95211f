"""The Numba EMM plugin: every Numba allocation through cuemm's C++ managers.

Selected with NUMBA_CUDA_MEMORY_MANAGER=cuemm or cuemm.use_cuemm_for_numba().
Implements the whole BaseCUDAMemoryManager: device memory from the chosen
manager (pool by default), pinned and mapped host memory from its pinned host
pool, managed memory, IPC handles with the block's offset in its segment,
real memory info, reset and defer_cleanup.

Works with numba-cuda (pointers as cuda.bindings objects) and with classic
Numba's own CUDA target (ctypes pointers).

defer_cleanup(): while the context manager is active, host memory released
by Numba stays pending and the pool returns no memory to the driver (blocks
are still reused within the pool, which is safe: reuse waits for the GPU).
"""

import contextlib
import ctypes
import os
import sys
import threading
import weakref

from numba.cuda.cudadrv import driver as _driver

from . import _core

# numba-cuda always uses cuda.bindings (and has no USE_NV_BINDING); classic Numba
# uses ctypes unless NUMBA_CUDA_USE_NVIDIA_BINDING is set.
_USE_NV_BINDING = getattr(_driver, "USE_NV_BINDING", hasattr(_driver, "binding"))

if _USE_NV_BINDING:
    _binding = _driver.binding
    _device_pointer = _binding.CUdeviceptr

    def _host_pointer(address):
        return address

    def _address_of(pointer):
        return int(pointer)

    def _ipc_mem_handle(raw):
        handle = _binding.CUipcMemHandle()
        handle.reserved = raw
        return handle

else:
    from numba.cuda.cudadrv import drvapi as _drvapi

    _device_pointer = _drvapi.cu_device_ptr
    _host_pointer = ctypes.c_void_p

    def _address_of(pointer):
        return pointer if isinstance(pointer, int) else pointer.value

    def _ipc_mem_handle(raw):
        return _drvapi.cu_ipc_mem_handle.from_buffer_copy(raw)


class CuemmIpcHandle(_driver.IpcHandle):
    """Numba's IpcHandle for memory the driver has no IPC handle for (a block of
    an exportable stream-ordered pool, CUEMM_ASYNC_EXPORTABLE=1): cuemm opens it,
    taking the pool's descriptor from the exporting process. Pickles as cuemm's
    serialised handle; the importing process needs cuemm, not its plugin."""

    def __init__(self, base, exported, size, source_info=None, offset=0):
        super().__init__(base, _ipc_mem_handle(bytes(64)), size, source_info, offset)
        self._exported = bytes(exported)
        self._import = None

    def open(self, context):
        if self._import is not None:
            raise ValueError("IpcHandle is already opened")
        opened = _core.IpcImport(self._exported)  # direct or staged, as the devices allow
        address = opened.open(context.device.id)
        self._import = opened
        return _driver.MemoryPointer(context, _device_pointer(address), self.size)

    def open_direct(self, context):
        return self.open(context)

    def open_staged(self, context):
        return self.open(context)

    def close(self):
        if self._import is None:
            raise ValueError("IpcHandle not opened")
        self._import.close()
        self._import = None

    def __reduce__(self):
        return (_rebuild_cuemm_ipc_handle, (self._exported, self.size, self.source_info, self.offset))


def _rebuild_cuemm_ipc_handle(exported, size, source_info, offset):
    return CuemmIpcHandle(None, exported, size, source_info, offset)


_bridges = {}  # device id -> _core.Bridge, shared by the contexts Numba makes for it
_bridges_lock = threading.Lock()
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_NUMBA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(_driver.__file__)))


def bridges():
    with _bridges_lock:
        return dict(_bridges)


def _bridge_for_device(device):
    with _bridges_lock:
        bridge = _bridges.get(device)
        if bridge is None:
            manager = os.environ.get("CUEMM_MEMORY_MANAGER") or "pool"
            bridge = _core.Bridge(device, manager, log=os.environ.get("CUEMM_LOG") == "1")
            _bridges[device] = bridge
        return bridge


def _caller():
    """file:line of the first caller outside Numba and cuemm (for the log and the leak report)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_NUMBA_DIR) and not path.startswith(_PACKAGE_DIR):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


# Device and pinned memory hold their cuemm allocation: when Numba drops the
# pointer (and every view of it, which keeps its base alive) the allocation
# goes and gives the memory back at once. This needs no weakref finalizer,
# which is most of Numba's own cost per allocation. free() still frees early.
class _HoldsAllocation:
    """free() of a pointer that holds its cuemm allocation in _allocation."""

    def free(self):
        if not self._allocation.alive:
            raise RuntimeError("Freeing dead memory")
        self._allocation.release()


class _DeviceMemory(_HoldsAllocation, _driver.MemoryPointer):
    """MemoryPointer's own __init__; memalloc sets _allocation (an __init__ here cost 80 ns a call)."""


class _PinnedMemory(_HoldsAllocation, _driver.PinnedMemory):
    def __init__(self, context, pointer, size, allocation, owner=None):
        super().__init__(context, pointer, size, owner=owner)
        self._allocation = allocation


# The C type that gives Numba's host pointers the buffer protocol (numba's
# mviewbuf.MemAlloc, wherever this Numba keeps the module).
_BufferExporter = next(base for base in _driver.PinnedMemory.__mro__ if base.__name__ == "MemAlloc")


class _MappedMemory(_HoldsAllocation, _driver.MappedMemory, _BufferExporter):
    """Mapped host memory as one object: Numba's MappedMemory and its owned view.

    Numba's own manager returns MappedMemory(...).own(): a second object that
    exports the buffer, and two weakref finalizers that free the memory when
    both are gone. Here the memory goes when this object goes (it holds the
    allocation), and the device address comes from the pool, which asked the
    driver once per block; MappedMemory.__init__ asks it at every allocation.
    Those three were a third to a half of Numba's cost per mapped_array (on
    the GPU machine, against a do-nothing plugin that wraps as Numba does).
    refct stays 1, as for an owned pointer: a view of it (MemoryPointer.view)
    then never frees it when the view dies.
    """

    def __init__(self, context, host_pointer, device_pointer, size, allocation, owner=None):
        _driver.MemoryPointer.__init__(self, context, device_pointer, size)
        self.owned = owner
        self.host_pointer = self.handle = host_pointer
        self._bufptr_ = _address_of(host_pointer)
        self._buflen_ = size
        self._allocation = allocation


class CuemmNumbaManager(_driver.BaseCUDAMemoryManager):
    """cuemm's memory manager for Numba (EMM plugin interface version 1)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bridge = None
        self._allocate_device = None  # the bridge's (Allocation, pointer) memalloc, when not logging call sites
        self._allocate_host = None  # the bridge's fast memhostalloc, when not logging call sites
        self._context_proxy = None
        self._call_sites = False  # a log or tracking wants call sites (fixed when the bridge is made)
        self._initialized = False
        # Managed memory is handed out through own(), as Numba does (a view
        # that exports the buffer). own()'s reference is weak: this keeps the
        # pointers alive until released. (Mapped memory is one _MappedMemory.)
        self._owned = {}

    # --- the plugin interface ---

    def initialize(self):
        # Numba calls this before every allocation; the manager needs it once.
        if not self._initialized:
            self._get_bridge().initialize()
            self._initialized = True

    def memalloc(self, size):
        # Runs until the bridge exists, and when a log or tracking wants call sites;
        # otherwise this instance's memalloc is the bridge's (see _get_bridge).
        self._get_bridge()
        if self._allocate_device is not None:
            return self.memalloc(size)
        allocation = self._bridge.memalloc_at(size, _caller())
        memory = _DeviceMemory(self._context_proxy, _device_pointer(allocation.address), size)
        memory._allocation = allocation
        return memory

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        allocate = self._allocate_host
        if allocate is None:  # until the bridge exists, and when a log or tracking wants call sites
            bridge = self._get_bridge()
            allocate = self._allocate_host or (
                lambda *arguments: bridge.memhostalloc(*arguments, _caller() if self._call_sites else ""))
        allocation = allocate(size, mapped, portable, wc)
        context = self._context_proxy
        pointer = _host_pointer(allocation.host_address)
        if mapped:
            return _MappedMemory(context, pointer, _device_pointer(allocation.address), size, allocation)
        return _PinnedMemory(context, pointer, size, allocation)

    def mempin(self, owner, pointer, size, mapped=False):
        address = _address_of(pointer)
        allocation = self._get_bridge().mempin(owner, address, size, mapped)
        context = self._context_proxy
        if isinstance(pointer, int) and not _USE_NV_BINDING:
            pointer = ctypes.c_void_p(pointer)
        if mapped:
            return _MappedMemory(context, pointer, _device_pointer(allocation.address), size, allocation, owner=owner)
        return _PinnedMemory(context, pointer, size, allocation, owner=owner)

    def memallocmanaged(self, size, attach_global=True):
        allocation = self._get_bridge().memallocmanaged(size, attach_global)
        owned = self._owned
        key = id(allocation)

        def release():
            owned.pop(key, None)
            allocation.release()

        memory = _driver.ManagedMemory(self._context_proxy, _device_pointer(allocation.address), size,
                                       finalizer=release)
        owned[key] = memory
        return memory.own()

    def get_ipc_handle(self, memory):
        # (Numba hands over an OwnedPointer, which forwards to its MemoryPointer.)
        if getattr(memory, "handle", None) is None or getattr(memory, "size", None) is None:
            raise TypeError("get_ipc_handle: expected device memory from this manager (a MemoryPointer), not "
                            + type(memory).__name__)
        raw, offset, _, exported = self._get_bridge().ipc_handle(_address_of(memory.handle), memory.size)
        source_info = self.context.device.get_device_identity()
        if exported is not None:
            return CuemmIpcHandle(memory, exported, memory.size, source_info, offset=offset)
        return _driver.IpcHandle(memory, _ipc_mem_handle(raw), memory.size, source_info, offset=offset)

    def get_memory_info(self):
        free, total = self._get_bridge().memory_info()
        return _driver.MemoryInfo(free=free, total=total)

    def reset(self):
        if self._bridge is not None:
            self._bridge.reset()
        self._initialized = False
        self._owned.clear()

    @contextlib.contextmanager
    def defer_cleanup(self):
        with self._get_bridge().defer_cleanup():
            yield

    @property
    def interface_version(self):
        return 1

    # --- helpers ---

    def _get_bridge(self):
        if self._bridge is None:  # (once per context)
            if self.context is None:
                raise RuntimeError("this cuemm manager was made without a context (the version probe)")
            device = getattr(self.context.device, "id", None)
            if not isinstance(device, int):  # a context attached from elsewhere: ask the driver
                device = _core.current_device()
            self._bridge = _bridge_for_device(device)
            self._context_proxy = weakref.proxy(self.context)
            self._call_sites = self._bridge.wants_call_sites
            if not self._call_sites:
                allocator = self._bridge.allocator(_device_pointer, _DeviceMemory, self._context_proxy)
                self._allocate_device = allocator.memalloc
                self._allocate_host = allocator.memhostalloc
                # Numba's calls to memalloc go straight to C++ from now on (this
                # instance's attribute hides the method below): no Python frame.
                self.memalloc = allocator.memalloc_memory
        return self._bridge
