# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh and scripts/gpu-quick-check.sh: what a
# `ctest -V` log says of the GoogleTest cases it ran.

# "N passed, N skipped, N failed" (ctest prefixes each line of a test's output with its number).
gtest_case_counts() {  # log
  echo "$(grep -hoE '^[0-9]+: \[  PASSED  \] [0-9]+' "$1" | awk '{s+=$NF} END {print s+0}') passed," \
       "$(grep -cE '^[0-9]+: \[  SKIPPED \] [A-Za-z].* \([0-9]+ ms\)' "$1") skipped," \
       "$(grep -cE '^[0-9]+: \[  FAILED  \] [A-Za-z].* \([0-9]+ ms\)' "$1") failed"
}
