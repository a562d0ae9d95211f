#!/usr/bin/env bash
# A short check on the GPU machine, for a change whose full check
# (scripts/gpu-check.sh: 460 s for its tests alone) the session's device
# time left cannot pay for: builds the library, the Python module and only
# the named test programs, runs those programs' ctest entries on the real
# driver, then pytest (108 s for the pool's program on the H200 at
# 402269a: 33 s of build). Prints a short
# summary last; exits non-zero if anything failed.
#
#   bash scripts/gpu-quick-check.sh                                  # test_pool_memory_manager
#   bash scripts/gpu-quick-check.sh test_pool_memory_manager test_async_memory_manager
#   CUEMM_QUICK_SKIP_PYTHON=1 bash scripts/gpu-quick-check.sh test_blocking_hook
#   CUEMM_DRIVER=sim PYTHON=/usr/bin/python3 bash scripts/gpu-quick-check.sh   # the same without a GPU
#
# PYTHON: the interpreter that builds the module and runs pytest (default:
# the python3 first on PATH, which on the GPU machine has numba-cuda).
# Carry `.carry` (scripts/prepare-gpu-carry.sh): the GPU machine has no
# GoogleTest of its own. Logs go to $OUT when it is set.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/ctest-summary.sh
source "$root/scripts/ctest-summary.sh"
# shellcheck source=scripts/carried-flags.sh
source "$root/scripts/carried-flags.sh"
build=${BUILD_DIR:-/tmp/cuemm-quick-build}
logs=${OUT:-/tmp/cuemm-quick-logs}
driver=${CUEMM_DRIVER:-cuda}
mkdir -p "$logs"
programs=("$@")
[ ${#programs[@]} -gt 0 ] || programs=(test_pool_memory_manager)
python_checks=1
[ "${CUEMM_QUICK_SKIP_PYTHON:-0}" = 1 ] && python_checks=0
began=$SECONDS

args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUEMM_BUILD_TESTS=ON -DCUEMM_BUILD_EXAMPLES=OFF
      -DCUEMM_BUILD_BENCHMARKS=OFF -DCUEMM_TEST_DRIVER="$driver")
add_carried_flags args
python=${PYTHON:-$(command -v python3)}
add_python_flags args "$python"
targets=("${programs[@]}")
[ $python_checks = 1 ] && targets+=(cuemm_python)
[ "$driver" = sim ] && targets+=(cuemm_simdriver)
if ! { CMAKE_POLICY_VERSION_MINIMUM=3.5 cmake -S "$root" -B "$build" "${args[@]}" >"$logs/build.log" 2>&1 &&
       cmake --build "$build" --target "${targets[@]}" >>"$logs/build.log" 2>&1; }; then
  tail -30 "$logs/build.log"
  echo "SUMMARY: build failed ($logs/build.log)"
  exit 1
fi
summary=("build: ok, $((SECONDS - began)) s (${programs[*]})")

# Each program's own ctest entry (its environment and timeout, as the full check runs it).
selection="^($(IFS='|'; echo "${programs[*]}"))\$"
(cd "$build" && ctest --output-on-failure --timeout 300 -V -R "$selection") >"$logs/ctest.log" 2>&1
ctest_status=$?
grep -q "No tests were found" "$logs/ctest.log" && { echo "no ctest entry matches $selection"; ctest_status=1; }
grep -E "^[0-9]+: \[  FAILED  \] [A-Za-z]" "$logs/ctest.log" | head -20
summary+=("ctest ($driver driver): $(grep -E 'tests passed' "$logs/ctest.log" | tail -1)")
summary+=("gtest cases: $(gtest_case_counts "$logs/ctest.log")")

pytest_status=0
if [ $python_checks = 1 ]; then
  python_env=(PYTHONPATH="$build/python" CUEMM_DRIVER="$driver")
  # Numba loads the driver itself: the simulated one where there is no GPU.
  [ "$driver" = sim ] && python_env+=(NUMBA_CUDA_DRIVER="$build/lib/libcuemm_simdriver.so")
  (cd /tmp && env "${python_env[@]}" "$python" -m pytest -q -p no:cacheprovider "$root/tests/python") \
    >"$logs/pytest.log" 2>&1
  pytest_status=$?
  summary+=("pytest ($driver driver): $(tail -1 "$logs/pytest.log")")
fi

echo
echo SUMMARY
printf '  %s\n' "${summary[@]}" "seconds: $((SECONDS - began))"
[ $ctest_status = 0 ] && [ $pytest_status = 0 ]
