#!/usr/bin/env bash
# The README starts with the two set-up commands, and holds no paragraph twice
# (a status update once pasted its paragraph over the whole file).
set -euo pipefail
readme="$(cd "$(dirname "$0")/.." && pwd)/README.md"
status=0
for command in "bash scripts/run-main.sh" "bash scripts/run-tests.sh"; do
  head -n 20 "$readme" | grep -qF "$command" || { echo "README: '$command' is not among its first 20 lines"; status=1; }
done
repeated=$(awk 'length($0) >= 40 && !/^(```|\|)/ { seen[$0]++ } END { for (line in seen) if (seen[line] > 1) print seen[line] "x: " line }' "$readme")
if [ -n "$repeated" ]; then
  echo "README: lines that appear more than once:"
  echo "$repeated" | head -5
  status=1
fi
exit $status
