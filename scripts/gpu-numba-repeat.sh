#!/usr/bin/env bash
# Runs bench_numba's interleaved measurements in RUNS separate processes (default 6)
# on the GPU machine and prints each run's ratios, then the range over runs: how far
# one run of scripts/gpu-check.sh can move them. Builds without tests, benchmarks or examples.
#   bash scripts/gpu-numba-repeat.sh [RUNS] [KINDS]   (KINDS: bench_numba --kinds, default interleaved)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-/tmp/cuemm-gpu-build}
runs=${1:-6}
kinds=${2:-interleaved}
logs=${OUT:-/tmp/cuemm-gpu-logs}
mkdir -p "$logs"
python=$(command -v python3)
BUILD_DIR=$build "$root/scripts/build.sh" --python-only >"$logs/build.log" 2>&1
# Each run's JSON stays out of $logs but the first's (the device brings back
# only so many files; one is enough for the versions).
figures=$(mktemp -d)
for run in $(seq 1 "$runs"); do
  (cd /tmp && "$python" "$root/bench/bench_numba.py" --cuemm "$build/python" --kinds "$kinds" \
    --out "$figures/run$run.json") >"$logs/bench_numba_run$run.txt" 2>&1
  [ "$run" = 1 ] && cp "$figures/run1.json" "$logs/bench_numba_run1.json"
  echo "run $run: $("$python" "$root/bench/interleaved_ratios.py" "$figures/run$run.json" device_array cuemm/floor \
    --with-sizes)"
done | tee "$logs/runs.txt"
echo "SUMMARY (cuemm/floor by size over $runs runs: min max)"
grep -oE '[0-9]+ [0-9]\.[0-9]+' "$logs/runs.txt" | awk '
  { n[$1]++; if (!($1 in lo) || $2 < lo[$1]) lo[$1] = $2; if ($2 > hi[$1]) hi[$1] = $2 }
  END { for (s in n) printf "  %s B: %s %s (%d runs)\n", s, lo[s], hi[s], n[s] }' | sort -n -k1
