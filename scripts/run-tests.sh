#!/usr/bin/env bash
# Every test: set up, build, run the C++ suite (ctest) on the simulated driver
# (the real one where a GPU is usable), the Python package's tests (pytest), and
# classic Numba's own cudadrv tests against the simulated driver, with Numba's
# default manager and with cuemm's plugin. Ends with one summary line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
# Debian's python3 is the one with python3-numba (pyenv or a venv may come first on PATH).
"$root/scripts/build.sh" -DPython_EXECUTABLE=/usr/bin/python3

status=0
# A ctest log's failed tests, each with the output that --output-on-failure put after its result line
# (the last lines of it): printed at the end, so that CI's record, which keeps the end, names the check.
failed_tests_output() {
  awk '/Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)/ { shown = 1 } /^ +Start +[0-9]+:/ { shown = 0 }
       shown' "$1" | tail -n 60
}
rm -f /tmp/cuemm-ctest.txt /tmp/cuemm-clang-ctest.txt  # (an earlier run's)
echo "== README (the two commands first)"
"$root/scripts/check-readme.sh" || status=1
echo "== the tests' environment (every manager setting the library reads is left out of the tests')"
"$root/scripts/check-test-environment.sh" || status=1

echo "== C++ tests (ctest)"
(cd "$build" && ctest --output-on-failure --timeout 300) 2>&1 | tee /tmp/cuemm-ctest.txt || status=1

echo "== a second compiler: everything built with clang++ and its C++ tests run (ctest)"
# Clang before 16 lacks two C++20 features GCC 12 has (lambdas that capture a
# structured binding, parenthesised aggregate initialisation): this keeps the
# library building for programs whose compiler is an older clang.
clang_build=${CLANG_BUILD_DIR:-$build-clang}
if BUILD_DIR=$clang_build "$root/scripts/build.sh" -DCMAKE_CXX_COMPILER=clang++ -DPython_EXECUTABLE=/usr/bin/python3 \
  >/tmp/cuemm-clang-build.txt 2>&1; then
  # (Its failed tests' output is printed at the end, with g++'s.)
  (cd "$clang_build" && ctest --output-on-failure --timeout 300 >/tmp/cuemm-clang-ctest.txt 2>&1) || status=1
  sed -n '/tests passed, /,$p' /tmp/cuemm-clang-ctest.txt
else
  grep -m 20 -A 4 "error:" /tmp/cuemm-clang-build.txt || tail -20 /tmp/cuemm-clang-build.txt
  status=1
fi

echo "== the pools' tests with seals on the legacy stream (a driver before CUDA 12.5: cuCtxRecordEvent refused)"
for suite in test_pool_memory_manager test_pinned_host_pool test_manager_conformance test_adaptors_stream_ordered \
  test_capture_scope; do
  CUEMM_DRIVER=sim CUEMM_SIM_FAULTS=cuCtxRecordEvent:1:801:1000000000000 "$build/bin/$suite" --gtest_brief=1 \
    >"/tmp/cuemm-legacy-seals-$suite.txt" 2>&1 || { tail -30 "/tmp/cuemm-legacy-seals-$suite.txt"; status=1; }
done

echo "== benchmark smoke (fails only if a benchmark crashes, never on timing)"
if [ -x "$build/bin/bench_allocators" ]; then
  # The benchmarks keep one manager of each kind for the whole process, and 16
  # threads of 64 MiB pairs leave up to 2 GiB each in a pool; each manager gives
  # back what it holds idle when the benchmarks move on to another
  # (bench_allocators.cpp, benchmarks_of), so all of them run in one process on
  # the simulated device's default 16 GiB (without that, the async manager's
  # ran out after the pool's). The benchmarks whose kernels fill their blocks
  # run in a process of their own: the simulated device's pages that a kernel
  # writes stay in host memory while a pool keeps them, and after the others
  # they took 16 GiB of the host (alone, 0.4).
  for filter in -Kernels Kernels; do
    "$build/bin/bench_allocators" --benchmark_min_time=0.01 \
      --benchmark_filter="$filter" >/tmp/cuemm-bench-smoke.txt 2>&1 || { tail -20 /tmp/cuemm-bench-smoke.txt; status=1; }
  done
fi

echo "== the main job (the README's first command: the library, the tool and the examples alone, in build-main)"
"$root/scripts/run-main.sh" >/tmp/cuemm-run-main.txt 2>&1 && grep -q "10 zeros, as sent" /tmp/cuemm-run-main.txt ||
  { tail -20 /tmp/cuemm-run-main.txt; status=1; }

echo "== install, and use through find_package(cuemm)"
"$root/scripts/check-install.sh" || status=1

sim_driver="$build/lib/libcuemm_simdriver.so"
echo "== the Python package and its Numba plugin (pytest, simulated driver)"
(cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=sim NUMBA_CUDA_DRIVER="$sim_driver" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/python") || status=1
echo "== the same with seals on the legacy stream (cuCtxRecordEvent refused, as before CUDA 12.5)"
(cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=sim NUMBA_CUDA_DRIVER="$sim_driver" \
  CUEMM_SIM_FAULTS=cuCtxRecordEvent:1:801:1000000000000 \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/python") || status=1

echo "== Numba benchmark smoke (the three managers interleaved in one process, and arrays on a stream; never on timing)"
(cd /tmp && CUEMM_DRIVER=sim NUMBA_CUDA_DRIVER="$sim_driver" /usr/bin/python3 "$root/bench/bench_numba.py" \
  --cuemm "$build/python" --kinds interleaved,stream --interleaved-rounds 2 --interleaved-extra-rounds 2 --stream-rounds 2 \
  >/tmp/cuemm-numba-bench-smoke.txt 2>&1) ||
  { tail -20 /tmp/cuemm-numba-bench-smoke.txt; status=1; }

echo "== Python pools benchmark smoke (cuemm's pool alone where CuPy and PyTorch are missing; never on timing)"
(cd /tmp && CUEMM_DRIVER=sim /usr/bin/python3 "$root/bench/bench_python_pools.py" --cuemm "$build/python" \
  --tool "$build/bin/cuemm" --rounds 1 --seeds 1 --out /tmp/cuemm-python-pools-smoke.json \
  >/tmp/cuemm-python-pools-smoke.txt 2>&1) ||
  { tail -20 /tmp/cuemm-python-pools-smoke.txt; status=1; }

echo "== classic Numba cudadrv tests on the simulated driver: default manager, then cuemm's plugin"
# (Each run names its manager: a shell's NUMBA_CUDA_MEMORY_MANAGER or CUEMM_MEMORY_MANAGER must not pick it.)
(cd /tmp && env -u NUMBA_CUDA_MEMORY_MANAGER /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" \
  "$sim_driver") || status=1
(cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=sim NUMBA_CUDA_MEMORY_MANAGER=cuemm CUEMM_MEMORY_MANAGER=pool \
  /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" "$sim_driver") || status=1
for manager in async default; do
  echo "== the plugin again under the $manager manager"
  (cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=sim NUMBA_CUDA_MEMORY_MANAGER=cuemm CUEMM_MEMORY_MANAGER=$manager \
    /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" "$sim_driver") || status=1
done
echo "== the plugin again under every adaptor at once (statistics, a log, tracking, a cap it stays under)"
(cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=sim NUMBA_CUDA_MEMORY_MANAGER=cuemm \
  CUEMM_ADAPTORS=statistics,log,tracking,limit CUEMM_LIMIT=12G CUEMM_LOG_FILE=/tmp/cuemm-classic-adaptors-%p.csv \
  /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" "$sim_driver") || status=1
rm -f /tmp/cuemm-classic-adaptors-*.csv
echo "== the same on two simulated devices that are peers (Numba's multi-GPU tests run)"
(cd /tmp && env -u NUMBA_CUDA_MEMORY_MANAGER CUEMM_SIM_DEVICES=2 CUEMM_SIM_PEER_ACCESS=1 \
  /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" "$sim_driver") || status=1
(cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=sim NUMBA_CUDA_MEMORY_MANAGER=cuemm CUEMM_MEMORY_MANAGER=pool \
  CUEMM_SIM_DEVICES=2 CUEMM_SIM_PEER_ACCESS=1 /usr/bin/python3 "$root/tests/numba/classic_numba_cudadrv.py" "$sim_driver") || status=1

if ((status)); then
  for log in /tmp/cuemm-ctest.txt /tmp/cuemm-clang-ctest.txt; do
    [ -s "$log" ] || continue
    failed=$(failed_tests_output "$log")
    if [ -n "$failed" ]; then printf '== the C++ tests that failed (%s)\n%s\n' "$log" "$failed"; fi
  done
  echo "run-tests: FAILED"
else
  echo "run-tests: all passed"
fi
exit $status
