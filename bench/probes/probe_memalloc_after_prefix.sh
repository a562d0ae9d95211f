#!/usr/bin/env bash
# Do the pool's memalloc pairs from 4 threads run slower when other
# benchmarks ran before them in the same process? In gpu-check's full run on
# the H200 (a156ce3) they read 2.4x their usual time while the statistics
# adaptor over a pool, the same pool path, did not (docs/pool-measurements.md,
# "4 threads' memalloc pairs after the benchmarks before them"). Runs
# bench_allocators twice on the same cells: after PREFIX (a --benchmark_filter
# regex of the benchmarks to run first; default: all those registered before
# them), then alone, and prints the medians with the CPU time a pair (of all
# threads) and the pool's seals. The cause was two threads' pointer objects on
# one cache line (fixed in e6995d9): since then both runs should read alike,
# as they did on the H200 at ea0ac08 (4 threads 16.2-18.6 ns a pair after the
# prefix, 17.1-18.9 alone).
#   bash bench/probes/probe_memalloc_after_prefix.sh BUILD_DIR
#   PREFIX='^(PinnedHostPoolHandOver)/' bash bench/probes/probe_memalloc_after_prefix.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: probe_memalloc_after_prefix.sh BUILD_DIR (with bin/bench_allocators)}
prefix=${PREFIX:-'^(DriverMemHostAllocFree|PinnedHostPoolAllocateFree|PinnedHostPoolScaling|PinnedHostPoolHandOver|DriverMemAllocFree|DriverPoolAllocateFree|DriverPoolLegacyStreamAllocateFree|AllocateFree<cuemm::DefaultMemoryManager>)/'}
cells=${CELLS:-'AllocateFree<(cuemm::PoolMemoryManager|PoolWithStatistics)>/(256|65536|1048576)/real_time/threads:(1|4|16)$'}
run() {  # title, filter
  echo "== $1"
  "$build/bin/bench_allocators" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_min_time=0.1 --benchmark_filter="$2" 2>/dev/null |
    awk '/^AllocateFree<.*_median/ { printf "%s %s ns, cpu %s ns a pair, %s\n", $1, $2, $4, $NF }'
}
run "after the prefix" "$prefix|$cells"
run "alone" "$cells"
