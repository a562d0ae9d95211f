"""bench/make_results.py reads what scripts/gpu-check.sh writes: a misread costs a GPU run."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import make_results  # noqa: E402

CHECK_OUTPUT = """\
== --max-size 4M --live 512M, pool
manager pool: 20000 operations in 0.019 s (973 ns each); 0 allocation(s) failed; 363 seal(s), 42592 driver allocation(s), 12 driver free(s)
peak live 36.21 MiB (37972554 bytes), peak reserved 42.00 MiB (44040192 bytes): reserved/live 1.160
== --max-size 4M --live 512M, async
manager async: 20000 operations in 0.052 s (2588 ns each); 0 allocation(s) failed
peak live 36.21 MiB (37972554 bytes), peak reserved 48.00 MiB (50331648 bytes): reserved/live 1.326
== --max-size 4M --live 512M, best fit (reference)
manager best-fit: 20000 operations, a reference: an ideal best fit in one range that grows at its end (no device memory; see best_fit_reference.hpp)
peak live 36.21 MiB (37972554 bytes), peak reserved 40.00 MiB (41943040 bytes): reserved/live 1.105
== seeds 1-8 --max-size 4M --live 512M, pool: 1.300 1.100 1.200
== seeds 1-8 --max-size 4M --live 512M, pool (expandable; no thread caches): 1.050 1.150
== seeds 1-8 --max-size 1M --live 512M, pool:{empty}
== seeds 1-3 --max-size 256K --live 64M --threads 8, pool (expandable): 1.250 1.200 1.150
== seeds 1-3 --max-size 256K --live 64M --threads 8, best fit (reference, in the pool's order): 1.100 1.050 1.075
== seeds 1-8 --max-size 64M --live 256M, pool (expandable): 1.200 failed 1.100
== seeds 1-8 --max-size 4M --live 128M: not run, 12 s left before the deadline of 560 s
== replay of numba-cuda's suite log: not run, 3 s left before the deadline of 560 s
""".format(empty="        ")


def test_fragmentation_lines_read_runs_seeds_and_what_was_not_run(tmp_path):
    path = tmp_path / "bench_fragmentation.txt"
    path.write_text(CHECK_OUTPUT)
    text = "\n".join(make_results.fragmentation_lines(str(path)))
    assert "| `--max-size 4M --live 512M` | pool | 973 | 42,592 / 12 | 36.21 MiB | 42.00 MiB | 1.160 |" in text
    # Managers other than the pool count no driver calls.
    assert "| `--max-size 4M --live 512M` | async | 2588 | - | 36.21 MiB | 48.00 MiB | 1.326 |" in text
    # The best-fit reference takes no time of its own: no figure, rather than the row above's.
    assert "| `--max-size 4M --live 512M` | best fit (reference) | - | - | 36.21 MiB | 40.00 MiB | 1.105 |" in text
    assert "| `--max-size 4M --live 512M` | pool | 1-8 | 1.200 | 1.300 | 1.300 1.100 1.200 |" in text
    # A manager's name may hold a semicolon or a comma: the workload (which holds none) ends at the first ", ".
    assert "| `--max-size 4M --live 512M` | pool (expandable; no thread caches) | 1-8 | 1.100 | 1.150 |" in text
    # Threads side by side run fewer seeds; the range is the line's own.
    assert "| `--max-size 256K --live 64M --threads 8` | pool (expandable) | 1-3 | 1.200 | 1.250 |" in text
    assert ("| `--max-size 256K --live 64M --threads 8` | best fit (reference, in the pool's order) | 1-3 | 1.075 | 1.100 |"
            in text)
    # Seeds whose runs all failed give no row, rather than a mean of nothing.
    assert "`--max-size 1M --live 512M` | pool | 1-8" not in text
    # A seed whose run failed is named, not dropped from the mean in silence.
    assert "| `--max-size 64M --live 256M` | pool (expandable) | 1-8 | 1.150 | 1.200 | 1.200 1.100 (1 failed) |" in text
    not_run = [line for line in text.splitlines() if line.startswith("Not run in this check: ")]
    assert len(not_run) == 1
    assert "seeds 1-8 --max-size 4M --live 128M" in not_run[0] and "replay of numba-cuda's suite log" in not_run[0]


def pairs_table(raw_pair_1, memalloc_16):
    return f"""\
## C++: allocate+free pairs

### 1 thread(s)

| allocator | 256 B | 4,194,304 B |
|---|---|---|
| cuMemAlloc + cuMemFree | 93,712 | - |
| pool, raw allocate/deallocate | 26.3 | {raw_pair_1} |

### 16 thread(s)

| allocator | 256 B | 4,194,304 B |
|---|---|---|
| pool manager, memalloc (MemoryPointer) | 5.9 | {memalloc_16} |

## Allocation between kernels on 4 streams (C++)

| allocator | 65,536 B | 4,194,304 B |
|---|---|---|
| pool manager | 3,238 | 4,670 |
"""


def test_slower_cells_name_pairs_that_took_over_twice_as_long():
    previous = pairs_table("59.0", "10.6")
    cells = make_results.pair_cells(previous)
    assert cells[(1, "cuMemAlloc + cuMemFree", "256 B")] == 93712
    assert (1, "cuMemAlloc + cuMemFree", "4,194,304 B") not in cells  # "-": not measured
    assert (1, "pool manager", "65,536 B") not in cells  # another section's table
    # Noise within 2x is no regression; a cell that is over 2x slower is named.
    assert make_results.slower_cells(previous, pairs_table("110", "20.0"), 2.0) == []
    assert make_results.slower_cells(previous, pairs_table("59.0", "78.0"), 2.0) == [
        "16 thread(s), pool manager, memalloc (MemoryPointer), 4,194,304 B: 10.6 -> 78.0 ns (7.4x)"]


def seeds_table(mean):
    return f"""\
| workload | manager | seeds | mean | max | per seed |
|---|---|---|---|---|---|
| `--max-size 4M --live 512M` | pool | 1-8 | {mean} | 1.268 | 1.207 1.268 |
| `--max-size 4M --live 512M` | best fit (reference) | 1-8 | 1.087 | 1.137 | 1.117 1.137 |
| `--max-size 4M --live 512M` | pool | 45051 | 7,899 / 7,892 | 4.00 GiB | 4.19 GiB | 1.048 |
"""


def test_higher_means_name_seed_means_that_rose():
    means = make_results.fragmentation_means(seeds_table("1.188"))
    # The seed tables only: a fragmentation row of one run has seven cells.
    assert means == {("`--max-size 4M --live 512M`", "pool"): 1.188,
                     ("`--max-size 4M --live 512M`", "best fit (reference)"): 1.087}
    assert make_results.higher_means(seeds_table("1.188"), seeds_table("1.207"), 0.04) == []
    assert make_results.higher_means(seeds_table("1.188"), seeds_table("1.250"), 0.04) == [
        "`--max-size 4M --live 512M` pool: 1.188 -> 1.250"]


def test_a_fragmentation_only_run_replaces_the_section_and_says_where_it_came_from(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# results\n\n## Pinned host memory (C++)\n\npinned rows\n\n"
                       "## Fragmentation: `cuemm random` (old)\n\n| old | table |\n\nNot run in this check: seeds.\n\n"
                       "## Numba (Python): allocate + release, ns per pair\n\nnumba rows\n")
    run = tmp_path / "bench_fragmentation.txt"
    run.write_text("# From a run of its own (`CUEMM_GPU_FRAGMENTATION_ONLY=1`) of commit `abc1234`.\n" + CHECK_OUTPUT)
    out = tmp_path / "spliced.md"
    make_results.splice_fragmentation(str(results), str(run), str(out))
    text = out.read_text()
    assert "| old | table |" not in text and "Not run in this check: seeds." not in text
    assert "| `--max-size 4M --live 512M` | pool | 973 | 42,592 / 12 | 36.21 MiB | 42.00 MiB | 1.160 |" in text
    # The note sits under the section's heading, before its table.
    heading = text.index("## Fragmentation")
    note = text.index("From a run of its own (`CUEMM_GPU_FRAGMENTATION_ONLY=1`) of commit `abc1234`.")
    assert heading < note < text.index("| workload | manager |")
    # What came before and after the section is kept, in order.
    assert text.index("pinned rows") < heading < text.index("## Numba (Python)") < text.index("numba rows")
    assert text.count("## Fragmentation") == 1


def test_a_timings_only_run_leaves_a_section_that_the_tests_only_runs_fragmentation_fills(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("\n".join(["# results", "", "## Pinned host memory (C++)", "", "pinned rows"]
                                 + make_results.fragmentation_placeholder_lines()
                                 + ["", "## Numba (Python): allocate + release, ns per pair", "", "numba rows", ""]))
    run = tmp_path / "bench_fragmentation.txt"
    run.write_text("# From a run of its own (`CUEMM_GPU_TESTS_ONLY=1`) of commit `abc1234`.\n" + CHECK_OUTPUT)
    out = tmp_path / "spliced.md"
    make_results.splice_fragmentation(str(results), str(run), str(out))
    text = out.read_text()
    assert "Not measured in this run" not in text
    assert "From a run of its own (`CUEMM_GPU_TESTS_ONLY=1`) of commit `abc1234`." in text
    assert "| `--max-size 4M --live 512M` | pool | 1-8 | 1.200 | 1.300 | 1.300 1.100 1.200 |" in text
    assert text.index("pinned rows") < text.index("## Fragmentation") < text.index("numba rows")
    assert text.count("## Fragmentation") == 1


def test_the_alternated_scaling_rounds_are_read_by_size():
    runs = [{"benchmarks": [
        {"run_name": "PoolScalingAlternated/256/iterations:1/repeats:1/real_time", "ratio_median": 12.5,
         "ratio_lowest": 8.0, "ratio_highest": 15.0, "one_thread_ns": 20.0, "sixteen_threads_ns": 1.6},
        {"run_name": "PoolScalingAlternated/67108864/iterations:1/repeats:1/real_time", "ratio_median": 9.5,
         "ratio_lowest": 7.0, "ratio_highest": 11.0, "one_thread_ns": 50.0, "sixteen_threads_ns": 5.2},
        # Another family's counters, and an aggregate row, are not rounds.
        {"run_name": "PoolRawAllocateFree/256/real_time/threads:1", "aggregate_name": "median", "real_time": 20.0},
        {"run_name": "PoolScalingAlternated/1024/iterations:1/real_time", "aggregate_name": "median",
         "ratio_median": 1.0},
    ]}]
    rounds = make_results.scaling_rounds(runs)
    assert sorted(rounds) == [256, 67108864]
    assert rounds[256]["ratio_median"] == 12.5 and rounds[67108864]["sixteen_threads_ns"] == 5.2


def test_beside_kernels_gives_each_managers_time_and_the_pools_driver_calls():
    def median(name, rate, **counters):
        return {"run_name": name + "/67108864/1073741824/iterations:2/real_time", "aggregate_name": "median",
                "real_time": 1.0, "items_per_second": rate, **counters}
    runs = [{"benchmarks": [
        median("RandomSizesBesideKernels<cuemm::PoolMemoryManager>", 40_000.0, driver_calls_per_operation=0.4512),
        median("RandomSizesBesideKernels<cuemm::AsyncMemoryManager>", 250_000.0),
    ]}]
    runs[0]["benchmarks"].append(
        {"run_name": "TrainingStepsBesideKernels<cuemm::PoolMemoryManager>/0/0/iterations:2/real_time",
         "aggregate_name": "median", "real_time": 1.0, "items_per_second": 500_000.0,
         "driver_calls_per_operation": 0.0125, "gpu_waits_avoided": 14.0})
    text = "\n".join(make_results.beside_kernels_lines(runs))
    random_part, training_part = text.split("## Training steps beside kernels")
    assert "| pool manager | 25,000 | 0.451 | 0 |" not in random_part  # (no waits counter given)
    assert "| pool manager | 25,000 | 0.451 | - |" in random_part
    # A manager the run did not measure reads "-", and one that counts no driver calls too.
    assert "| pool manager, no segments of their own (`CUEMM_POOL_DEDICATED_SIZE=1T`) | - | - | - |" in random_part
    assert "| async manager | 4,000 | - | - |" in random_part
    assert "| pool manager | 2,000 | 0.013 | 14 |" in training_part
    assert "| async manager | - | - | - |" in training_part
    assert make_results.beside_kernels_lines([{"benchmarks": []}]) == []


def test_the_adaptors_scaling_line_names_each_adaptor_that_ran():
    m = {"AllocateFree<PoolWithLimit>/256/real_time/threads:1": 120.0,
         "AllocateFree<PoolWithLimit>/256/real_time/threads:16": 10.0,
         "AllocateFree<PoolWithTracking>/256/real_time/threads:1": 400.0,
         "AllocateFree<PoolWithTracking>/256/real_time/threads:16": 80.0,
         # One thread alone is no ratio.
         "AllocateFree<PoolWithStatistics>/256/real_time/threads:1": 100.0}
    line = make_results.adaptor_scaling_line(m, [256, 65536])
    assert line.endswith("limit 256 B 12.0x; tracking 256 B 5.0x")
    assert "statistics" not in line
    assert make_results.adaptor_scaling_line({}, [256]) == ""


def test_the_pinned_pools_scaling_line_gives_each_size_that_ran_at_both_thread_counts():
    m = {"PinnedHostPoolScaling/4096/real_time/threads:1": 60.0,
         "PinnedHostPoolScaling/4096/real_time/threads:16": 5.0,
         # One thread alone is no ratio.
         "PinnedHostPoolScaling/1048576/real_time/threads:1": 90.0}
    line = make_results.pinned_scaling_line(m)
    assert "over one thread's: 4,096 B 12.0x (" in line
    assert "4,096 B 60.0 / 5.0)" in line
    assert "1,048,576" not in line
    assert make_results.pinned_scaling_line({}) == ""


def test_the_hand_over_table_has_a_row_for_each_allocator_and_a_dash_where_one_did_not_run():
    m = {"PoolRawHandOver/256/real_time": 230.0, "PoolRawHandOver/67108864/real_time": 1119.4,
         "DriverPoolHandOver/1048576/real_time": 12266.9, "PoolMemallocHandOver/4194304/real_time": 901.2,
         "PoolRawHandOver/2097152/real_time": 344.6}
    lines = make_results.hand_over_lines(m)
    assert lines[0] == "## Blocks handed over between threads (C++)"
    assert "| allocator | 256 B | 1,048,576 B | 2,097,152 B | 4,194,304 B | 67,108,864 B |" in lines
    assert "| pool manager, raw interface | 230 | - | 345 | - | 1,119 |" in lines
    assert "| driver's stream-ordered pool (each thread's per-thread stream) | - | 12,267 | - | - | - |" in lines
    assert "| PyTorch CUDACachingAllocator raw_alloc/raw_delete | - | - | - | - | - |" in lines
    assert "| pool manager, memalloc (MemoryPointer) | - | - | - | 901 | - |" in lines
    assert make_results.hand_over_lines({"PoolRawAllocateFree/256/real_time/threads:1": 20.0}) == []
    pinned = make_results.hand_over_lines({**m, "PinnedHostPoolHandOver/4096/real_time": 1662.0})
    assert pinned[-2].endswith("thread fills and another drops): 4,096 B 1,662 ns a block."), pinned[-2]
    assert not any("seals per 1000 blocks" in line for line in pinned)
    counted = make_results.hand_over_lines(m, {"PoolRawHandOver/256/real_time": 0.12,
                                               "PoolRawHandOver/67108864/real_time": 193.49,
                                               "PoolRawAllocateFree/256/real_time/threads:1": 3.9})
    assert ("The pool's seals per 1000 blocks handed over (raw interface): 256 B 0.1, 67,108,864 B 193.5."
            in counted), counted


def test_the_pair_tables_put_the_driver_pool_on_the_legacy_stream_beside_the_async_manager():
    m = {"DriverPoolAllocateFree/256/real_time/threads:1": 1186.0,
         "DriverPoolLegacyStreamAllocateFree/256/real_time/threads:1": 1250.4,
         "AllocateFree<cuemm::AsyncMemoryManager>/256/real_time/threads:1": 1584.0,
         "PoolRawAllocateFree/65536/real_time/threads:16": 1.84}
    lines = make_results.pair_tables(m, [256, 65536])
    assert [line for line in lines if line.startswith("### ")] == ["### 1 thread(s)", "### 4 thread(s)",
                                                                   "### 16 thread(s)"]
    one = lines[:lines.index("### 4 thread(s)")]
    legacy = "| driver's stream-ordered pool on the legacy stream (where the async manager's requests go) | 1,250 | - |"
    assert legacy in one
    assert one.index(legacy) + 1 == one.index("| async manager (driver's stream-ordered pool) | 1,584 | - |")
    assert "| pool, raw allocate/deallocate | - | 1.8 |" in lines[lines.index("### 16 thread(s)"):]


def test_a_run_is_compared_with_the_earlier_results_of_its_own_gpu(tmp_path):
    def results(name):
        return f"# cuemm benchmark results\n\n- commit: `abc1234`\n- GPU, driver, memory: {name}, 580.159.04, 1 MiB\n"
    h100, h200 = tmp_path / "RESULTS.md", tmp_path / "RESULTS-H200.md"
    h100.write_text(results("NVIDIA H100 80GB HBM3"))
    h200.write_text(results("NVIDIA H200"))
    assert make_results.gpu_name(h200.read_text()) == "NVIDIA H200"
    paths = [str(h100), str(h200), str(tmp_path / "missing.md")]
    assert make_results.previous_of_the_same_gpu(paths, "NVIDIA H200") == str(h200)
    assert make_results.previous_of_the_same_gpu(paths, "NVIDIA H100 80GB HBM3") == str(h100)
    assert make_results.previous_of_the_same_gpu(paths, "NVIDIA B200") is None
    assert make_results.gpu_name("no header") is None


def test_the_stream_table_gives_each_size_both_calls_and_the_median_of_the_rounds_ratios():
    samples = {"cuda.device_array": {"256": [100.0, 200.0, 300.0]},
               "cuemm.device_array(stream=0)": {"256": [150.0, 200.0, 600.0]}}
    lines = make_results.numba_stream_lines(samples)
    assert "3 rounds of 1,000 pairs" in lines[1], lines
    row = [line for line in lines if line.startswith("| 256 B")]
    assert row == ["| 256 B | 200 | 200 | 1.50x |"], lines  # ratios 1.5, 1.0, 2.0


def test_the_one_stream_loop_table_gives_each_allocators_time_and_reserved_memory():
    def run(name, time, mib):
        return {"run_name": name, "aggregate_name": "median", "real_time": time, "reserved_mib": mib}

    runs = [{"benchmarks": [
        run("PoolOneStreamLoopBesideKernels/65536/20000/iterations:20000/real_time", 20755.2, 2.0),
        run("PoolOneStreamLoopBesideKernels/4194304/20000/iterations:20000/real_time", 21545.0, 4.0),
        run("DriverPoolOneStreamLoopBesideKernels/4194304/20000/iterations:20000/real_time", 22887.0, 32.0),
        {"run_name": "DriverPoolOneStreamLoopBesideKernels/65536/20000/iterations:20000/real_time",
         "aggregate_name": "mean", "real_time": 1.0, "reserved_mib": 1.0}]}]  # (not a median: left out)
    lines = make_results.one_stream_loop_lines(runs)
    assert lines[0] == "## A loop on one stream of the program's, the GPU behind (C++)"
    assert "| allocator | 65,536 B: ns, MiB | 4,194,304 B: ns, MiB |" in lines
    assert "| pool manager, stream-ordered | 20,755, 2 | 21,545, 4 |" in lines
    assert "| driver's stream-ordered pool | - | 22,887, 32 |" in lines
    assert make_results.one_stream_loop_lines([{"benchmarks": []}]) == []
