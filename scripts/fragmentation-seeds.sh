#!/usr/bin/env bash
# Peak reserved over peak live on the one-thread workloads whose seeds
# scripts/gpu-check.sh reports (bench/RESULTS.md), for a change to the pool's
# placement to be measured before a GPU run: each workload's mean and worst
# seed, with the ideal best fit's mean on the same operations beside it.
# It runs on the driver that CUEMM_DRIVER picks; the pool's placement is the
# same on the simulated one, where only the timing of seals differs (so a
# mean moves by about 0.01 from run to run, and not at all with PACE, which
# an A/B of a placement rule wants). The environment passes through,
# so that options compare side by side:
#
#   bash scripts/fragmentation-seeds.sh                          # the pool, seeds 1-8
#   CUEMM_POOL_EXPANDABLE=1 bash scripts/fragmentation-seeds.sh
#   SEEDS=16 MANAGER=async bash scripts/fragmentation-seeds.sh
#   WORKLOADS='--pattern training --shapes per-layer' bash scripts/fragmentation-seeds.sh
#   PACE=500 bash scripts/fragmentation-seeds.sh                 # seals by 500 ns an operation, not
#                                                                # the host's clock: every run the same
#   PER_SEED=1 PACE=500 bash scripts/fragmentation-seeds.sh      # also each seed's figure and seals
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${CUEMM_TOOL:-$root/build/bin/cuemm}
[ -x "$tool" ] || { echo "fragmentation-seeds: no $tool (bash scripts/build.sh)" >&2; exit 1; }
seeds=${SEEDS:-8}
manager=${MANAGER:-pool}
pace=${PACE:+--pace $PACE}
# shellcheck source=scripts/fragmentation-common.sh
source "$root/scripts/fragmentation-common.sh"
if [ -n "${WORKLOADS:-}" ]; then
  workloads=("$WORKLOADS")
else
  workloads=("${seed_workloads[@]}")
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One line a run (workload, seed), each its own process and pool, as many at once as there are CPUs.
for index in "${!workloads[@]}"; do
  for seed in $(seq 1 "$seeds"); do
    echo "\"$tool\" random ${workloads[$index]} $(length_of "${workloads[$index]}") --seed $seed --manager $manager $pace" \
         ">\"$work/$index.$seed\" 2>&1 || echo failed >>\"$work/$index.$seed\""
  done
done >"$work/runs"
xargs -P "${JOBS:-$(nproc)}" -I{} sh -c '{}' <"$work/runs"

echo "manager $manager, seeds 1-$seeds${PACE:+, seals paced by $PACE ns an operation}; reserved/live: mean (worst seed) [the best fit's mean]"
status=0
for index in "${!workloads[@]}"; do
  summary=$(for seed in $(seq 1 "$seeds"); do
    echo "$(reserved_over_live_or_failed <"$work/$index.$seed") $(same_order_reference_or_failed <"$work/$index.$seed")"
  done | awk '$1 == "failed" { failed++; next }
              { sum += $1; if ($1 > most) most = $1; n++; if ($2 != "failed") { reference += $2; m++ } }
              END { if (n) printf "%.3f (%.3f)", sum / n, most; else printf "-";
                    if (m) printf " [%.3f]", reference / m;
                    if (failed) printf "; %d seed(s) failed", failed }')
  case "$summary" in *failed*) status=1 ;; esac
  printf '  %-40s %s\n' "${workloads[$index]}" "$summary"
  if [ -n "${PER_SEED:-}" ]; then
    for seed in $(seq 1 "$seeds"); do
      printf '    seed %d: %s, %s seal(s)\n' "$seed" "$(reserved_over_live_or_failed <"$work/$index.$seed")" \
        "$(grep -o '[0-9]* seal(s)' "$work/$index.$seed" | cut -d' ' -f1)"
    done
  fi
done
exit $status
