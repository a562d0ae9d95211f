"""Numba allocation speed: Numba's default manager, cuemm's plugin (pool) and a
do-nothing plugin (Numba's floor), each in its own process, side by side.

    python3 bench/bench_numba.py --cuemm build/python --out numba.json

Prints a table of medians (ns per allocate+release pair) and the ratios the
issue asks for; --out writes the raw figures as JSON for bench/make_results.py.
"""
import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys

DEVICE_SIZES = [256, 64 << 10, 4 << 20, 64 << 20]
HOST_SIZES = [4 << 10, 1 << 20, 64 << 20]
MANAGERS = {"default": None, "cuemm": "cuemm", "floor": "numba_fixed_buffer_plugin"}

WORKER = r'''
import json, sys, threading, time
import numpy as np
from numba import cuda

kind, sizes, repeats = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
# Interleaved: rounds after these many leave the default out (see below).
rounds_with_default = int(sys.argv[4]) if len(sys.argv) > 4 else repeats
WARM_UP_PAIRS = 5000
context = cuda.current_context()
allocate = {"device": lambda n: cuda.device_array(n, dtype=np.uint8),
            "pinned": lambda n: cuda.pinned_array(n, dtype=np.uint8),
            "mapped": lambda n: cuda.mapped_array(n, dtype=np.uint8),
            "interleaved": lambda n: cuda.device_array(n, dtype=np.uint8),
            "interleaved-pinned": lambda n: cuda.pinned_array(n, dtype=np.uint8),
            "interleaved-mapped": lambda n: cuda.mapped_array(n, dtype=np.uint8)}.get(kind)
results = {}


def flush_pending(manager):
    # Numba's own managers defer frees to a queue flushed every ten; flushing
    # it inside the timing charges each loop with its own frees rather than
    # the next loop (of another size, or another manager) with them.
    pending = getattr(manager, "deallocations", None)
    if pending is not None:
        pending.clear()


if kind.startswith("interleaved"):
    # The three managers in one process (this one runs under cuemm), swapped
    # in as the context's manager in turn, round after round: differences
    # between processes (memory layout, a busy neighbour) then fall on all
    # three alike. Results: per manager and size, one median per round.
    from numba.cuda.cudadrv import driver as _driver
    from numba_fixed_buffer_plugin import FixedBufferManager
    managers = {"cuemm": context.memory_manager,
                "default": _driver.NumbaCUDAMemoryManager(context=context),
                "floor": FixedBufferManager(context=context)}
    for manager in managers.values():
        manager.initialize()
    names = list(managers)
    results = {name: {str(n): [] for n in sizes} for name in names}
    # 1000 pairs a round; host memory 40 from 1 MiB, where Numba's default
    # takes 0.7-35 ms a pair. (The rounds' cuemm/floor ratios had standard
    # deviations of 0.12-0.78 on the H100's hosts: the median needs many rounds.)
    host = kind != "interleaved"
    def iterations_for(n):
        return 40 if host and n >= (1 << 20) else 1000
    # Each manager first runs a loop of each size once (not timed): the rounds
    # measure the steady state of a loop, and cuemm's pool adds blocks to a
    # loop's rotation only after thousands of pairs. (Host memory: one round's
    # worth.)
    for name in names:
        context.memory_manager = managers[name]
        for n in sizes:
            for _ in range(iterations_for(n) if host else WARM_UP_PAIRS):
                allocate(n)
        flush_pending(managers[name])
    # Each size in turn, the three managers back to back: cuemm's and the
    # floor's loops always adjacent (their ratio is the figure held to 5%, and
    # the host's speed drifts over tens of milliseconds), each first as often
    # as the other, and the default's before or after the pair.
    orders = (("default", "cuemm", "floor"), ("floor", "cuemm", "default"),
              ("default", "floor", "cuemm"), ("cuemm", "floor", "default"))
    # Rounds beyond rounds_with_default time cuemm and the floor alone: their
    # ratio is held to 5%, and a round's varies by 0.1 or more, so its median
    # needs many rounds; the default's loops take ten times as long and its
    # ratio is held to 3x and 7x.
    for round_ in range(repeats):
        for n in sizes:
            for name in orders[round_ % len(orders)]:
                if name == "default" and round_ >= rounds_with_default:
                    continue
                context.memory_manager = managers[name]
                iterations = iterations_for(n)
                allocate(n)  # warm up
                start = time.perf_counter_ns()
                for _ in range(iterations):
                    a = allocate(n)
                    del a
                flush_pending(managers[name])
                results[name][str(n)].append((time.perf_counter_ns() - start) / iterations)
    context.memory_manager = managers["cuemm"]
elif kind == "stream":
    # cuemm.device_array on Numba's default stream (stream-ordered, no seal)
    # beside cuda.device_array through cuemm's plugin, in turn in one process
    # (each first in every other round): per call and size, one median per round.
    import cuemm
    calls = {"cuda.device_array": lambda n: cuda.device_array(n, dtype=np.uint8),
             "cuemm.device_array(stream=0)": lambda n: cuemm.device_array(n, dtype=np.uint8)}
    results = {name: {str(n): [] for n in sizes} for name in calls}
    for call in calls.values():
        for n in sizes:
            for _ in range(WARM_UP_PAIRS):
                call(n)
    for round_ in range(repeats):
        for n in sizes:
            for name in list(calls)[::1 if round_ % 2 == 0 else -1]:
                start = time.perf_counter_ns()
                for _ in range(1000):
                    a = calls[name](n)
                    del a
                flush_pending(context.memory_manager)
                results[name][str(n)].append((time.perf_counter_ns() - start) / 1000)
elif kind == "threads":
    def work(seed, count, errors):
        for i in range(count):
            d = cuda.to_device(np.full(8192, seed, dtype=np.uint8))
            if i % 50 == 0 and not (d.copy_to_host() == seed).all():
                errors.append(seed)
    # Warm up first, as the other measurements do: the first allocations make
    # the manager (for cuemm: import its module, make the pool's first
    # segment), which would otherwise fall on the one-thread figure alone.
    work(0, 50, [])
    for threads in (1, 4, 8):
        errors = []
        count = 400
        start = time.perf_counter_ns()
        pool = [threading.Thread(target=work, args=(t, count, errors)) for t in range(threads)]
        for t in pool: t.start()
        for t in pool: t.join()
        elapsed = time.perf_counter_ns() - start
        results[str(threads)] = {"pairs_per_second": threads * count / (elapsed / 1e9), "errors": len(errors)}
else:
    for n in sizes:
        iterations = 2000 if n <= (1 << 20) else 200
        if kind != "device" and n >= (1 << 20):
            iterations = 40
        samples = []
        allocate(n)  # warm up
        for _ in range(repeats):
            start = time.perf_counter_ns()
            for _ in range(iterations):
                a = allocate(n)
                del a
            flush_pending(context.memory_manager)
            samples.append((time.perf_counter_ns() - start) / iterations)
        results[str(n)] = samples
print(json.dumps(results))
'''


def measure(manager, kind, sizes, repeats, environment, rounds_with_default=None):
    env = dict(environment)
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    if MANAGERS[manager]:
        env["NUMBA_CUDA_MEMORY_MANAGER"] = MANAGERS[manager]
    extra = [str(rounds_with_default)] if rounds_with_default is not None else []
    result = subprocess.run([sys.executable, "-c", WORKER, kind, json.dumps(sizes), str(repeats)] + extra, env=env,
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{manager} {kind} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def versions():
    """The versions this run measured with, for bench/RESULTS.md (which may be
    generated on another machine)."""
    found = {"python": platform.python_version()}
    for module in ("numba", "numba_cuda", "cupy", "torch"):
        try:
            found[module] = importlib.import_module(module).__version__
        except Exception:
            found[module] = "not installed"
    return found


def interleaved_summary(samples):
    """Per size: each manager's median, and the median over rounds of the
    ratios taken within a round (the drift between rounds cancels in those)."""
    summary = {}
    for size in samples["cuemm"]:
        default, cuemm, floor = (samples[name][size] for name in ("default", "cuemm", "floor"))
        # (The default may sit out the later rounds: zip stops at its last.)
        summary[int(size)] = {name: statistics.median(samples[name][size]) for name in ("default", "cuemm", "floor")}
        summary[int(size)]["default/cuemm"] = statistics.median(d / c for d, c in zip(default, cuemm))
        summary[int(size)]["cuemm/floor"] = statistics.median(c / f for c, f in zip(cuemm, floor))
        # What any plugin could reach: the default over Numba's own cost.
        summary[int(size)]["default/floor"] = statistics.median(d / f for d, f in zip(default, floor))
    return summary


def stream_summary(samples):
    """Per size: each call's median, and the median over rounds of the stream-ordered one's ratio to Numba's."""
    summary = {}
    numba, ordered = samples["cuda.device_array"], samples["cuemm.device_array(stream=0)"]
    for size in numba:
        summary[int(size)] = {"cuda.device_array": statistics.median(numba[size]),
                              "cuemm.device_array(stream=0)": statistics.median(ordered[size]),
                              "ratio": statistics.median(o / c for o, c in zip(ordered[size], numba[size]))}
    return summary


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuemm", required=True, help="folder holding the cuemm package")
    parser.add_argument("--out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interleaved-rounds", type=int, default=31, help="rounds of all three managers")
    parser.add_argument("--interleaved-extra-rounds", type=int, default=60,
                        help="more rounds of device_array, of cuemm and the floor only (their ratio is held to 5%%)")
    parser.add_argument("--stream-rounds", type=int, default=15,
                        help="rounds of cuemm.device_array on the default stream beside cuda.device_array")
    parser.add_argument("--kinds", default="device,pinned,mapped,threads,interleaved,stream",
                        help="which measurements to make (comma-separated; the default makes all)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="each round runs every manager once, in a rotated order, so that drifts in the "
                             "machine's speed fall on all of them alike")
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [args.cuemm, here, environment.get("PYTHONPATH")]))

    figures = {"device": {m: {} for m in MANAGERS}, "pinned": {}, "mapped": {}, "threads": {}}
    for kind in ("pinned", "mapped"):
        figures[kind] = {"default": {}, "cuemm": {}, "floor": {}}

    def add(kind, manager, samples):
        for size, values in samples.items():
            figures[kind][manager].setdefault(size, []).extend(values)

    kinds = args.kinds.split(",")
    names = list(MANAGERS)
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        if "device" in kinds:
            for manager in order:
                add("device", manager, measure(manager, "device", DEVICE_SIZES, args.repeats, environment))
        for kind in ("pinned", "mapped"):
            if kind not in kinds:
                continue
            for manager in order:
                repeats = 1 if manager == "default" else args.repeats
                add(kind, manager, measure(manager, kind, HOST_SIZES, repeats, environment))
    if "threads" in kinds:
        for manager in ("default", "cuemm"):
            figures["threads"][manager] = measure(manager, "threads", [], 1, environment)
    if "interleaved" in kinds:
        figures["interleaved"] = measure("cuemm", "interleaved", DEVICE_SIZES,
                                         args.interleaved_rounds + args.interleaved_extra_rounds, environment,
                                         rounds_with_default=args.interleaved_rounds)
        # Pinned and mapped too, when asked for: their separate processes drift more than cuemm's effect.
        for kind in [k for k in ("pinned", "mapped") if k in kinds]:
            figures[f"interleaved-{kind}"] = measure("cuemm", f"interleaved-{kind}", HOST_SIZES,
                                                     min(args.interleaved_rounds, 5), environment)

    if "stream" in kinds:
        figures["stream"] = measure("cuemm", "stream", DEVICE_SIZES, args.stream_rounds, environment)

    def median(samples):
        return statistics.median(samples)

    print("cuda.device_array(n) + release, median ns per pair")
    print(f"{'size':>10} {'default':>12} {'cuemm':>12} {'floor':>12} {'default/cuemm':>14} {'cuemm/floor':>12}")
    for n in DEVICE_SIZES if "device" in kinds else []:
        row = {m: median(figures["device"][m][str(n)]) for m in MANAGERS}
        print(f"{n:>10} {row['default']:>12.0f} {row['cuemm']:>12.0f} {row['floor']:>12.0f} "
              f"{row['default'] / row['cuemm']:>13.1f}x {row['cuemm'] / row['floor']:>11.3f}")
    for kind in [k for k in ("pinned", "mapped") if k in kinds]:
        print(f"cuda.{kind}_array(n) + release, median ns per pair")
        for n in HOST_SIZES:
            d, c, f = (median(figures[kind][m][str(n)]) for m in MANAGERS)
            print(f"{n:>10} default {d:>12.0f} cuemm {c:>10.0f} floor {f:>10.0f} ratio {d / c:>9.1f}x "
                  f"cuemm/floor {c / f:.3f}")
    if "threads" in kinds:
        print("Python threads, cuda.to_device(8 KiB) + release (content checked), pairs per second")
    for manager in ("default", "cuemm") if "threads" in kinds else []:
        row = figures["threads"][manager]
        print(f"  {manager:8} " + "  ".join(f"{t} threads: {row[t]['pairs_per_second']:.0f} ({row[t]['errors']} errors)"
                                         for t in sorted(row, key=int)))
    for kind, call in (("interleaved", "device_array"), ("interleaved-pinned", "pinned_array"),
                       ("interleaved-mapped", "mapped_array")):
        if kind not in figures:
            continue
        print(f"cuda.{call}(n) + release, the three managers interleaved in one process: median ns per pair "
              "and the median of the rounds' ratios")
        for n, row in interleaved_summary(figures[kind]).items():
            print(f"{n:>10} default {row['default']:>9.0f} cuemm {row['cuemm']:>9.0f} floor {row['floor']:>9.0f} "
                  f"default/cuemm {row['default/cuemm']:>6.1f}x default/floor {row['default/floor']:>6.1f}x "
                  f"cuemm/floor {row['cuemm/floor']:.3f}")
    if "stream" in figures:
        print("cuemm.device_array(n) on Numba's default stream beside cuda.device_array(n) under the plugin, "
              "one process: median ns per pair, and the median of the rounds' ratios")
        for n, row in stream_summary(figures["stream"]).items():
            print(f"{n:>10} cuda.device_array {row['cuda.device_array']:>9.0f} "
                  f"cuemm.device_array(stream=0) {row['cuemm.device_array(stream=0)']:>9.0f} "
                  f"ratio {row['ratio']:.2f}")
    if args.out:
        figures["environment"] = versions()
        figures["repeats"] = args.repeats  # samples per process: how make_results tells processes apart
        with open(args.out, "w") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
