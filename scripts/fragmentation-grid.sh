#!/usr/bin/env bash
# RMM's random workload over a grid of largest sizes and live sets, beyond the
# check's seed workloads (docs/pool-measurements.md, "Sizes of 2-16 MiB"): a
# markdown table of peak reserved over peak live, mean (worst seed), for the
# pool and the expandable pool, with the ideal best fit's mean beside them.
# It runs scripts/fragmentation-seeds.sh for each cell, on the driver that
# CUEMM_DRIVER picks (the pool's placement is the same on the simulated one):
#
#   bash scripts/fragmentation-grid.sh
#   SIZES='2M 8M' LIVE='128M 512M' SEEDS=4 bash scripts/fragmentation-grid.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sizes=${SIZES:-2M 4M 8M 16M 32M 64M}
live_sets=${LIVE:-128M 512M 2G}

# "1.154 (1.268) [1.083]" from fragmentation-seeds.sh's one workload line, or "failed".
cell() { env "$@" bash "$root/scripts/fragmentation-seeds.sh" | tail -1 | grep -o '[0-9.]* ([0-9.]*)\( \[[0-9.]*\]\)\?' || echo failed; }

echo "| workload | pool | expandable pool | best fit |"
echo "|---|---|---|---|"
for size in $sizes; do
  for live in $live_sets; do
    workload="--max-size $size --live $live"
    pool=$(cell WORKLOADS="$workload")
    expandable=$(cell WORKLOADS="$workload" CUEMM_POOL_EXPANDABLE=1)
    best_fit=$(echo "$pool" | grep -o '\[[0-9.]*\]' | tr -d '[]' || true)
    echo "| up to $size, $live live | ${pool% \[*} | ${expandable% \[*} | ${best_fit:--} |"
  done
done
