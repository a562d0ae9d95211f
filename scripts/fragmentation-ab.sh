#!/usr/bin/env bash
# A/B of peak reserved over peak live: `cuemm random` of an earlier commit
# (.carry/base, from `scripts/prepare-gpu-carry.sh --base COMMIT`) against
# the working tree's, each workload's seeds run by scripts/fragmentation-seeds.sh,
# the two builds alternated ROUNDS times. Threads of random sizes move a
# workload's mean by a few hundredths from one run to the next (their frees
# interleave differently), so one run of each build says little; the rounds'
# means say more. Prints, per workload, each build's mean over all rounds,
# each round's, and the ideal best fit's (on the build's own operations).
# On the driver that CUEMM_DRIVER picks; the environment passes through, so
# that a pool option compares too.
#
#   bash scripts/fragmentation-ab.sh     # the GPU check's threaded workloads, seeds 1-12, 3 rounds
#   ROUNDS=2 SEEDS=8 WORKLOADS='--max-size 1M --live 512M;--pattern queue' bash scripts/fragmentation-ab.sh
#   CUEMM_POOL_EXPANDABLE=1 bash scripts/fragmentation-ab.sh
#   BASE_TOOL=/tmp/old/bin/cuemm NEW_TOOL=build/bin/cuemm bash scripts/fragmentation-ab.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${ROUNDS:-3}
seeds=${SEEDS:-12}
IFS=';' read -r -a workloads <<<"${WORKLOADS:---max-size 1M --live 512M --threads 4;--max-size 256K --live 64M --threads 8}"
# BASE_TOOL and NEW_TOOL: two `cuemm` tools built already (no build, no .carry/base).
if [ -n "${BASE_TOOL:-}" ] && [ -n "${NEW_TOOL:-}" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tool_of() { if [ "$1" = base ]; then echo "$BASE_TOOL"; else echo "$NEW_TOOL"; fi; }
else
  # shellcheck source=scripts/ab-common.sh
  source "$root/scripts/ab-common.sh"
  build_both cuemm_tool
  tool_of() { echo "$work/$1/bin/cuemm"; }
fi

# One line a round, build and workload: the seeds' mean, the best fit's mean, and the workload.
: >"$work/fragmentation"
for ((round = 1; round <= rounds; ++round)); do
  for variant in base new; do
    for workload in "${workloads[@]}"; do
      # (One seed at a time by default: threads' interleaving, which sets these figures, as in the GPU check.)
      line=$(CUEMM_TOOL=$(tool_of $variant) WORKLOADS="$workload" SEEDS=$seeds JOBS=${JOBS:-1} \
               bash "$root/scripts/fragmentation-seeds.sh" | tail -n 1) || true
      # (A round with a failed seed counts as failed: its mean would leave that seed out.)
      mean=$(grep -v failed <<<"$line" | grep -oE '[0-9.]+ \(' | cut -d' ' -f1) || true
      best_fit=$(grep -oE '\[[0-9.]+\]' <<<"$line" | tr -d '[]') || true
      printf '%s\t%s\t%s\t%s\t%s\n' "$variant" "$round" "${mean:-failed}" "${best_fit:--}" "$workload" >>"$work/fragmentation"
    done
  done
done

echo "reserved/live, seeds 1-$seeds, $rounds round(s) alternated: mean over the rounds (each round's) [the best fit's]"
python3 - "$work/fragmentation" <<'PY'
import collections, sys
rounds = collections.defaultdict(list)
best_fit = collections.defaultdict(list)
workloads = []
for line in open(sys.argv[1]):
    variant, _, mean, reference, workload = line.rstrip("\n").split("\t")
    workloads.append(workload)
    rounds[(workload, variant)].append(mean)
    if reference != "-":
        best_fit[(workload, variant)].append(float(reference))
for workload in dict.fromkeys(workloads):
    print(f"  {workload}")
    means = {}
    for variant in ("base", "new"):
        figures = rounds[(workload, variant)]
        measured = [float(f) for f in figures if f != "failed"]
        means[variant] = sum(measured) / len(measured) if measured else None
        failed = len(figures) - len(measured)
        reference = best_fit[(workload, variant)]
        print(f"    {variant:4s} " + (f"{means[variant]:.3f}" if measured else "-") +
              f" ({' '.join(figures)})" + (f" [{sum(reference) / len(reference):.3f}]" if reference else "") +
              (f"; {failed} round(s) with a failed seed" if failed else ""))
    if means["base"] and means["new"]:
        print(f"    new - base {means['new'] - means['base']:+.3f}")
sys.exit(any("failed" in figures for figures in rounds.values()))
PY
