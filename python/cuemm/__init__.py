"""cuemm: CUDA memory managers in C++, usable from Numba.

    import cuemm
    cuemm.use_cuemm_for_numba("pool", initial_size="1G")   # or NUMBA_CUDA_MEMORY_MANAGER=cuemm
    from numba import cuda
    d = cuda.device_array(1 << 20)
    print(cuemm.statistics()["device"]["current_bytes"])

Importing cuemm does not import Numba; the plugin class is made on first use.
The manager and its options also come from the environment: CUEMM_MEMORY_MANAGER
(pool, async or default; pool when unset), CUEMM_POOL_INITIAL_SIZE, CUEMM_ADAPTORS,
CUEMM_LOG_FILE and the others listed in the README.
"""

import os
import warnings

from . import _core
from ._core import CudaError

__version__ = _core.version()

__all__ = [
    "use_cuemm_for_numba",
    "statistics",
    "release_unused_memory",
    "segments",
    "on_out_of_memory",
    "write_log",
    "plot",
    "outstanding",
    "leak_report",
    "bundled_managers",
    "manager_options",
    "device_array",
    "device_array_like",
    "to_device",
    "memalloc",
    "CudaError",
]

# The options of use_cuemm_for_numba() that any manager takes, and the variables they set.
_COMMON_VARIABLES = {"adaptors": "CUEMM_ADAPTORS", "limit": "CUEMM_LIMIT", "log_file": "CUEMM_LOG_FILE"}


def manager_options():
    """Each bundled manager's options for use_cuemm_for_numba(), and the variable each sets.

    They come from the library's table of settings: CUEMM_POOL_INITIAL_SIZE is
    the pool's initial_size, CUEMM_PINNED_HOST_POOL the pool's and async's
    pinned_host_pool.
    """
    options = {manager: {} for manager in bundled_managers()}
    for name, _meaning, managers in _core.settings():
        for manager in managers:
            option = name.removeprefix("CUEMM_").removeprefix(manager.upper() + "_").lower()
            options[manager][option] = name
    return options


def bundled_managers():
    """The names use_cuemm_for_numba() accepts."""
    return list(_core.bundled_managers())


def use_cuemm_for_numba(manager=None, *, log=False, **options):
    """Makes Numba allocate through cuemm's `manager` ("pool", "async" or "default").

    Options are the manager's (manager_options(): pool's initial_size,
    maximum_size, thread_cache_size, expandable, ...; async's release_threshold,
    exportable, pinned_host_pool) and, for any manager, adaptors, limit and
    log_file; sizes may be numbers or strings such as "512M". log=True
    keeps a CSV log in memory for write_log() and plot(). Call it before Numba
    creates a context (before the first allocation or kernel launch): once a
    context exists (until cuda.close()), a choice that would not reach it is a
    RuntimeError, and nothing is changed.
    """
    manager = manager or os.environ.get("CUEMM_MEMORY_MANAGER") or "pool"
    by_manager = manager_options()
    if manager not in by_manager:
        raise ValueError(f"unknown cuemm manager {manager!r}; choose one of {sorted(by_manager)}")
    known = dict(_COMMON_VARIABLES, **by_manager[manager])
    settings = {"CUEMM_MEMORY_MANAGER": manager}
    for name, value in options.items():
        if name not in known:
            raise TypeError(f"the {manager} manager has no option {name!r} (options: {', '.join(sorted(known))})")
        if isinstance(value, bool):
            value = int(value)
        settings[known[name]] = str(value)
    if log:
        settings["CUEMM_LOG"] = "1"
    _refuse_once_numba_has_contexts(settings)
    # A bad value is refused here, with the environment as it was, rather
    # than at Numba's first allocation.
    earlier = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        _core.check_memory_manager_settings(manager)
    except Exception:
        for name, value in earlier.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        raise
    unused = _core.settings_for_other_managers(manager)
    if unused:
        warnings.warn(f"{', '.join(unused)} set, but the {manager} manager does not read "
                      f"{'it' if len(unused) == 1 else 'them'}", stacklevel=2)
    from numba import cuda
    from .numba_plugin import CuemmNumbaManager

    cuda.set_memory_manager(CuemmNumbaManager)


def _refuse_once_numba_has_contexts(settings):
    # A context keeps the manager it was made with: a later choice would be
    # ignored without a word. (Numba's devices are looked at, none made.)
    import sys
    driver_module = sys.modules.get("numba.cuda.cudadrv.driver")
    devices = getattr(getattr(driver_module, "driver", None), "__dict__", {}).get("devices", {})
    made = [(device.id, device.primary_context) for device in list(devices.values())
            if getattr(device, "primary_context", None) is not None]
    changed = sorted(name for name, value in settings.items() if os.environ.get(name) != value)
    for device, context in made:
        manager = type(context.memory_manager).__name__
        if manager != "CuemmNumbaManager":
            raise RuntimeError(f"use_cuemm_for_numba() must come before Numba makes a context: device {device} "
                               f"has one already, with Numba's memory manager {manager}")
        if changed:
            raise RuntimeError(f"cuemm already serves Numba's context on device {device}; the settings "
                               f"{', '.join(changed)} would not reach it (choose them before the first context)")


def _bridges():
    from .numba_plugin import bridges

    return bridges()


def statistics(device=None):
    """Counts of what cuemm handed out to Numba on `device` (default: the current one);
    with the pool manager, also its own figures under "pool" (reserved bytes, seals, the
    driver calls that took and gave back memory, and queued_large_frees: large arrays
    dropped on a thread that did not make them, queued for the thread at work in the
    pool rather than waiting for its lock, and queued_small_frees: the same of sizes
    up to 1 MiB, where the dropping thread does not allocate that size itself); with
    a manager that pools pinned host memory (pool, async), that pool's under
    "pinned_host_pool" (bytes allocated and cached, hits, of those front_hits (served
    by the calling thread's own cache), misses, and seals: waits for the GPU's queued
    work before reuse)."""
    bridge = _bridge_for(device)
    return bridge.statistics()


def release_unused_memory(device=None):
    """Gives the memory cuemm keeps for reuse on `device` back to the driver, for other
    libraries to use (as torch.cuda.empty_cache() or CuPy's free_all_blocks()): the pool's
    free segments, the async manager's driver pool down to what is in use, the cached
    pinned host blocks, and deferred frees. Arrays still alive are untouched; inside
    defer_cleanup() nothing is released. Returns the bytes released, as a dict of
    device_bytes, pinned_host_bytes, deferred_frees and deferred_bytes. Before cuemm
    serves any context it holds nothing, and releases nothing (as empty_cache() then)."""
    if device is None and not _bridges():
        return _core.nothing_released()
    return _bridge_for(device).release_unused_memory()


def segments(device=None):
    """The pool manager's segments on `device`, by address: dicts of kind ("shared",
    "small", "own", "split spares" or "arena"), address, size, mapped_bytes, free_bytes,
    free_blocks and largest_free_block. Where free bytes lie in many small blocks, a
    request larger than each fails though the total would hold it (fragmentation).
    Blocks kept by threads' caches or waiting for the GPU count as held."""
    return _bridge_for(device).segments()


def on_out_of_memory(handler):
    """Sets the function cuemm calls when an allocation runs out of memory (on any
    device), and returns the one it replaces (None: none). handler(size, attempt) may
    free memory held elsewhere (gc.collect(), torch.cuda.empty_cache(), CuPy's
    free_all_blocks(), a cache of the program's own); the allocation is tried again
    while it returns True, and fails with MemoryError once it returns False (attempt:
    1 after the first failure, 2 after the first retry, ...; after 100 retries the
    allocation fails with MemoryError saying so). An exception it raises
    fails the allocation. An allocation inside the handler that runs out does not
    call it again. None removes it."""
    return _core.on_out_of_memory(handler)


def write_log(path, device=None):
    """Writes the CSV log of this process's allocations (needs log=True, CUEMM_LOG=1 or the log adaptor)."""
    text = _log_text(device)
    with open(path, "w") as out:
        out.write(text)


def plot(path, device=None):
    """Writes an SVG picture of device, host and managed memory in use over time, from the CSV log."""
    with open(path, "w") as out:
        out.write(_core.memory_plot_svg(_log_text(device)))


def outstanding(device=None):
    """The allocations still live on `device`, oldest first: dicts of kind, address, size,
    start (seconds since cuemm was loaded) and call_site (the Python file:line that allocated).
    Needs the tracking adaptor: adaptors="tracking" or CUEMM_ADAPTORS=tracking."""
    return _bridge_for(device).outstanding()


def leak_report(device=None):
    """outstanding() as the text that the tracking adaptor prints at reset and at exit ("" if none)."""
    return _bridge_for(device).leak_report()


def _stream_ordered():
    # Imported at the first call (it imports Numba), then kept: an import
    # statement at every call cost as much as the allocation.
    global _stream_ordered_module
    if _stream_ordered_module is None:
        from . import stream_ordered

        _stream_ordered_module = stream_ordered
    return _stream_ordered_module


_stream_ordered_module = None


def device_array(shape, dtype=float, strides=None, order="C", stream=0):
    """Numba's cuda.device_array, allocated on `stream` and given back on it when dropped,
    with no wait on the host; when the block serves again is the manager's rule (the pool:
    at once on a default stream, after the stream's queued work elsewhere; cuemm.stream_ordered). `stream`: a Numba stream, an object with __cuda_stream__, a
    stream handle, or 0 for the default stream. Needs the pool or async manager."""
    return _stream_ordered().device_array(shape, dtype, strides, order, stream)


def device_array_like(ary, stream=0):
    """device_array() with the shape, strides and dtype of `ary`."""
    return _stream_ordered().device_array_like(ary, stream)


def to_device(obj, stream=0, copy=True):
    """Numba's cuda.to_device, allocated on `stream` (as device_array()) and copied on it."""
    return _stream_ordered().to_device(obj, stream, copy)


def memalloc(size, stream=0):
    """`size` bytes of device memory on `stream`, as Numba's MemoryPointer (as device_array())."""
    return _stream_ordered().memalloc(size, stream)


def _log_text(device):
    return _bridge_for(device).log_text()


def _bridge_for(device):
    bridges = _bridges()
    if not bridges:
        raise RuntimeError("cuemm has not allocated anything for Numba yet (no context uses it)")
    if device is None:
        from numba import cuda

        device = cuda.get_current_device().id
    if device not in bridges:
        raise ValueError(f"cuemm serves no context on device {device} (it serves {sorted(bridges)})")
    return bridges[device]


def __getattr__(name):
    # NUMBA_CUDA_MEMORY_MANAGER=cuemm imports this module and reads
    # _numba_memory_manager: made here, so that `import cuemm` needs no Numba.
    if name == "_numba_memory_manager":
        from .numba_plugin import CuemmNumbaManager

        return CuemmNumbaManager
    raise AttributeError(f"module 'cuemm' has no attribute {name!r}")
