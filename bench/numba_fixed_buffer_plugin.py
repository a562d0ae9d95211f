"""A do-nothing Numba EMM plugin: every allocation returns the same buffer.

Numba's own cost per allocation, with no memory manager work at all: the floor
that cuemm's plugin is measured against (bench_numba.py). Never use it for real.
"""
from numba.cuda.cudadrv import driver as _driver

_BUFFER_BYTES = 128 << 20


class FixedBufferManager(_driver.HostOnlyCUDAMemoryManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._buffer = None

    def initialize(self):
        if self._buffer is None:
            if getattr(_driver, "USE_NV_BINDING", hasattr(_driver, "binding")):
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

    def get_memory_info(self):
        return _driver.MemoryInfo(free=0, total=_BUFFER_BYTES)

    def get_ipc_handle(self, memory):
        raise NotImplementedError

    @property
    def interface_version(self):
        return 1


_numba_memory_manager = FixedBufferManager
