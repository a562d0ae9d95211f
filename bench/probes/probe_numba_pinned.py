"""What a Numba `pinned_array` pair costs through cuemm's pinned host pool, by size,
with the sizes in blocks of their own and alternated every 1000 pairs (as
bench_numba.py's interleaved run does), and how many seals the pool made a pair.

    PYTHONPATH=build/python python3 bench/probes/probe_numba_pinned.py
"""
import time

import numpy as np

import cuemm

cuemm.use_cuemm_for_numba()
from numba import cuda  # noqa: E402  (after the plugin is chosen)

SIZES = [4096, 1 << 20, 64 << 20]
PAIRS = 1000


def seals():
    return cuemm.statistics()["pinned_host_pool"]["seals"]


def loop(size, pairs=PAIRS):
    began = time.perf_counter_ns()
    for _ in range(pairs):
        array = cuda.pinned_array(size, dtype=np.uint8)
        del array
    return (time.perf_counter_ns() - began) / pairs


def median(values):
    return sorted(values)[len(values) // 2]


cuda.current_context()
for size in SIZES:
    loop(size, 5000)
for order in ("alternated", "blocked", "alternated"):
    times = {size: [] for size in SIZES}
    sealed = {size: 0 for size in SIZES}
    rounds = [(size, r) for r in range(10) for size in SIZES] if order == "alternated" else \
        [(size, r) for size in SIZES for r in range(10)]
    for size, _ in rounds:
        before = seals()
        times[size].append(loop(size))
        sealed[size] += seals() - before
    print(order + ": " + ", ".join(f"{size} B {median(times[size]):,.0f} ns ({sealed[size] / (10 * PAIRS):.3f} seals a pair)"
                                   for size in SIZES))
print("pinned host pool:", cuemm.statistics()["pinned_host_pool"])
