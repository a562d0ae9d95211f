"""A do-nothing Numba EMM plugin: every allocation returns the same buffer.

Numba's own cost per allocation, with no memory manager work at all: the floor
that cuemm's plugin is measured against (bench_numba.py). Device, pinned and
mapped requests each get one fixed buffer, wrapped in the pointer class Numba
builds for them (a mapped one owned, as Numba's own manager returns it). Never
use it for real.
"""
import ctypes
import weakref

from numba.cuda.cudadrv import driver as _driver

_BUFFER_BYTES = 128 << 20
_CU_MEMHOSTALLOC_DEVICEMAP = 0x02  # cuda.h
_USE_NV_BINDING = getattr(_driver, "USE_NV_BINDING", hasattr(_driver, "binding"))


class FixedBufferManager(_driver.HostOnlyCUDAMemoryManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._buffer = None
        self._host_buffers = {}  # mapped -> pointer
        self._alive = {}  # the MappedMemory objects handed out, by serial number
        self._serial = 0

    def initialize(self):
        if self._buffer is None:
            if _USE_NV_BINDING:
                self._buffer = _driver.driver.cuMemAlloc(_BUFFER_BYTES)
            else:
                import ctypes
                from numba.cuda.cudadrv import drvapi
                pointer = drvapi.cu_device_ptr()
                _driver.driver.cuMemAlloc(ctypes.byref(pointer), _BUFFER_BYTES)
                self._buffer = pointer

    def memalloc(self, size):
        if size > _BUFFER_BYTES:
            raise MemoryError("the fixed buffer is smaller than the request")
        return _driver.MemoryPointer(self.context, self._buffer, size)

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        if size > _BUFFER_BYTES:
            raise MemoryError("the fixed buffer is smaller than the request")
        pointer = self._host_buffers.get(mapped)
        if pointer is None:
            flags = _CU_MEMHOSTALLOC_DEVICEMAP if mapped else 0
            if _USE_NV_BINDING:
                pointer = _driver.driver.cuMemHostAlloc(_BUFFER_BYTES, flags)
            else:
                pointer = ctypes.c_void_p()
                _driver.driver.cuMemHostAlloc(ctypes.byref(pointer), _BUFFER_BYTES, flags)
            self._host_buffers[mapped] = pointer
        context = weakref.proxy(self.context)
        if mapped:
            # Numba keeps the MappedMemory alive while its owned view is; so does this.
            self._serial += 1
            key, alive = self._serial, self._alive
            memory = _driver.MappedMemory(context, pointer, size, finalizer=lambda: alive.pop(key, None))
            alive[key] = memory
            return memory.own()
        return _driver.PinnedMemory(context, pointer, size)

    def get_memory_info(self):
        return _driver.MemoryInfo(free=0, total=_BUFFER_BYTES)

    def get_ipc_handle(self, memory):
        raise NotImplementedError

    @property
    def interface_version(self):
        return 1


_numba_memory_manager = FixedBufferManager
