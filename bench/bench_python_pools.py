"""The pools Python programs use today beside cuemm's pool, from Python: CuPy's
MemoryPool and PyTorch's caching allocator, each called as its users call it.

    python3 bench/bench_python_pools.py --cuemm build/python --tool build/bin/cuemm --out pools.json

Two measurements, every allocator in this one process:

- allocate+free pairs, ns each: rounds in which each size runs each allocator's
  loop in turn (so that the host's drift falls on all alike); medians over the
  rounds, and the median of the per-round ratios to cuemm's pool. cuemm's pool
  through its Python bridge (`Bridge.allocator().memalloc`, the Numba plugin's
  fast path, and `Bridge.allocate_on_stream` on the legacy stream, what
  `cuemm.device_array(stream=...)` calls), CuPy's `MemoryPool.malloc`, PyTorch's
  `caching_allocator_alloc`/`caching_allocator_delete`, and a Python call that
  allocates nothing (the interpreter's own floor).
- peak reserved over peak live on the operations of `cuemm random`'s workloads:
  each run once under the logging adaptor (on the simulated driver: the
  operations do not depend on it), then its CSV log replayed through CuPy's
  pool (its own count, `total_bytes()`, and the device's free memory lost,
  since `cudaMalloc` takes whole 2 MiB pages from 2 MiB up) and PyTorch's
  (`max_memory_reserved()`), and through cuemm's pool and the best fit by
  `cuemm replay` on this machine's driver.

An allocator whose module is missing is left out, and the output says so.
Needs a GPU for CuPy and PyTorch; cuemm alone also runs on the simulated driver.
"""
import argparse
import csv
import datetime
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [256, 64 << 10, 1 << 20, 4 << 20, 64 << 20]
PAIRS_PER_LOOP = 2000
# The seed workloads of scripts/fragmentation-common.sh that RMM's benchmark
# and training programs make (the queues' lengths are the tool's own).
WORKLOADS = [
    ("RMM's random workload up to 4 MiB, 512 MiB live", "--max-size 4M --live 512M --operations 20000"),
    ("up to 1 MiB, 512 MiB live", "--max-size 1M --live 512M --operations 20000"),
    ("up to 256 KiB, 64 MiB live", "--max-size 256K --live 64M --operations 20000"),
    ("up to 64 MiB, 256 MiB live", "--max-size 64M --live 256M --operations 20000"),
    ("up to 4 MiB, 128 MiB live", "--max-size 4M --live 128M --operations 20000"),
    ("training steps, round sizes", "--pattern training"),
    ("training steps, each layer's sizes its own", "--pattern training --shapes per-layer"),
    ("a queue freed oldest first, up to 1 MiB", "--pattern queue"),
]


def pair_loops(cuemm_core):
    """Each allocator's loop of `count` allocate+free pairs of `size` bytes, by
    name, and the names of those left out with why."""
    loops, missing = {}, {}
    bridge = cuemm_core.Bridge(0, "pool")
    bridge.initialize()
    memalloc = bridge.allocator().memalloc

    def cuemm_pool(size, count):
        for _ in range(count):
            memalloc(size)  # (the Allocation it returns is released at once)
    loops["cuemm pool"] = cuemm_pool
    allocate_on_stream = bridge.allocate_on_stream

    def cuemm_pool_on_a_stream(size, count):
        for _ in range(count):
            allocate_on_stream(size, 0)  # (given back on the legacy stream as it is dropped)
    loops["cuemm pool, stream-ordered"] = cuemm_pool_on_a_stream

    try:
        import cupy
        malloc = cupy.cuda.MemoryPool().malloc

        def cupy_pool(size, count):
            for _ in range(count):
                malloc(size)  # (the MemoryPointer goes back to the pool when dropped)
        loops["CuPy MemoryPool"] = cupy_pool
    except Exception as error:  # (an ImportError, or no GPU for CuPy)
        missing["CuPy MemoryPool"] = f"{type(error).__name__}: {error}"

    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

        def torch_caching(size, count):
            for _ in range(count):
                delete(alloc(size))
        loops["PyTorch caching allocator"] = torch_caching
    except Exception as error:
        missing["PyTorch caching allocator"] = f"{type(error).__name__}: {error}"

    def nothing(size):
        return size, size

    def floor(size, count):
        for _ in range(count):
            nothing(size)
    loops["a Python call (floor)"] = floor
    return bridge, loops, missing


def time_pairs(loops, rounds):
    """Per allocator and size: ns a pair in each round."""
    for loop in loops.values():  # warm: each pool keeps blocks of every size
        for size in SIZES:
            loop(size, PAIRS_PER_LOOP)
    samples = {name: {str(size): [] for size in SIZES} for name in loops}
    for _ in range(rounds):
        for size in SIZES:
            for name, loop in loops.items():
                start = time.perf_counter_ns()
                loop(size, PAIRS_PER_LOOP)
                samples[name][str(size)].append((time.perf_counter_ns() - start) / PAIRS_PER_LOOP)
    return samples


def pair_summary(samples):
    """Medians, and each allocator's median over rounds of its ratio to cuemm's pool in that round."""
    summary = {}
    for name, by_size in samples.items():
        summary[name] = {}
        for size, times in by_size.items():
            ours = samples["cuemm pool"][size]
            summary[name][size] = {
                "median_ns": statistics.median(times),
                "over_cuemm": statistics.median(t / o for t, o in zip(times, ours)),
            }
    return summary


def read_operations(path):
    """(allocate?, address, size) of a cuemm CSV log's device rows, in order."""
    operations = []
    with open(path, newline="") as log:
        for row in csv.DictReader(log):
            kind = row["Event Type"]
            if kind in ("Alloc", "Free"):
                operations.append((kind == "Alloc", row["Address"], int(row["Size (bytes)"] or 0)))
    return operations


def replay_peaks(operations, allocate, reserved_now):
    """Peak live bytes and peak reserved (a dict of readings) over the operations."""
    live, live_bytes, peak_live, peaks = {}, 0, 0, {}
    for allocates, address, size in operations:
        if allocates:
            live[address] = (allocate(size), size)
            live_bytes += size
        elif address in live:
            live_bytes -= live.pop(address)[1]
        peak_live = max(peak_live, live_bytes)
        for name, value in reserved_now().items():
            peaks[name] = max(peaks.get(name, 0), value)
    live.clear()
    return peak_live, peaks


def replay_in_cupy(operations):
    import cupy
    pool = cupy.cuda.MemoryPool()
    free_at_start = cupy.cuda.runtime.memGetInfo()[0]
    peak_live, peaks = replay_peaks(
        operations, pool.malloc,
        lambda: {"own": pool.total_bytes(), "device": free_at_start - cupy.cuda.runtime.memGetInfo()[0]})
    pool.free_all_blocks()
    return {"CuPy MemoryPool (its count)": peaks["own"] / peak_live,
            "CuPy MemoryPool (device memory lost)": peaks["device"] / peak_live}


def replay_in_torch(operations):
    import torch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    held_at_start = torch.cuda.memory_reserved()

    class Block:  # deletes its pointer when the replay drops it
        __slots__ = ("pointer",)

        def __init__(self, size):
            self.pointer = torch.cuda.caching_allocator_alloc(size)

        def __del__(self):
            torch.cuda.caching_allocator_delete(self.pointer)
    peak_live, _ = replay_peaks(operations, Block, lambda: {})
    peak = torch.cuda.max_memory_reserved() - held_at_start
    torch.cuda.empty_cache()
    return {"PyTorch caching allocator": peak / peak_live}


def replay_in_cuemm(tool, log):
    """cuemm's pool and the best fit on the log, as `cuemm replay` reads them."""
    text = subprocess.run([tool, "replay", log, "--manager", "pool"], capture_output=True, text=True,
                          check=True).stdout
    pool = re.search(r"reserved/live ([0-9.]+)", text)
    best = re.search(r"([0-9.]+) of its peak live", text)
    if not pool or not best:
        raise RuntimeError(f"cuemm replay printed no figures for {log}:\n{text}")
    return {"cuemm pool": float(pool.group(1)), "best fit (reference)": float(best.group(1))}


def fragmentation(tool, seeds, anchors, work):
    """One record a workload and seed: each allocator's peak reserved over peak live."""
    records = []
    for label, arguments in WORKLOADS:
        for seed in range(1, seeds + 1):
            log = os.path.join(work, f"log-{len(records)}.csv")
            environment = dict(os.environ, CUEMM_DRIVER="sim", CUEMM_LOG_FILE=log, CUEMM_ADAPTORS="")
            subprocess.run([tool, "random", *arguments.split(), "--seed", str(seed)], env=environment,
                           capture_output=True, check=True)
            operations = read_operations(log)
            record = {"workload": label, "seed": seed, "operations": len(operations)}
            record.update(replay_in_cuemm(tool, log))
            for anchor in anchors:
                record.update(anchor(operations))
            records.append(record)
            os.remove(log)
    return records


def fragmentation_means(records):
    """Per workload: each allocator's mean over the seeds."""
    means = {}
    for record in records:
        row = means.setdefault(record["workload"], {})
        for name, value in record.items():
            if isinstance(value, float):
                row.setdefault(name, []).append(value)
    return {workload: {name: statistics.mean(values) for name, values in row.items()}
            for workload, row in means.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuemm", required=True, help="folder holding the cuemm package (build/python)")
    parser.add_argument("--tool", required=True, help="the cuemm command-line tool (build/bin/cuemm)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", help="JSON of every figure, for bench/make_results.py")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.cuemm))
    cuemm_core = importlib.import_module("cuemm._core")

    bridge, loops, missing = pair_loops(cuemm_core)
    for name, why in missing.items():
        print(f"left out: {name} ({why})")
    pairs = pair_summary(time_pairs(loops, args.rounds))
    print(f"allocate+free pairs from Python, ns (median of {args.rounds} rounds; "
          "in brackets the median of the rounds' ratios to cuemm's pool)")
    print("| allocator | " + " | ".join(f"{size:,} B" for size in SIZES) + " |")
    for name, by_size in pairs.items():
        cells = [f"{by_size[str(s)]['median_ns']:,.0f} ({by_size[str(s)]['over_cuemm']:.2f}x)" for s in SIZES]
        print(f"| {name} | " + " | ".join(cells) + " |")
    del loops
    bridge.reset()

    anchors = [replay for name, replay in (("CuPy MemoryPool", replay_in_cupy),
                                           ("PyTorch caching allocator", replay_in_torch)) if name not in missing]
    with tempfile.TemporaryDirectory() as work:
        records = fragmentation(os.path.abspath(args.tool), args.seeds, anchors, work)
    means = fragmentation_means(records)
    print(f"\npeak reserved over peak live, mean of seeds 1-{args.seeds}")
    for workload, row in means.items():
        print(f"  {workload}: " + ", ".join(f"{name} {value:.3f}" for name, value in row.items()))

    # One line for scripts/gpu-check.sh's summary.
    ratios = "; ".join(f"{name} " + " ".join(f"{pairs[name][str(s)]['over_cuemm']:.2f}" for s in SIZES) + "x"
                       for name in pairs if name not in ("cuemm pool", "a Python call (floor)"))
    overall = fragmentation_means([dict(r, workload="all") for r in records])["all"]
    print("summary: pairs over cuemm's pool: " + (ratios or "no anchor") + "; reserved/live, mean of all runs: " +
          ", ".join(f"{name} {value:.3f}" for name, value in overall.items()))

    if args.out:
        bench_numba = importlib.import_module("bench_numba")  # (beside this file)
        info = subprocess.run([args.tool, "info"], capture_output=True, text=True).stdout
        device = re.search(r"^device 0: ([^,]*)", info, re.MULTILINE)
        measured = {"date": datetime.date.today().isoformat(), "commit": os.environ.get("CUEMM_COMMIT", "unknown"),
                    "device": device.group(1) if device else "unknown"}
        with open(args.out, "w") as out:
            json.dump({"measured": measured, "environment": bench_numba.versions(), "rounds": args.rounds,
                       "seeds": args.seeds,
                       "pairs_per_loop": PAIRS_PER_LOOP, "left_out": missing, "pairs": pairs,
                       "fragmentation": records, "fragmentation_means": means}, out, indent=1)


if __name__ == "__main__":
    main()
