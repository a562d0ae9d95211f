# shellcheck shell=bash
# (Its globals are the caller's: set there, or read there.)
# shellcheck disable=SC2034,SC2154
# Sourced by scripts/gpu-check.sh: how each check past ctest sets the script's exit status
# ($checks_status), and numba-cuda's runs, each a check. compare_suite reads the caller's $logs,
# $python, $root, $build, summary array and time_left / left_out (the deadline's). Checked by
# tests/scripts/check_outcomes.sh.

# Records the exit status $1 of a check past ctest (in the variable named $2, when given): pytest,
# pip, numba-cuda's runs, and benchmarks, which exit other than 0 only when they crash or fail,
# never on timing. Any but 0 fails the whole check, as ctest's does (before, only the summary
# line told of a failed pytest).
checks_status=0
check_failed() {
  [ -n "${2:-}" ] && printf -v "$2" '%s' "$1"
  [ "$1" = 0 ] || checks_status=1
}
# One run of numba-cuda's suite without and with the plugin (tests/numba/compare_numba_cuda_suite.py):
# $1 its summary label, $2 its log's name in $logs, then `env` settings, `--`, and the test modules
# (none: the script's own selection). The summary line adds cuemm's counts and the difference.
# Where under 45 s are left before the deadline it does not run, and that fails the check: a run
# that the device cuts off prints no summary at all (94536fe's tests, on a cold machine).
compare_suite() {
  local label=$1 log=$logs/$2 settings=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
  shift
  # (A log of an earlier check into the same folder must not stand for a run left out.)
  rm -f "$log"
  if [ "$(time_left)" -lt 45 ]; then
    summary+=("$label: $(left_out)")
    checks_status=1
    return
  fi
  (cd /tmp && env "${settings[@]}" "$python" "$root/tests/numba/compare_numba_cuda_suite.py" "$build/python" "$@") \
    >"$log" 2>&1
  check_failed $? run_status
  summary+=("$label: exit $run_status; $(grep -E '^cuemm:' "$log" | tail -1); $(grep '^difference' "$log")")
}
