#!/usr/bin/env bash
# gpu-check's reading of its fragmentation report (scripts/fragmentation-common.sh): every run
# that printed a figure passes, and a run that crashed or erred, a seed that failed and a replay
# that erred are each named; a run left out for the deadline is not. The runs that pass are real
# output of the tool given as $1 (on the simulated driver here, as in gpu-check's report).
set -euo pipefail
trap 'echo "check_fragmentation_failures.sh: line $LINENO failed: $BASH_COMMAND" >&2' ERR
tool=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/fragmentation-common.sh
source "$root/scripts/fragmentation-common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A report as gpu-check assembles it, of runs that all printed their figures.
{
  echo "# From a run of its own"
  echo "== --max-size 1M --live 32M, pool"
  "$tool" random --max-size 1M --live 32M --operations 2000 --manager pool
  echo "== --max-size 1M --live 32M, best fit (reference)"
  "$tool" random --max-size 1M --live 32M --operations 2000 --manager best-fit
  echo "== --max-size 1M --live 32M --threads 2, pool"
  "$tool" random --max-size 1M --live 32M --operations 1000 --threads 2 --manager pool
  echo "== --pattern training, default: not run, 12 s left before the deadline of 560 s"
  echo "== seeds 1-3 --max-size 1M --live 32M, pool: 1.101 1.097 1.120"
  echo "== replay of numba-cuda's suite log: not run (numba-cuda's suite, which records it, is not run here)"
} >"$work/clean.txt"
[ "$(grep -c 'reserved/live' "$work/clean.txt")" -ge 3 ]
[ -z "$(fragmentation_failures <"$work/clean.txt")" ]

# The same, with a run that crashed, a seed that failed, and a replay that erred (its output an
# error, as the tool prints for a log it cannot read), each after runs that passed.
{
  cat "$work/clean.txt"
  echo "== --max-size 64M --live 4G, async"
  echo "Segmentation fault (core dumped)"
  echo "== seeds 1-3 --max-size 4M --live 512M, pool (expandable): 1.094 failed 1.137"
  echo "== replay of numba-cuda's suite log (814 rows), pool"
  "$tool" replay "$work/no-such-log.csv" 2>&1 || true
} >"$work/broken.txt"
fragmentation_failures <"$work/broken.txt" >"$work/found.txt"
cat "$work/found.txt"
[ "$(wc -l <"$work/found.txt")" = 3 ]
grep -qx -- "--max-size 64M --live 4G, async" "$work/found.txt"
grep -qx -- "seeds 1-3 --max-size 4M --live 512M, pool (expandable): 1.094 failed 1.137" "$work/found.txt"
grep -qx -- "replay of numba-cuda's suite log (814 rows), pool" "$work/found.txt"
# The last run of a report is read too (nothing after it closes it).
printf '== --max-size 1M --live 32M, pool\ncuemm: stopped\n' | fragmentation_failures | grep -qx -- "--max-size 1M --live 32M, pool"
echo "check_fragmentation_failures.sh: passed"
