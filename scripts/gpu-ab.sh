#!/usr/bin/env bash
# A/B of the allocation benchmarks on the GPU machine: the source in .carry/base
# (an earlier commit: `scripts/prepare-gpu-carry.sh --base COMMIT` puts it
# there) against the working tree, each built once, their processes
# alternated ROUNDS times so that drifts of the host fall on both. Prints, per
# benchmark, each build's median (min-max) and new/base. How the A/B figures
# in docs/pool-measurements.md were taken.
#
#   ROUNDS=5 FILTER='PoolRawAllocateFree/.*threads:1$' bash scripts/gpu-ab.sh
#   bash scripts/gpu-ab.sh   # without a GPU: on the simulated driver (CUEMM_DRIVER=auto|cuda|sim)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
filter=${FILTER:-'PoolRawAllocateFree/.*/threads:(1|16)$|PoolStreamOrderedAllocateFree/.*/threads:1$|PinnedHostPoolAllocateFree/|AllocateFree<cuemm::PoolMemoryManager>/(256|1048576)/.*threads:1$'}
rounds=${ROUNDS:-3}
# shellcheck source=scripts/ab-common.sh
source "$root/scripts/ab-common.sh"
build_both bench_allocators

: >"$work/times"
for ((round = 1; round <= rounds; ++round)); do
  for variant in base new; do
    # JSON, not CSV: Google Benchmark's CSV reporter aborts when families
    # with and without user counters are mixed in one run.
    "$work/$variant/bin/bench_allocators" --benchmark_min_time=0.3 --benchmark_filter="$filter" \
        --benchmark_format=json 2>"$work/$variant.stderr" >"$work/run.json" ||
      { tail -5 "$work/$variant.stderr"; exit 1; }
    [ -s "$work/run.json" ] || { echo "gpu-ab: no benchmark matches FILTER=$filter" >&2; exit 1; }
    python3 -c 'import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    print(sys.argv[2], b["name"], b["real_time"])' "$work/run.json" "$variant" >>"$work/times"
  done
done
python3 - "$work/times" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(list)
names = []
for line in open(sys.argv[1]):
    variant, name, ns = line.split()
    times[(name, variant)].append(float(ns))
    names.append(name)
for name in dict.fromkeys(names):
    base, new = times[(name, "base")], times[(name, "new")]
    if not base or not new:
        continue
    cell = lambda t: f"{statistics.median(t):8.1f} ({min(t):.1f}-{max(t):.1f})"
    print(f"{name:64s} base {cell(base)}  new {cell(new)}  new/base {statistics.median(new) / statistics.median(base):.2f}")
PY
