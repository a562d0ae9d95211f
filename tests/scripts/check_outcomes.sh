#!/usr/bin/env bash
# How scripts/gpu-check.sh sets its exit status past ctest (scripts/check-outcomes.sh): a check
# that fails fails the whole, and a numba-cuda run is given its settings and modules, summarized
# with its counts, and left out, failing the check, where the deadline is too near. The suite's
# comparison script is played by a stand-in interpreter.
# (Not `set -e`: gpu-check.sh runs without it, and a failing run must reach check_failed.)
set -uo pipefail
expect() { "$@" || { echo "check_outcomes.sh: line ${BASH_LINENO[0]}: not so: $*" >&2; exit 1; }; }
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What compare_suite reads from gpu-check.sh.
root=/checkout build=/build logs=$work summary=()
seconds_left=300
time_left() { echo $seconds_left; }
left_out() { echo "not run, $(time_left) s left before the deadline of 560 s"; }
# The stand-in: writes what it was given, prints a comparison's last lines, exits $STAND_IN_EXIT.
python=$work/python
cat >"$python" <<'STAND_IN'
#!/usr/bin/env bash
echo "$* | ${CUEMM_MEMORY_MANAGER:-} ${CUEMM_COMPARE_BASELINE:-}" >>"$(dirname "$0")/calls"
echo "cuemm: 12 ok, 0 failed, 0 errors, 1 skipped"
echo "difference: 0 fail or error only under cuemm"
exit "${STAND_IN_EXIT:-0}"
STAND_IN
chmod +x "$python"
# shellcheck source=scripts/check-outcomes.sh
source "$here/scripts/check-outcomes.sh"

# check_failed: 0 leaves the status alone and keeps the code where asked; anything else fails it.
kept=""
true; check_failed $? kept
expect [ "$kept" = 0 ]
expect [ "$checks_status" = 0 ]
false; check_failed $? kept
expect [ "$kept" = 1 ]
expect [ "$checks_status" = 1 ]
checks_status=0

# A run that passes: its settings reach the script, its modules follow the package path.
compare_suite "suite, async" suite.log CUEMM_MEMORY_MANAGER=async CUEMM_COMPARE_BASELINE=/b.json -- mod.one mod.two
expect [ "$(cat "$work/calls")" = "/checkout/tests/numba/compare_numba_cuda_suite.py /build/python mod.one mod.two | async /b.json" ]
expect [ "${summary[-1]}" = "suite, async: exit 0; cuemm: 12 ok, 0 failed, 0 errors, 1 skipped; difference: 0 fail or error only under cuemm" ]
expect [ "$checks_status" = 0 ]
# No settings, no modules: the script's own selection.
compare_suite "selection" selection.log --
expect [ "$(tail -1 "$work/calls")" = "/checkout/tests/numba/compare_numba_cuda_suite.py /build/python |  " ]
expect [ "$checks_status" = 0 ]

# A run that fails fails the check, and its line says how it exited.
STAND_IN_EXIT=3 compare_suite "suite (failing)" failing.log --
expect [ "${summary[-1]#"suite (failing): exit 3; cuemm: "}" != "${summary[-1]}" ]
expect [ "$checks_status" = 1 ]

# Too near the deadline: not run, said so, and the check fails.
checks_status=0
calls_before=$(wc -l <"$work/calls")
seconds_left=44
echo "cuemm: a log of an earlier check" >"$work/late.log"
compare_suite "suite, late" late.log CUEMM_MEMORY_MANAGER=pool -- mod
expect [ "$(wc -l <"$work/calls")" = "$calls_before" ]
expect [ ! -e "$work/late.log" ]
expect [ "${summary[-1]}" = "suite, late: not run, 44 s left before the deadline of 560 s" ]
expect [ "$checks_status" = 1 ]
echo "check_outcomes.sh: passed"
