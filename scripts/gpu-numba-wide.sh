#!/usr/bin/env bash
# numba-cuda's whole cudapy test package (and its other packages: documentation
# examples, benchmarks, nocuda, nrt),
# with and without the cuemm plugin, beyond the selection that gpu-check.sh
# runs: tests/numba/compare_numba_cuda_suite.py on the GPU machine. The whole
# takes longer than one command there may run (10 minutes), so it runs in
# parts, each taking every Nth module:
#   bash scripts/gpu-numba-wide.sh K N     (part K of N, from 1; all of it took
#   about 14 minutes on the H100, so 4 parts leave room)
#   LIST=1 bash scripts/gpu-numba-wide.sh K N   (only names the part's modules)
# The four parts also run side by side in one command, each with its own
# BUILD_DIR and OUT (252 s on the H100's 16 cores):
#   for k in 1 2 3 4; do OUT=$OUT/p$k BUILD_DIR=/tmp/b$k bash scripts/gpu-numba-wide.sh $k 4 & done; wait
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-/tmp/cuemm-gpu-build}
usage="usage: gpu-numba-wide.sh K N (part K of N)"
part=${1:?$usage}
parts=${2:?$usage}
logs=${OUT:-/tmp/cuemm-gpu-logs}
mkdir -p "$logs"
python=$(command -v python3)
modules=$("$python" - "$root/tests/numba" "$part" "$parts" <<'PYTHON'
import os
import sys

import numba.cuda.tests.cudapy as cudapy

sys.path.insert(0, sys.argv[1])
from compare_numba_cuda_suite import DEFAULT_MODULES

part, parts = int(sys.argv[2]), int(sys.argv[3])
if not 1 <= part <= parts:
    sys.exit(f"part {part} of {parts} does not exist")
names = sorted(f"numba.cuda.tests.cudapy.{name[:-3]}" for name in os.listdir(os.path.dirname(cudapy.__file__))
               if name.startswith("test_") and name.endswith(".py"))
# With the other test packages (documentation examples, benchmarks, nocuda, nrt, ...: what this
# numba-cuda has), but the simulator's (cudasim: no GPU) and the helpers (support, data).
import pkgutil
import numba.cuda.tests as tests
others = sorted(f"numba.cuda.tests.{m.name}" for m in pkgutil.iter_modules(tests.__path__)
                if m.ispkg and m.name not in {"cudadrv", "cudapy", "cudasim", "support", "data"})
names = [name for name in names if name not in DEFAULT_MODULES] + others
print(" ".join(names[part - 1::parts]))
PYTHON
)
if [ "${LIST:-0}" = 1 ]; then
  echo "$modules" | tr ' ' '\n'
  exit 0
fi
BUILD_DIR=$build "$root/scripts/build.sh" --python-only >"$logs/build.log" 2>&1
# (Word splitting of $modules is wanted: one argument each.)
# shellcheck disable=SC2086
(cd /tmp && "$python" "$root/tests/numba/compare_numba_cuda_suite.py" "$build/python" $modules) \
  >"$logs/numba-wide-$part-of-$parts.log" 2>&1 && status=0 || status=$?
grep -E "^(default|cuemm|difference|raw-handle|  )" "$logs/numba-wide-$part-of-$parts.log" || true
echo "SUMMARY: part $part of $parts ($(echo "$modules" | wc -w) modules): exit $status; $(grep '^difference' "$logs/numba-wide-$part-of-$parts.log")"
exit "$status"
