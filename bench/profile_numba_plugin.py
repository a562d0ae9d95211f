"""Where the cuemm plugin's time goes in Numba's device_array, step by step.

Run with NUMBA_CUDA_MEMORY_MANAGER=cuemm (and cuemm importable). Each line is
the median over rounds of ns per operation, in one process, so the steps can
be compared with each other and with the floor (a MemoryPointer around a fixed
buffer, which is all bench/numba_fixed_buffer_plugin.py does):

    python3 bench/profile_numba_plugin.py [--size 256] [--rounds 7]

A diagnosis tool: bench_numba.py is the measurement that RESULTS.md reports.
"""
import argparse
import statistics
import time
import weakref

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver as _driver


def per_operation(function, count, rounds):
    samples = []
    for _ in range(rounds):
        began = time.perf_counter_ns()
        for _ in range(count):
            function()
        samples.append((time.perf_counter_ns() - began) / count)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    size = args.size

    context = cuda.current_context()
    manager = context.memory_manager
    if type(manager).__name__ != "CuemmNumbaManager":
        raise SystemExit("run with NUMBA_CUDA_MEMORY_MANAGER=cuemm")
    for _ in range(2000):
        cuda.device_array(size, dtype=np.uint8)
    from cuemm import numba_plugin as plugin

    allocate = manager._allocate_device
    proxy = weakref.proxy(context)
    fixed, fixed_pointer = allocate(size)  # kept: the floor's buffer
    through_init = manager._bridge.allocator(plugin._device_pointer, plugin._DeviceMemory, proxy,
                                                    learn_memory_type=False).memalloc_memory

    steps = [
        ("floor: MemoryPointer(fixed buffer)", lambda: _driver.MemoryPointer(context, fixed_pointer, size)),
        ("C++: allocate + release (Allocation, pointer)", lambda: allocate(size)),
        ("Allocation.address", lambda: fixed.address),
        ("pointer object from an address", lambda: plugin._device_pointer(123456768)),
        ("MemoryPointer, then one attribute", lambda: setattr(_driver.MemoryPointer(proxy, fixed_pointer, size), "_a", fixed)),
        ("_DeviceMemory (fixed buffer)", lambda: setattr(plugin._DeviceMemory(proxy, fixed_pointer, size), "_allocation", fixed)),
        ("plugin memalloc (whole)", lambda: manager.memalloc(size)),
        ("plugin memalloc, calling _DeviceMemory", lambda: through_init(size)),
        ("device_array (cuemm)", lambda: cuda.device_array(size, dtype=np.uint8)),
    ]
    for label, function in steps:
        print(f"{label:45s} {per_operation(function, args.count, args.rounds):9.0f} ns")


if __name__ == "__main__":
    main()
