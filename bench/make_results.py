"""Writes bench/RESULTS.md from one GPU run's benchmark outputs.

    python3 bench/make_results.py --allocators bench_allocators.json --numba bench_numba.json \
        --gpu gpu.txt --out bench/RESULTS.md

Every figure comes from the files given (Google Benchmark's JSON and
bench_numba.py's JSON); nothing is typed in. scripts/gpu-check.sh runs it.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import subprocess

from bench_numba import interleaved_summary, stream_summary, versions


def medians(runs, field="real_time"):
    out = {}
    for results in runs:
        for run in results["benchmarks"]:
            if run.get("aggregate_name") == "median" and field in run:
                out[run["run_name"]] = run[field]
    return out


def scaling_rounds(runs):
    """PoolScalingAlternated's counters by size (one run of its rounds, no aggregates)."""
    out = {}
    for results in runs:
        for run in results["benchmarks"]:
            name = run.get("run_name", run.get("name", ""))
            if name.startswith("PoolScalingAlternated/") and "ratio_median" in run and not run.get("aggregate_name"):
                out[int(name.split("/")[1])] = run
    return out


ADAPTOR_ROWS = (("statistics", "PoolWithStatistics"), ("limit", "PoolWithLimit"), ("tracking", "PoolWithTracking"))


def one_and_sixteen(m, name, sizes):
    """(size, one thread's ns, 16 threads' ns) of the benchmark `name`, for the sizes where both ran."""
    times = ((s, m.get(f"{name}/{s}/real_time/threads:1"), m.get(f"{name}/{s}/real_time/threads:16")) for s in sizes)
    return [(s, one, sixteen) for s, one, sixteen in times if one and sixteen]


def ratio_cells(ran):
    """"256 B 12.5x, ...": 16 threads over one, of one_and_sixteen()'s rows."""
    return ", ".join(f"{s:,} B {one / sixteen:.1f}x" for s, one, sixteen in ran)


def scaling_cells(m, name, sizes):
    """The benchmark `name`'s 16 threads over one, "256 B 12.5x, ..." for the sizes where both ran."""
    return ratio_cells(one_and_sixteen(m, name, sizes))


def adaptor_scaling_line(m, sizes):
    """16 threads over one through each adaptor over the pool, as the pool's own scaling line reads it ("" if none ran)."""
    parts = []
    for label, name in ADAPTOR_ROWS:
        if cells := scaling_cells(m, f"AllocateFree<{name}>", sizes):
            parts.append(f"{label} {cells}")
    if not parts:
        return ""
    return ("Adaptors over the pool (memalloc): aggregate throughput of 16 threads over one thread's: " +
            "; ".join(parts))


def pinned_scaling_line(m):
    """16 threads over one through the pinned host pool, each thread its own pairs ("" if it did not run)."""
    ran = one_and_sixteen(m, "PinnedHostPoolScaling", (4096, 1048576))
    if not ran:
        return ""
    return ("The pinned host pool from 16 threads at once, each pairing on its own (each thread warmed up as "
            "above): aggregate throughput of 16 threads over one thread's: " + ratio_cells(ran) +
            " (ns a pair, one thread / 16 threads' aggregate: " +
            ", ".join(f"{s:,} B {fmt(one)} / {fmt(sixteen)}" for s, one, sixteen in ran) + ").")


def fmt(ns):
    return f"{ns:,.0f}" if ns >= 100 else f"{ns:.1f}"


# workload::TrainingShapes::per_layer, the benchmarks' second argument.
PER_LAYER_SHAPES = 2


def beside_kernels_lines(runs):
    """RandomSizesBesideKernels and TrainingStepsBesideKernels: each manager's ns per operation, and the
    pool's driver calls per operation (and, for training, the waits for the GPU it avoided)."""
    managers = [("pool manager", "<cuemm::PoolMemoryManager>"),
                ("pool manager, no segments of their own (`CUEMM_POOL_DEDICATED_SIZE=1T`)",
                 "<cuemm::PoolMemoryManager, kNoDedicatedSegments>"),
                ("async manager", "<cuemm::AsyncMemoryManager>")]
    rates, calls = medians(runs, "items_per_second"), medians(runs, "driver_calls_per_operation")
    avoided = medians(runs, "gpu_waits_avoided")
    workloads = [
        ("RandomSizesBesideKernels", "/67108864/1073741824/iterations:2/real_time",
         "## Random large sizes beside kernels (C++)",
         "RMM's workload up to 64 MiB with 1 GiB live (seed 1, 10,000 operations) through a new manager, "
         "each new block filled by a kernel on 4 streams in turn; ns per operation over two passes, each "
         "with the wait for its kernels. The driver calls are the pool's `cuMemAlloc` and `cuMemFree` "
         "(which waits for all queued work: `bench/probes/probe_free_stall.cpp`) per operation."),
        ("TrainingStepsBesideKernels", "/0/0/iterations:2/real_time",
         "## Training steps beside kernels (C++)",
         "`cuemm random --pattern training` (round sizes, seed 1, 14,520 operations) through a new manager, "
         "each new block given to a kernel that first keeps the GPU busy for 20 us, on 4 streams in turn, "
         "so that work is queued ahead whenever the host allocates; ns per operation over two passes, each "
         "with the wait for its kernels. Waits avoided: where the pool would have given spares back or waited "
         "for freed blocks while the GPU was busy, and grew instead (Note [Growth while the GPU is busy])."),
        ("TrainingStepsBesideKernels", f"/0/{PER_LAYER_SHAPES}/iterations:2/real_time",
         "## Training steps of per-layer sizes beside kernels (C++)",
         "The same with `--shapes per-layer` (each layer's sizes its own, drawn once; seed 1): the sizes the "
         "pool reuses least."),
    ]
    lines = []
    for benchmark, key, heading, text in workloads:
        if not any(benchmark + name + key in rates for _, name in managers):
            continue
        lines += [heading, "", text, "",
                  "| manager | ns per operation | driver calls per operation | waits for the GPU avoided |",
                  "|---|---|---|---|"]
        for label, name in managers:
            run = benchmark + name + key
            rate, per_operation, waits = rates.get(run), calls.get(run), avoided.get(run)
            lines.append(f"| {label} | {fmt(1e9 / rate) if rate else '-'} | "
                         f"{f'{per_operation:.3f}' if per_operation is not None else '-'} | "
                         f"{f'{waits:,.0f}' if waits is not None else '-'} |")
        lines.append("")
    return lines


def interleaved_table(samples, cuemm_header):
    """The rows of one interleaved measurement (bench_numba's interleaved_summary), with its header."""
    lines = [f"| size | default | {cuemm_header} | floor | default / cuemm | default / floor | cuemm / floor |",
             "|---|---|---|---|---|---|---|"]
    for s, row in interleaved_summary(samples).items():
        lines.append(f"| {s:,} B | {fmt(row['default'])} | {fmt(row['cuemm'])} | {fmt(row['floor'])} | "
                     f"{row['default/cuemm']:,.1f}x | {row['default/floor']:,.1f}x | {row['cuemm/floor']:.2f} |")
    return lines


def process_spread(samples_by_manager, repeats):
    """The largest gap between two processes' medians for one manager and size (samples come `repeats` a process)."""
    gaps = []
    for by_size in samples_by_manager.values():
        for samples in by_size.values():
            medians = [statistics.median(samples[i:i + repeats]) for i in range(0, len(samples), repeats)]
            if len(medians) > 1:
                gaps.append(max(medians) / min(medians) - 1)
    return max(gaps, default=None)


def numba_stream_lines(samples):
    """The table of bench_numba.py's 'stream' kind: cuemm.device_array on the default stream beside Numba's."""
    rounds = len(next(iter(samples["cuda.device_array"].values())))
    lines = ["", "`cuemm.device_array(n)` on Numba's default stream (stream-ordered: no seal) beside "
             f"`cuda.device_array(n)` through the plugin, in turn in one process ({rounds} rounds of 1,000 pairs; the "
             "ratio is the median of each round's):", "",
             "| size | cuda.device_array | cuemm.device_array(stream=0) | ratio |", "|---|---|---|---|"]
    for n, row in stream_summary(samples).items():
        lines.append(f"| {n:,} B | {fmt(row['cuda.device_array'])} | {fmt(row['cuemm.device_array(stream=0)'])} "
                     f"| {row['ratio']:.2f}x |")
    return lines


def python_pools_lines(pools):
    """The section of bench_python_pools.py's figures: pairs, then reserved over live."""
    sizes = [int(size) for size in next(iter(pools["pairs"].values()))]
    lines = ["## CuPy's memory pool and PyTorch's caching allocator from Python", "",
             f"`bench/bench_python_pools.py`, one process: allocate+free pairs called as each allocator's users call "
             f"it (cuemm's pool through its Python bridge: the Numba plugin's fast path, and stream-ordered on the "
             f"legacy stream as `cuemm.device_array(stream=...)` allocates; CuPy's `MemoryPool.malloc`; "
             f"PyTorch's `caching_allocator_alloc`/`caching_allocator_delete`), {pools['pairs_per_loop']:,} pairs a "
             f"loop, each size's loops in turn in each of {pools['rounds']} rounds: ns a pair (median), and in "
             "brackets the median of the rounds' ratios to cuemm's pool. So few pairs leave cuemm's loops in their "
             "warm-up between the other sizes' loops (a ring grows as its seals pay for segments); until `4ae6f91` "
             "that doubled the 1 MiB pair (docs/pool-measurements.md, \"Why the 1 MiB pair from Python reads twice "
             "the 256-byte one\").", ""]
    measured = pools.get("measured")
    if measured:
        lines += [f"Measured on {measured['date']} on the {measured['device']} at commit `{measured['commit']}`; "
                  + ", ".join(f"{module} {version}" for module, version in pools["environment"].items()) + ".", ""]
    lines += ["| allocator | " + " | ".join(f"{size:,} B" for size in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for name, by_size in pools["pairs"].items():
        cells = [f"{fmt(by_size[str(s)]['median_ns'])} ({by_size[str(s)]['over_cuemm']:.2f}x)" for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, why in pools.get("left_out", {}).items():
        lines += ["", f"Left out: {name} ({why})."]
    names = []
    for row in pools["fragmentation_means"].values():
        names += [name for name in row if name not in names]
    lines += ["", f"Peak reserved over peak live on the operations of `cuemm random`'s workloads (seeds "
              f"1-{pools['seeds']}, means), each replayed from its CSV log: cuemm's pool and the best fit by "
              "`cuemm replay`, CuPy's pool by its own count (`total_bytes()`) and by the device memory it took "
              "(`cudaMalloc` takes whole 2 MiB pages from 2 MiB up), PyTorch's by `max_memory_reserved()`. cuemm's "
              "pool is replayed through `memalloc`, whose freed blocks wait for the GPU's queued work (a seal) before "
              "reuse; CuPy's and PyTorch's reuse a block at once on the stream it was freed on.", "",
              "| workload | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for workload, row in pools["fragmentation_means"].items():
        lines.append(f"| {workload} | " + " | ".join(f"{row[n]:.3f}" if n in row else "-" for n in names) + " |")
    lines.append("")
    return lines


def checked_out_commit():
    """HEAD here, marked when the files differ from it (a copy shipped with a stale history)."""
    def git(*words):
        return subprocess.run(["git", *words], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    if head and git("status", "--porcelain", "--untracked-files=no"):
        return f"{head}, with changes not committed (pass --commit or CUEMM_COMMIT)"
    return head


def fragmentation_lines(path):
    """The fragmentation section of RESULTS.md from the output of gpu-check's `cuemm random` runs."""
    lines = []
    lines += ["", "## Fragmentation: `cuemm random` (RMM-style random allocations and frees; "
              "`--pattern training`: sizes that change between phases; with `--shapes per-layer`, each layer's "
              "sizes its own)", "",
              "Peak reserved is what the manager holds from the driver: the pool's count of its segments, the "
              "reserved bytes of the async manager's driver pool (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), and for "
              "the default manager what the device's free memory lost since the start (its runs go alone).", "",
              "| workload | manager | ns per operation | driver allocations / frees | peak live | peak reserved "
              "| reserved / live |",
              "|---|---|---|---|---|---|---|"]
    workload = manager = None
    seeds = []
    not_run = []  # what gpu-check left out to finish inside the device's limit
    notes = []
    for line in open(path):
        if line.startswith("# "):  # where the runs came from, when not from the run of the rest
            notes.append(line[2:].strip())
        elif line.startswith("== ") and ": not run" in line:
            not_run.append(line[3:].strip())
        elif line.startswith("== seeds "):
            head, ratios = line[len("== seeds "):].split(":", 1)
            # The workload is `cuemm random`'s arguments, which hold no comma; a label may
            # ("best fit (reference, in the pool's order)").
            seeds_workload, seeds_manager = head.split(" ", 1)[1].split(", ", 1)
            tokens = ratios.split()
            values = [float(v) for v in tokens if v != "failed"]
            if tokens:
                seeds.append((head.split(" ", 1)[0], seeds_workload, seeds_manager, values, len(tokens) - len(values)))
        elif line.startswith("== "):
            workload, manager = line[3:].strip().rsplit(", ", 1)
        elif line.startswith("manager "):
            # (The best-fit reference takes no time and calls no driver: "-".)
            timed = re.search(r"\(([0-9]+) ns each\)", line)
            per_operation = timed.group(1) if timed else "-"
            # The pool's count of the driver calls that took and gave back memory (older runs: none).
            calls = re.search(r"([0-9]+) driver allocation\(s\), ([0-9]+) driver free\(s\)", line)
            driver_calls = f"{int(calls.group(1)):,} / {int(calls.group(2)):,}" if calls else "-"
        elif line.startswith("peak live"):
            live = re.search(r"peak live ([0-9.]+ \w+)", line).group(1)
            reserved = re.search(r"peak reserved ([0-9.]+ \w+)", line).group(1)
            ratio = re.search(r"reserved/live ([0-9.]+)", line).group(1)
            lines.append(f"| `{workload}` | {manager} | {per_operation} | {driver_calls} | {live} | {reserved} "
                         f"| {ratio} |")
    for note in notes:
        lines[3:3] = [note, ""]  # under the heading
    if seeds:
        lines += ["", "Other traces of the same workloads (`--seed`): reserved / live per seed.", "",
                  "| workload | manager | seeds | mean | max | per seed |", "|---|---|---|---|---|---|"]
        for seed_range, seeds_workload, seeds_manager, values, failed in seeds:
            # A seed whose run failed says so: a mean over the others alone would hide it.
            mean, most = (f"{statistics.mean(values):.3f}", f"{max(values):.3f}") if values else ("-", "-")
            per_seed = " ".join(f"{v:.3f}" for v in values) + (f" ({failed} failed)" if failed else "")
            lines.append(f"| `{seeds_workload}` | {seeds_manager} | {seed_range} | {mean} | {most} | {per_seed.strip()} |")
    if not_run:
        lines += ["", "Not run in this check: " + "; ".join(not_run) + "."]
    return lines


def pair_cells(text):
    """The pair tables of a RESULTS.md: {(threads, allocator, size): ns}, cells with a figure only."""
    cells, threads, header, in_pairs = {}, None, None, False
    for line in text.splitlines():
        if line.startswith("## "):
            in_pairs = line.startswith("## C++: allocate+free pairs")
        elif in_pairs and line.startswith("### "):
            threads, header = int(line.split()[1]), None
        elif in_pairs and threads and line.startswith("| allocator |"):
            header = [cell.strip() for cell in line.strip("|").split("|")][1:]
        elif in_pairs and header and line.startswith("| ") and not line.startswith("|---"):
            row = [cell.strip() for cell in line.strip("|").split("|")]
            for size, cell in zip(header, row[1:]):
                try:
                    cells[(threads, row[0], size)] = float(cell.replace(",", ""))
                except ValueError:
                    pass  # "-": not measured
    return cells


def gpu_name(results):
    """The GPU's name in a RESULTS.md's header ('NVIDIA H200'), or None."""
    match = re.search(r"^- GPU, driver, memory: ([^,\n]+)", results, re.MULTILINE)
    return match.group(1).strip() if match else None


def previous_of_the_same_gpu(paths, name):
    """Of earlier runs' RESULTS.md files, the first that exists and was measured on the GPU `name`: timings
    of another GPU (an H100's against an H200's) would flag what the machine changed, not the code."""
    for path in paths:
        if name and os.path.exists(path) and gpu_name(open(path).read()) == name:
            return path
    return None


def slower_cells(previous, current, factor):
    """Pair cells that took over `factor` times the previous run's time, slowest first."""
    before, now = pair_cells(previous), pair_cells(current)
    slower = [(now[key] / before[key], key) for key in now if key in before and now[key] > factor * before[key]]
    return [f"{threads} thread(s), {allocator}, {size}: {fmt(before[(threads, allocator, size)])} -> "
            f"{fmt(now[(threads, allocator, size)])} ns ({ratio:.1f}x)"
            for ratio, (threads, allocator, size) in sorted(slower, reverse=True)]


def fragmentation_means(text):
    """The seed tables of a RESULTS.md: {(workload, manager): mean reserved over live}."""
    means = {}
    for line in text.splitlines():
        row = [cell.strip() for cell in line.strip("|").split("|")]
        # | workload | manager | seeds | mean | max | per seed |
        if len(row) == 6 and row[0].startswith("`") and re.fullmatch(r"\d+-\d+", row[2]):
            means[(row[0], row[1])] = float(row[3])
    return means


def higher_means(previous, current, by):
    """Seed means that rose by more than `by` since the previous run."""
    before, now = fragmentation_means(previous), fragmentation_means(current)
    return [f"{workload} {manager}: {before[(workload, manager)]:.3f} -> {now[(workload, manager)]:.3f}"
            for workload, manager in now
            if (workload, manager) in before and now[(workload, manager)] > before[(workload, manager)] + by]


def fragmentation_placeholder_lines():
    """The fragmentation section of a timings-only check, which --splice-fragmentation fills from the
    tests-only run's."""
    return ["", "## Fragmentation", "", "Not measured in this run (`CUEMM_GPU_TIMINGS_ONLY=1`): "
            "`bench/make_results.py --splice-fragmentation` puts the tests-only run's here."]


def fragmentation_section(text, path):
    """The lines [begin, end) of the fragmentation section of a RESULTS.md's lines."""
    begin = next((i for i, line in enumerate(text) if line.startswith("## Fragmentation")), None)
    if begin is None:
        sys.exit(f"{path} has no fragmentation section")
    return begin, next((i for i in range(begin + 1, len(text)) if text[i].startswith("## ")), len(text))


def splice_fragmentation(results, fragmentation, out):
    """Writes `results` (a RESULTS.md) to `out` with its fragmentation section made anew from `fragmentation`:
    the runs of `CUEMM_GPU_FRAGMENTATION_ONLY=1`, where a full check ran out of time before they did, or of
    `CUEMM_GPU_TESTS_ONLY=1` beside a timings-only check's results. A `fragmentation` that is itself a
    RESULTS.md gives its section as it stands (an earlier run's, of the same library)."""
    text = open(results).read().split("\n")
    begin, end = fragmentation_section(text, results)
    if fragmentation.endswith(".md"):
        earlier = open(fragmentation).read().split("\n")
        made = earlier[slice(*fragmentation_section(earlier, fragmentation))]
        while made and not made[-1]:
            made.pop()
    else:
        made = fragmentation_lines(fragmentation)[1:]  # (without the blank line before the heading)
    with open(out, "w") as written:
        written.write("\n".join(text[:begin] + made + [""] + text[end:]))


def pair_tables(m, sizes):
    """The tables of allocate+free pairs at 1, 4 and 16 threads, a row per allocator ("-" where it did not run)."""
    rows = [("cuMemAlloc + cuMemFree", "DriverMemAllocFree/{s}/real_time/threads:{t}"),
            ("driver's stream-ordered pool (threshold max, per-thread stream)",
             "DriverPoolAllocateFree/{s}/real_time/threads:{t}"),
            ("PyTorch CUDACachingAllocator raw_alloc/raw_delete", "TorchRawAllocFree/{s}/real_time/threads:{t}"),
            ("default manager (Numba's behaviour)", "AllocateFree<cuemm::DefaultMemoryManager>/{s}/real_time/threads:{t}"),
            ("driver's stream-ordered pool on the legacy stream (where the async manager's requests go)",
             "DriverPoolLegacyStreamAllocateFree/{s}/real_time/threads:{t}"),
            ("async manager (driver's stream-ordered pool)", "AllocateFree<cuemm::AsyncMemoryManager>/{s}/real_time/threads:{t}"),
            ("async manager, stream-ordered allocate/deallocate (per-thread stream)",
             "AsyncStreamOrderedAllocateFree/{s}/real_time/threads:{t}"),
            ("pool manager, memalloc (MemoryPointer)", "AllocateFree<cuemm::PoolMemoryManager>/{s}/real_time/threads:{t}"),
            ("pool under the statistics adaptor, memalloc",
             "AllocateFree<PoolWithStatistics>/{s}/real_time/threads:{t}"),
            ("pool under the limit adaptor (a cap not reached), memalloc",
             "AllocateFree<PoolWithLimit>/{s}/real_time/threads:{t}"),
            ("pool under the tracking adaptor, memalloc", "AllocateFree<PoolWithTracking>/{s}/real_time/threads:{t}"),
            ("pool, raw allocate/deallocate", "PoolRawAllocateFree/{s}/real_time/threads:{t}"),
            ("pool, stream-ordered allocate/deallocate (per-thread stream)",
             "PoolStreamOrderedAllocateFree/{s}/real_time/threads:{t}"),
            ("driver's stream-ordered pool on each thread's own stream",
             "DriverPoolOwnStreamAllocateFree/{s}/real_time/threads:{t}"),
            ("pool, stream-ordered on each thread's own stream",
             "PoolOwnStreamAllocateFree/{s}/real_time/threads:{t}"),
            ("pool under the statistics adaptor, stream-ordered",
             "AdaptorStreamOrderedAllocateFree<PoolWithStatistics>/{s}/real_time/threads:{t}"),
            ("pool under the limit adaptor (a cap not reached), stream-ordered",
             "AdaptorStreamOrderedAllocateFree<PoolWithLimit>/{s}/real_time/threads:{t}")]
    lines = []
    for threads in (1, 4, 16):
        lines += [f"### {threads} thread(s)", "", "| allocator | " + " | ".join(f"{s:,} B" for s in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for label, pattern in rows:
            cells = [fmt(m[pattern.format(s=s, t=threads)]) if pattern.format(s=s, t=threads) in m else "-"
                     for s in sizes]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def one_stream_loop_lines(runs):
    """The table of a loop on one stream of the program's beside kernels that keep the GPU behind (ns an iteration
    and MiB reserved, medians of the runs), from bench_allocators' runs; none where it did not run."""
    times, reserved = medians(runs, "real_time"), medians(runs, "reserved_mib")
    rows = [("driver's stream-ordered pool", "DriverPoolOneStreamLoopBesideKernels"),
            ("pool manager, stream-ordered", "PoolOneStreamLoopBesideKernels")]
    sizes = (64 << 10, 4 << 20)

    def name(row, size):
        return f"{row}/{size}/20000/iterations:20000/real_time"

    if not any(name(row, size) in times for _, row in rows for size in sizes):
        return []
    lines = ["## A loop on one stream of the program's, the GPU behind (C++)", "",
             "Allocate, launch a kernel that keeps the GPU busy 20 us and fills the block, free, all on one stream "
             "the program made, 20,000 times from a new pool (the driver's pool trimmed first): the host runs ahead "
             "until the launch queue is full. ns an iteration (the GPU's 20 us bound it), and the MiB reserved (the "
             "pool's after the loop, the driver's pool's high-water mark): an allocator whose freed blocks wait for "
             "the GPU grows while it runs behind.", "",
             "| allocator | " + " | ".join(f"{size:,} B: ns, MiB" for size in sizes) + " |", "|---|---|---|"]
    for label, row in rows:
        cells = [f"{fmt(times[name(row, size)])}, {reserved[name(row, size)]:.0f}"
                 if name(row, size) in times and name(row, size) in reserved else "-" for size in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def hand_over_lines(m, seals=None):
    """The table of blocks one thread allocates and another frees, from the benchmarks' medians, with the pool's
    seals per 1000 blocks (`seals`: the medians of the runs' seals_per_1000_pairs) where the runs counted them."""
    rows = [("PyTorch CUDACachingAllocator raw_alloc/raw_delete", "TorchRawHandOver"),
            ("driver's stream-ordered pool (each thread's per-thread stream)", "DriverPoolHandOver"),
            ("pool manager, raw interface", "PoolRawHandOver"),
            ("pool manager, memalloc (MemoryPointer)", "PoolMemallocHandOver")]
    sizes = (256, 1 << 20, 2 << 20, 4 << 20, 64 << 20)
    if not any(f"{name}/{sz}/real_time" in m for _, name in rows for sz in sizes):
        return []
    lines = ["## Blocks handed over between threads (C++)", "",
             "One thread allocates, another frees each block it is handed (in batches of 16, two batches in "
             "flight: `bench/hand_over.hpp`), as a loader thread feeding a compute thread; ns a block.", "",
             "| allocator | " + " | ".join(f"{sz:,} B" for sz in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for label, name in rows:
        cells = [fmt(m[f"{name}/{sz}/real_time"]) if f"{name}/{sz}/real_time" in m else "-" for sz in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    pool_seals = {sz: (seals or {}).get(f"PoolRawHandOver/{sz}/real_time") for sz in sizes}
    if any(v is not None for v in pool_seals.values()):
        # (What the large sizes' time goes to: each seal is one or two driver calls, between the two threads.)
        lines += ["", "The pool's seals per 1000 blocks handed over (raw interface): " +
                  ", ".join(f"{sz:,} B {v:.1f}" for sz, v in pool_seals.items() if v is not None) + "."]
    pinned = {sz: m.get(f"PinnedHostPoolHandOver/{sz}/real_time") for sz in (4096, 1 << 20, 64 << 20)}
    if any(pinned.values()):
        lines += ["", "The pinned host pool's blocks handed over the same way (pinned staging buffers that a loader "
                  "thread fills and another drops): " +
                  ", ".join(f"{sz:,} B {fmt(ns)} ns" for sz, ns in pinned.items() if ns) + " a block."]
    return lines + [""]


def main():
    if "--splice-fragmentation" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--splice-fragmentation", required=True, metavar="RESULTS.md")
        parser.add_argument("--fragmentation", required=True)
        parser.add_argument("--out", required=True)
        args = parser.parse_args()
        splice_fragmentation(args.splice_fragmentation, args.fragmentation, args.out)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--allocators", required=True, nargs="+",
                        help="Google Benchmark JSON: bench_allocators's, and the anchors' (bench_torch_allocator)")
    parser.add_argument("--numba", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", help="the commit measured (default: git's HEAD here)")
    parser.add_argument("--fragmentation", help="the output of the `cuemm random` runs (optional)")
    parser.add_argument("--python-pools", help="bench_python_pools.py's JSON: CuPy's and PyTorch's pools from "
                        "Python beside cuemm's (optional)")
    parser.add_argument("--previous", nargs="+", default=[],
                        help="RESULTS.md files of earlier runs: against the one of the same GPU, pair cells over 2x "
                        "slower, and fragmentation means over 0.04 higher, are printed")
    args = parser.parse_args()
    runs = [json.load(open(path)) for path in args.allocators]
    allocators = runs[0]
    numba = json.load(open(args.numba))

    # As bench_numba recorded them (older runs did not: then this machine's).
    measured = numba.get("environment") or versions()

    m = medians(runs)
    # (gpu-check.sh runs two where a slow host left too little time for three.)
    repetitions = max((run.get("repetitions", 0) for r in runs for run in r["benchmarks"]), default=0) or 3
    commit = args.commit or checked_out_commit()
    lines = [
        "# cuemm benchmark results",
        "",
        f"Generated by `bench/make_results.py` on {datetime.date.today()} from one run of `scripts/gpu-check.sh`.",
        "",
        f"- commit: `{commit or 'unknown'}`",
        f"- GPU, driver, memory: {open(args.gpu).read().strip()}",
        f"- CPU: {platform.processor() or platform.machine()}, {allocators['context'].get('num_cpus')} cores; "
        f"host: {allocators['context'].get('host_name')}",
        f"- Python {measured['python']}; numba {measured['numba']}; numba-cuda {measured['numba_cuda']}; "
        f"cupy {measured['cupy']}; torch {measured['torch']}",
        f"- Google Benchmark run date: {allocators['context'].get('date')}",
        "",
        "Reproduce: on the GPU machine, `CUEMM_GPU_TESTS_ONLY=1 bash scripts/gpu-check.sh` (tests and fragmentation) "
        "and `CUEMM_GPU_TIMINGS_ONLY=1 bash scripts/gpu-check.sh` (the rest; see README). Times are medians of "
        f"{repetitions} repetitions,",
        "in nanoseconds per allocate+free pair; with several threads, the time is wall time divided by all pairs",
        "of all threads (so lower is better and 16 threads ideally divide it by 16).",
        "",
        "## C++: allocate+free pairs",
        "",
    ]
    sizes = [256, 65536, 1048576, 4194304, 67108864]
    lines += pair_tables(m, sizes)
    torch = {s: m.get(f"TorchRawAllocFree/{s}/real_time/threads:1") for s in sizes}
    for label, name in (("raw interface", "PoolRawAllocateFree"), ("stream-ordered", "PoolStreamOrderedAllocateFree")):
        one = {s: m.get(f"{name}/{s}/real_time/threads:1") for s in sizes}
        lines += [f"Pool scaling, {label}: aggregate throughput of 16 threads over one thread's: " +
                  scaling_cells(m, name, sizes), ""]
        if all(torch.values()):
            lines += [f"PyTorch's caching allocator over the pool's pair ({label}), 1 thread: " +
                      ", ".join(f"{s:,} B {torch[s] / one[s]:.1f}x" for s in sizes if one[s]), ""]
    if line := adaptor_scaling_line(m, sizes):
        lines += [line, ""]
    alternated = scaling_rounds(runs)
    if alternated:
        lines += ["Pool scaling, raw interface, alternated in one process (rounds in which the first of 16 threads ran "
                  "its pairs alone, then all 16 together; the host's pair is bimodal over time, so cells timed "
                  "minutes apart may catch different modes): the median of the rounds' 16-over-1 ratios (lowest-"
                  "highest; one thread's and 16 threads' ns a pair, medians): " +
                  ", ".join(f"{s:,} B {c['ratio_median']:.1f}x ({c['ratio_lowest']:.1f}-{c['ratio_highest']:.1f}; "
                            f"{fmt(c['one_thread_ns'])} / {fmt(c['sixteen_threads_ns'])} ns)"
                            for s, c in sorted(alternated.items())), ""]
    one, sixteen = m.get("ThreadPrivateLoop/real_time/threads:1"), m.get("ThreadPrivateLoop/real_time/threads:16")
    if one and sixteen:
        lines += [f"This host's own scaling, a loop over thread-private data with no allocator: 16 threads over one "
                  f"{one / sixteen:.1f}x (the most any allocator's scaling can reach here).", ""]
    # (Older runs named the one-thread query without a thread count.)
    query = m.get("DriverLegacyStreamQuery/real_time/threads:1") or m.get("DriverLegacyStreamQuery/real_time")
    if query:
        lines += [f"One query of the legacy stream (what a seal costs, so that freed blocks may be reused) took "
                  f"{fmt(query)} ns on this host."]
        if together := m.get("DriverLegacyStreamQuery/real_time/threads:16"):
            lines[-1] += (f" From 16 threads at once, the driver answered one every {fmt(together)} ns between "
                          f"them ({query / together:.1f}x one thread's rate)")
            lines[-1] += (": queries do not run side by side, so threads that each need a seal queue for them."
                          if query / together < 1.5 else ".")
        one_ended = m.get("DriverLegacyStreamQueryAfterThreadsEnded/1/real_time")
        if one_ended and (after := m.get("DriverLegacyStreamQueryAfterThreadsEnded/1000/real_time")):
            lines[-1] += (f" Once 1000 threads had each used their per-thread stream and ended, one query took "
                          f"{fmt(after)} ns, against {fmt(one_ended)} after one ({after / one_ended:.2f}x)"
                          + (": the driver keeps something of threads that have ended, and every seal pays for it."
                             if after / one_ended > 1.5 else "."))
        lines.append("")
    # Seals per 1000 pairs, as the pools' statistics counted them in these runs.
    seals = medians(runs, "seals_per_1000_pairs")
    raw_seals = {sz: seals.get(f"PoolRawAllocateFree/{sz}/real_time/threads:1") for sz in sizes}
    pinned_seals = {sz: seals.get(f"PinnedHostPoolAllocateFree/{sz}/real_time") for sz in (4096, 1 << 20, 64 << 20)}
    if any(v is not None for v in raw_seals.values()):
        lines += ["Seals (each an event recorded for the context and queried; a stream query before CUDA 12.5) per 1000 "
                  "pairs, from the pools' statistics: the pool's raw pair, "
                  "1 thread: " + ", ".join(f"{sz:,} B {v:.1f}" for sz, v in raw_seals.items() if v is not None) +
                  "; the pinned host pool: " +
                  ", ".join(f"{sz:,} B {v:.1f}" for sz, v in pinned_seals.items() if v is not None) + ".", ""]
    if not all(torch.values()):
        lines += ["PyTorch's caching allocator was not measured in this run (bench_torch_allocator not built).", ""]
    kernels = [("default manager (deferred cuMemFree)", "StreamsWithKernels<cuemm::DefaultMemoryManager>"),
               ("pool manager", "StreamsWithKernels<cuemm::PoolMemoryManager>"),
               ("async manager", "StreamsWithKernels<cuemm::AsyncMemoryManager>"),
               ("driver's pool, on each kernel's stream", "DriverPoolStreamsWithKernels"),
               ("pool manager, stream-ordered on each kernel's stream", "PoolStreamOrderedStreamsWithKernels"),
               ("driver's pool, the legacy stream one of the four", "DriverPoolLegacyAndStreamsWithKernels"),
               ("pool manager, stream-ordered, the legacy stream one of the four",
                "PoolStreamOrderedLegacyAndStreamsWithKernels")]
    if any(f"{name}/65536/real_time" in m for _, name in kernels):
        lines += ["## Allocation between kernels on 4 streams (C++)", "",
                  "Per allocate + kernel launch + free, ns (each stream in turn; the kernel fills the block).", "",
                  "| allocator | 65,536 B | 4,194,304 B |", "|---|---|---|"]
        for label, name in kernels:
            if not any(f"{name}/{s}/real_time" in m for s in (65536, 4194304)):
                continue  # (a run from before the row's benchmark)
            cells = [fmt(m[f"{name}/{s}/real_time"]) if f"{name}/{s}/real_time" in m else "-" for s in (65536, 4194304)]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += one_stream_loop_lines(runs)
    lines += hand_over_lines(m, seals)
    lines += beside_kernels_lines(runs)
    empty, holes = m.get("PoolWithFreeBlocks/0"), m.get("PoolWithFreeBlocks/65536")
    if empty and holes:
        lines += [f"Pool with 64k free blocks: {fmt(holes)} ns against {fmt(empty)} ns with none ({holes / empty:.2f}x).", ""]
    workloads = [("4194304/536870912", "sizes up to 4 MiB, 512 MiB live"),
                 ("67108864/1073741824", "sizes up to 64 MiB, 1 GiB live"),
                 ("0/0", "training steps, round sizes"),
                 ("0/2", "training steps, each layer's sizes its own")]
    random_rows = [("driver's stream-ordered pool (threshold max, per-thread stream)", "DriverPoolRandomAllocations"),
                   ("PyTorch CUDACachingAllocator raw_alloc/raw_delete", "TorchRandomAllocations"),
                   ("default manager (Numba's behaviour)", "RandomAllocations<cuemm::DefaultMemoryManager>"),
                   ("async manager (driver's stream-ordered pool)", "RandomAllocations<cuemm::AsyncMemoryManager>"),
                   ("pool manager, memalloc (MemoryPointer)", "RandomAllocations<cuemm::PoolMemoryManager>"),
                   ("pool manager, no segments of their own (`CUEMM_POOL_DEDICATED_SIZE=1T`)",
                    "RandomAllocations<cuemm::PoolMemoryManager, kNoDedicatedSegments>")]
    if any(f"{name}/{w}/real_time" in m for _, name in random_rows for w, _ in workloads):
        lines += ["## RMM's random-allocations workload, and training steps (C++)", "",
                  "ns per allocation or free, one thread: 10,000 operations an iteration, of random sizes (the workload of "
                  "`cuemm random` and of the fragmentation table below, seed 1), each an allocation or a free of a "
                  "random live block; then the training-like workloads of `cuemm random --pattern training` (seed 1, "
                  "60 layers, 30 steps: 14,520 operations an iteration), with round sizes and with "
                  "`--shapes per-layer`.", "",
                  "| allocator | " + " | ".join(label for _, label in workloads) + " |",
                  "|---|" + "---|" * len(workloads)]
        rates = medians(runs, "items_per_second")  # operations a second
        for label, name in random_rows:
            per_second = [rates.get(f"{name}/{w}/real_time") for w, _ in workloads]
            cells = [fmt(1e9 / rate) if rate else "-" for rate in per_second]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "Each allocator is timed as a program that runs the workload again and again meets it: "
                  "first it gives back what the benchmarks before left cached (PyTorch's `emptyCache()`, the driver's "
                  "pool trimmed to 0, the async manager's `trim()`; the pool is a new one of its own, as no trim "
                  "lowers the peak footprint up to which it keeps spares), then one untimed pass of the same "
                  "workload warms it, then the timed passes repeat it. Where large sizes vary, the pool's segments "
                  "of their own keep calling the driver in that steady state (README, \"Large blocks get segments "
                  "of their own\"); its calls per operation in the timed passes:", ""]
        calls = medians(runs, "driver_calls_per_operation")
        for label, name in random_rows:
            counted = [(w_label, calls.get(f"{name}/{w}/real_time")) for w, w_label in workloads]
            if any(value is not None for _, value in counted):
                lines.append(f"- {label}: " + "; ".join(f"{w_label} {value:.4f}" for w_label, value in counted
                                                         if value is not None) + ".")
        lines.append("")
        # What the speed costs in memory, where the allocator can say.
        ratios = medians(runs, "peak_reserved_over_live")
        reporting = [(label, name) for label, name in random_rows
                     if any(f"{name}/{w}/real_time" in ratios for w, _ in workloads)]
        if reporting:
            lines += ["Peak reserved over peak live bytes on the same workload: the driver's pool and PyTorch's "
                      "allocator by their own high-water marks (each from empty), the pool sampled after every "
                      "operation on a new pool (as `cuemm random`).", "",
                      "| allocator | " + " | ".join(label for _, label in workloads) + " |",
                      "|---|" + "---|" * len(workloads)]
            for label, name in reporting:
                cells = [f"{ratios[f'{name}/{w}/real_time']:.2f}" if f"{name}/{w}/real_time" in ratios else "-"
                         for w, _ in workloads]
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("")
    lines += ["## Pinned host memory (C++)", "", "| size | cuMemHostAlloc + cuMemFreeHost | pinned host pool | ratio |",
              "|---|---|---|---|"]
    for s in (4096, 1048576, 67108864):
        d, p = m.get(f"DriverMemHostAllocFree/{s}/real_time"), m.get(f"PinnedHostPoolAllocateFree/{s}/real_time")
        if d and p:
            lines.append(f"| {s:,} B | {fmt(d)} | {fmt(p)} | {d / p:,.0f}x |")
    warm = medians(runs, "warm_up_pairs")
    warm = {s: warm.get(f"PinnedHostPoolAllocateFree/{s}/real_time") for s in (4096, 1048576, 67108864)}
    if any(warm.values()):
        lines += ["", "The pool's pairs are its steady state: before timing, each size ran untimed pairs until the "
                  "pool had bought no block for 500,000 pairs (a list of large blocks lengthens its rotation only as "
                  "its seals pay for a block, so a short timed loop would time purchases of 50 ms each): " +
                  ", ".join(f"{s:,} B {v:,.0f} pairs" for s, v in warm.items() if v) + "."]
    if line := pinned_scaling_line(m):
        lines += ["", line]
    if args.fragmentation:
        lines += fragmentation_lines(args.fragmentation)
    else:
        lines += fragmentation_placeholder_lines()
    lines += ["", "## Numba (Python): allocate + release, ns per pair", "",
              "`floor` is a do-nothing plugin that returns one fixed buffer: Numba's own cost. Each timed loop "
              "ends by flushing the manager's queue of deferred frees (Numba's default defers them), so every loop "
              "pays for its own frees.", "",
              "| size | default | cuemm (pool) | floor | default / cuemm | cuemm / floor |", "|---|---|---|---|---|---|"]
    for s, samples in numba["device"]["cuemm"].items():
        d = statistics.median(numba["device"]["default"][s])
        c = statistics.median(samples)
        f = statistics.median(numba["device"]["floor"][s])
        lines.append(f"| {int(s):,} B | {fmt(d)} | {fmt(c)} | {fmt(f)} | {d / c:.1f}x | {c / f:.2f} |")
    spread = process_spread({m: numba["device"][m] for m in ("cuemm", "floor")}, numba.get("repeats", 3))
    if spread:
        lines += ["", f"Separate processes differ by more than cuemm's cost: in this run, two processes with the same "
                  f"manager and size had medians up to {spread:.0%} apart, so the ratios above drift from run to "
                  "run. The interleaved table below is the one the bounds are read from."]
    if numba.get("interleaved"):
        rounds = len(next(iter(numba["interleaved"]["cuemm"].values())))
        with_default = len(next(iter(numba["interleaved"]["default"].values())))
        counted = (f"{rounds} rounds of 1,000 pairs" if with_default == rounds else
                   f"{rounds} rounds of 1,000 pairs, the default in the first {with_default} of them")
        lines += ["", "The same, with the three managers interleaved in one process (swapped in as the context's "
                  f"manager for each size in turn, {counted}, cuemm's and the floor's loops "
                  "back to back, after each ran 5,000 untimed pairs of each size; ratios are the medians of each "
                  "round's ratio, so drifts between processes and rounds cancel):", ""]
        lines += interleaved_table(numba["interleaved"], "cuemm (pool)")
    for kind in ("pinned", "mapped"):
        floor = numba[kind].get("floor") or {}
        lines += ["", f"`cuda.{kind}_array(n)` + release (floor: one fixed pinned buffer, wrapped as Numba wraps it):",
                  "", "| size | default | cuemm | floor | default / cuemm | default / floor | cuemm / floor |",
                  "|---|---|---|---|---|---|---|"]
        for s, samples in numba[kind]["cuemm"].items():
            d, c = statistics.median(numba[kind]["default"][s]), statistics.median(samples)
            f = statistics.median(floor[s]) if floor.get(s) else None
            cells = [fmt(f), f"{d / f:,.1f}x", f"{c / f:.2f}"] if f else ["-", "-", "-"]
            lines.append(f"| {int(s):,} B | {fmt(d)} | {fmt(c)} | " + " | ".join([cells[0], f"{d / c:,.1f}x"] + cells[1:])
                         + " |")
        if numba.get(f"interleaved-{kind}"):
            lines += ["", "The same, interleaved in one process as above (each manager first ran one round's pairs "
                      "untimed). In one warm process the default's small pinned allocations cost less than in a "
                      "fresh one, so default / floor, what any plugin could reach, is lower here:", ""]
            lines += interleaved_table(numba[f"interleaved-{kind}"], "cuemm")
    if numba.get("stream"):
        lines += numba_stream_lines(numba["stream"])
    lines += ["", "Python threads, `cuda.to_device(8 KiB)` + release with content checks, pairs per second:", ""]
    for manager, row in numba["threads"].items():
        lines.append(f"- {manager}: " + ", ".join(f"{t} thread(s) {row[t]['pairs_per_second']:,.0f} "
                                                  f"({row[t]['errors']} errors)" for t in sorted(row, key=int)))
    lines.append("")
    if args.python_pools:
        lines += python_pools_lines(json.load(open(args.python_pools)))
    text = "\n".join(lines)
    with open(args.out, "w") as out:
        out.write(text)
    if args.previous:
        gpu = gpu_name(text)
        path = previous_of_the_same_gpu(args.previous, gpu)
        if path is None:
            missing = f"nothing to compare with (no earlier run on {gpu} in {', '.join(args.previous)})"
            print(f"pairs over 2x slower than the previous results: {missing}")
            print(f"fragmentation means over 0.04 above the previous results: {missing}")
            return
        previous = open(path).read()
        # Timings are noisy (README), so only large changes are named; a
        # regression once went unseen through two runs of this table.
        slower = slower_cells(previous, text, 2.0)
        print(f"pairs over 2x slower than the previous results ({path}): " + ("; ".join(slower) if slower else "none"))
        # Seeds move by a few hundredths from run to run (seals are paced in time).
        higher = higher_means(previous, text, 0.04)
        print(f"fragmentation means over 0.04 above the previous results ({path}): " + ("; ".join(higher) if higher else "none"))


if __name__ == "__main__":
    main()
