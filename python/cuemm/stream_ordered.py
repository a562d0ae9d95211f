"""Numba device arrays allocated on a stream, from cuemm's pool or async manager.

Numba's plugin interface has no stream, so memory it frees is freed for every
stream at once. Arrays made here go through the manager's stream-ordered calls
instead (as cudaMallocAsync and cudaFreeAsync): the block is ready for work on
`stream` at once, and when the array and every view of it are gone it goes back
on that stream, with no wait on the host. What happens to it then is the
manager's rule. The pool: a block given back on a default stream (Numba's
default, the legacy or the per-thread stream) serves the next request there at
once, with no seal, and so does one given back on a stream of the program's,
for the same thread's next request on that stream; otherwise a block is handed
out again, to any stream, once the work queued there before the free has run.
The async manager: the driver's stream-ordered pool, on any stream.

The manager is the one serving the current device for Numba (the pool unless
CUEMM_MEMORY_MANAGER says otherwise), whether or not Numba itself allocates
through cuemm; the default manager has no stream-ordered calls.
"""

import numpy as np
from numba import cuda
from numba.cuda.api_util import prepare_shape_strides_dtype
from numba.cuda.cudadrv import devicearray
from numba.cuda.cudadrv import driver as _driver

from . import _core
from .numba_plugin import _HoldsAllocation, _bridge_for_device, _caller, _device_pointer


class StreamOrderedMemory(_HoldsAllocation, _driver.MemoryPointer):
    """Numba's MemoryPointer for a block allocated on a stream; free() gives it back on that stream."""

    def __init__(self, context, pointer, size, allocation):
        super().__init__(context, pointer, size)
        self._allocation = allocation

    @property
    def stream_handle(self):
        """The handle of the stream the block goes back on."""
        return self._allocation.stream


_PER_THREAD_STREAM = 2  # CU_STREAM_PER_THREAD


def _numba_stream(stream):
    """Numba's Stream for `stream` (0 for Numba's default stream, as its own arrays
    take), and what must stay alive while a free is queued on it."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return 0, None  # (no Stream object made per array: that cost as much as the allocation)
    if isinstance(stream, _driver.Stream):
        return stream, stream
    if hasattr(stream, "__cuda_stream__"):  # CUDA's stream protocol: (version, handle)
        return cuda.external_stream(int(stream.__cuda_stream__()[1])), stream
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream handle must not be negative (got {stream})")
        return cuda.external_stream(stream), None  # (the caller keeps a raw handle's stream alive)
    raise TypeError(f"stream must be a Numba stream, an object with __cuda_stream__, a stream handle (int) or 0 "
                    f"for the default stream, not {type(stream).__name__}")


def _handle_of(numba_stream):
    if not isinstance(numba_stream, int):
        return int(numba_stream)
    # Numba's default stream: the legacy one, or the per-thread one where Numba is set to use it.
    per_thread = getattr(getattr(_driver, "config", None), "CUDA_PER_THREAD_DEFAULT_STREAM", False)
    return _PER_THREAD_STREAM if per_thread else 0


def _bridge_of(numba_stream, handle):
    context = cuda.current_context()
    if not isinstance(numba_stream, int):
        stream_device = _core.stream_device(handle)  # (asks the driver: any library's stream)
        if stream_device != context.device.id:
            raise ValueError(f"the stream belongs to device {stream_device}, but the current device is "
                             f"{context.device.id} (select it with cuda.select_device or a `with gpus[i]:` block)")
    return context, _bridge_and_call_sites(context.device.id)


_served = {}  # device -> (its bridge, whether it wants call sites): both fixed once the bridge exists


def _bridge_and_call_sites(device):
    served = _served.get(device)
    if served is None:
        bridge = _bridge_for_device(device)
        served = _served[device] = (bridge, bridge.wants_call_sites)
    return served


def memalloc(size, stream=0):
    """`size` bytes of device memory on `stream`, as Numba's MemoryPointer (see the module's docstring)."""
    return _memalloc(size, *_numba_stream(stream))


def _memalloc(size, numba_stream, owner):
    handle = _handle_of(numba_stream)
    context, (bridge, call_sites) = _bridge_of(numba_stream, handle)
    site = _caller() if call_sites else ""
    allocation = bridge.allocate_on_stream(size, handle, (numba_stream, owner), site)
    return StreamOrderedMemory(context, _device_pointer(allocation.address), allocation.size, allocation)


def device_array(shape, dtype=np.float64, strides=None, order="C", stream=0):
    """An empty DeviceNDArray whose memory is allocated on `stream` and given back on it (numba's
    cuda.device_array, stream-ordered). Its copies default to that stream too."""
    return _device_array(shape, dtype, strides, order, *_numba_stream(stream))


def _device_array(shape, dtype, strides, order, numba_stream, owner):
    shape, strides, dtype = prepare_shape_strides_dtype(shape, strides, dtype, order)
    shape, strides = tuple(shape), tuple(strides)  # (a list given: numba-cuda caches sizes by them)
    gpu_data = None
    if 0 not in shape:  # (Numba gives an empty array a null pointer of its own)
        gpu_data = _memalloc(_driver.memory_size_from_info(shape, strides, dtype.itemsize), numba_stream, owner)
    return devicearray.DeviceNDArray(shape, strides, dtype, stream=numba_stream, gpu_data=gpu_data)


def device_array_like(ary, stream=0):
    """device_array() with `ary`'s shape, strides and dtype."""
    return _device_array_like(ary, *_numba_stream(stream))


def _device_array_like(ary, numba_stream, owner):
    order = "F" if ary.flags.f_contiguous and not ary.flags.c_contiguous else "C"
    strides = ary.strides if ary.flags.c_contiguous or ary.flags.f_contiguous else None
    return _device_array(ary.shape, ary.dtype, strides, order, numba_stream, owner)


def to_device(obj, stream=0, copy=True):
    """A DeviceNDArray allocated on `stream` holding a copy of the host array `obj`, copied on that stream."""
    numba_stream, owner = _numba_stream(stream)
    host = np.asarray(obj)
    if not (host.flags.c_contiguous or host.flags.f_contiguous):
        host = np.ascontiguousarray(host)
    array = _device_array_like(host, numba_stream, owner)
    if copy and array.size:
        array.copy_to_device(host, stream=numba_stream)  # (0: Numba's default stream)
    return array
