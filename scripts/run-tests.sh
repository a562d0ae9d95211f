#!/usr/bin/env bash
# Every test: set up, build, run the C++ suite (ctest) on the simulated driver
# (the real one where a GPU is usable), then classic Numba's own cudadrv tests
# against the simulated driver. Ends with one summary line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
"$root/scripts/build.sh"

status=0
echo "== C++ tests (ctest)"
(cd "$build" && ctest --output-on-failure --timeout 300) || status=1

echo "== benchmark smoke (fails only if a benchmark crashes, never on timing)"
if [ -x "$build/bin/bench_allocators" ]; then
  "$build/bin/bench_allocators" --benchmark_min_time=0.01 --benchmark_filter='Pool|DefaultMemoryManager>/256/' \
    >/tmp/cuemm-bench-smoke.txt 2>&1 || { tail -20 /tmp/cuemm-bench-smoke.txt; status=1; }
fi

echo "== install, and use through find_package(cuemm)"
"$root/scripts/check-install.sh" || status=1

echo "== classic Numba cudadrv tests on the simulated driver"
(cd /tmp && /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" "$build/lib/libcuemm_simdriver.so") || status=1

if ((status)); then echo "run-tests: FAILED"; else echo "run-tests: all passed"; fi
exit $status
