#!/usr/bin/env bash
# Everything that must be checked on a real GPU, in one command (the GPU machine
# of ../shared/GPU-NOTES.md: nothing can be installed there, so GoogleTest comes
# from sources carried along in .carry/googletest; see README).
#
#   1. build cuemm there
#   2. the whole C++ suite on the real driver (CUEMM_DRIVER=cuda)
#   3. the seed's example on the real driver
#   4. the Python package: pytest, pip install of the package, numba-cuda's own suite with and
#      without the cuemm plugin (tests/numba/compare_numba_cuda_suite.py; on a machine of several
#      GPUs also its multi-GPU tests under each device manager), Numba allocation speed, and
#      CuPy's and PyTorch's pools beside cuemm's from Python (bench/bench_python_pools.py)
#   5. the allocation benchmarks (Google Benchmark from .carry/benchmark: Debian's libbenchmark.so and headers)
# All of it takes the device's 10 minutes a command and more (the run of 103bf6d reached the
# benchmarks with 55 s left), so a full check is two commands, each building afresh:
# CUEMM_GPU_TESTS_ONLY=1 stops after the tests and the fragmentation runs, which time nothing (also
# for machines whose timings are not reported); CUEMM_GPU_TIMINGS_ONLY=1 builds no tests and runs
# only what times: Numba's allocation speed, the Python pools, the benchmarks and `cuemm bench` (its RESULTS.md takes
# the first's fragmentation with bench/make_results.py --splice-fragmentation).
# CUEMM_GPU_FRAGMENTATION_ONLY=1 builds and runs only the fragmentation part (see there) and `cuemm bench`.
# CUEMM_GPU_CONFORMANCE_OPTIONS=1 adds the conformance suite under the pools' other options to
# ctest (about 40 s a setting); =only runs only those (with CUEMM_GPU_TESTS_ONLY=1 and the skips below).
# CUEMM_GPU_SKIP_CTEST=1 builds no C++ tests and leaves out ctest: with CUEMM_GPU_TESTS_ONLY=1, the second
# half of a tests check whose first half (CUEMM_GPU_SKIP_PYTHON=1) ran on its own, as a cold machine's
# build left the whole no time for its last numba-cuda runs (560 s at 94536fe).
# CUEMM_GPU_SKIP_PYTHON=1 leaves out the Python package's checks, and CUEMM_GPU_SKIP_FRAGMENTATION=1
# the fragmentation runs: with CUEMM_GPU_TESTS_ONLY=1, both make a check of the C++ suite alone
# (on four H200s build and ctest took 290 s, and the fragmentation runs, alone after them, more
# than the 210 s left).
# Prints a short summary last. Logs go to $OUT when it is set. CUEMM_COMMIT names the
# commit measured where the machine's copy has no up-to-date git history.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/ctest-summary.sh
source "$root/scripts/ctest-summary.sh"
# shellcheck source=scripts/carried-flags.sh
source "$root/scripts/carried-flags.sh"
# shellcheck source=scripts/check-outcomes.sh
source "$root/scripts/check-outcomes.sh"
build=${BUILD_DIR:-/tmp/cuemm-gpu-build}
logs=${OUT:-/tmp/cuemm-gpu-logs}
mkdir -p "$logs"
rm -f "$logs/replay.txt"  # (a run before, into the same folder, left its own)
summary=()
# Seconds each part took (the whole must stay inside the device's 10 minutes a command).
phases=()
phase_began=$SECONDS
# Each finished part also leaves the summary so far in $logs/progress.txt, so a run cut off
# by the device's limit still tells how far it got and what each part cost.
phase_done() {
  phases+=("$1 $((SECONDS - phase_began))"); phase_began=$SECONDS
  printf '%s\n' "${summary[@]}" "seconds per part so far: ${phases[*]}" >"$logs/progress.txt"
}
# The optional fragmentation runs at the end stop early rather than let the device cut off the summary.
deadline=${CUEMM_GPU_DEADLINE_S:-560}
time_left() { echo $((deadline - SECONDS)); }
# Prints the summary and exits with the status of every check: ctest, the example, and those of
# check_failed (scripts/check-outcomes.sh).
finish() {
  summary+=("seconds per part: ${phases[*]} (total $SECONDS)")
  echo
  echo "SUMMARY"
  printf '  %s\n' "${summary[@]}"
  exit $((ctest_status || example_status || checks_status))
}
# Why a step was left out for the deadline: the words after its label in the summary, and in the
# "== LABEL:" line that not_run prints (RESULTS.md lists those).
left_out() { echo "not run, $(time_left) s left before the deadline of $deadline s"; }
not_run() { echo "== $1: $(left_out)"; }
# The tool's own pairs table on the real driver, for the pool and the async manager (a short run:
# it is Google Benchmark's figures that RESULTS.md reports, cuMemAlloc and the default manager's
# among them; the pool's cells warm up until 0.1 s went by without it buying a block). All four
# managers took about 35 s, which the full check's deadline left out of most runs.
cuemm_bench() {
  if [ "$(time_left)" -lt 20 ]; then
    summary+=("cuemm bench (real driver): $(left_out)")
    return
  fi
  CUEMM_DRIVER=cuda "$build/bin/cuemm" bench --managers pool,async --threads 1,16 --seconds 0.02 --repeats 1 --warm-up 0.1 \
    >"$logs/cuemm_bench.txt" 2>&1
  check_failed $? run_status
  summary+=("cuemm bench (real driver): exit $run_status ($(awk '/threads over 1/ {exit} /^(cuMemAlloc|default|pool|async) / {n++} END {print n + 0}' "$logs/cuemm_bench.txt") rows; pool, 16 threads over 1: $(awk '/threads over 1/ {f = 1} f && /^pool/ {$1 = ""; print}' "$logs/cuemm_bench.txt"))")
}
# The seeds' workloads, length_of and the readers of `cuemm random`'s figures (reserved_over_live...).
# shellcheck source=scripts/fragmentation-common.sh
source "$root/scripts/fragmentation-common.sh"

# Fragmentation: peak reserved over peak live on RMM-style random workloads,
# and on a recorded log: the largest of numba-cuda's suite processes.
# The single runs of the table: each workload under each of these (their files are put in order by
# assemble_fragmentation, as some run beside numba-cuda's suites and others after the benchmarks).
fragmentation_workloads=("--max-size 64M --live 4G" "--max-size 64M --live 1G" "--max-size 4M --live 512M"
  "--max-size 1M --live 512M" "--max-size 256K --live 64M" "--max-size 1M --live 512M --threads 4"
  "--max-size 256K --live 64M --threads 8" "--pattern training")
# The pool's variants by number (and the best fit's, a reference without device memory), as labelled.
labels=("pool" "pool (expandable)" "pool (expandable; no thread caches)" "best fit (reference)" "pool (split spares)"
  "pool (stream-ordered)" "pool (expandable; assembled blocks)")
# `cuemm random` with the arguments after the variant, as labels[variant] says.
random_variant() {
  local variant=$1 settings=(CUEMM_POOL_EXPANDABLE=$(($1 == 1 || $1 == 2 || $1 == 6))) manager=pool
  shift
  [ "$variant" = 2 ] && settings+=(CUEMM_POOL_THREAD_CACHE_SIZE=0)
  [ "$variant" = 3 ] && manager=best-fit
  [ "$variant" = 4 ] && settings+=(CUEMM_POOL_SPLIT_SPARES=1)
  [ "$variant" = 6 ] && settings+=(CUEMM_POOL_ASSEMBLE_BLOCKS=1)
  local ordered=()
  [ "$variant" = 5 ] && ordered=(--stream-ordered)
  env "${settings[@]}" CUEMM_DRIVER=cuda "$build/bin/cuemm" random "$@" "${ordered[@]}" --manager $manager
}
# The table's managers: a variant above by number, or a bundled manager by name.
fragmentation_managers=(0 async default 1 3)
fragmentation_parts=/tmp/cuemm-fragmentation
# One run: workload $1 under manager $2 (indexes of the arrays above), into a file of its own.
fragmentation_single() {
  local workload=${fragmentation_workloads[$1]} manager=${fragmentation_managers[$2]} label
  case "$manager" in [0-9]) label=${labels[$manager]} ;; *) label=$manager ;; esac
  {
    # (Each run takes a few seconds; a slow host may leave no time for the last ones.)
    if [ "$(time_left)" -lt 30 ]; then
      not_run "$workload, $label"
      return
    fi
    echo "== $workload, $label"
    # (Word splitting of the workload and its length is wanted: one argument each.)
    case "$manager" in
      [0-9]) random_variant "$manager" $workload $(length_of "$workload") ;;
      *) CUEMM_DRIVER=cuda "$build/bin/cuemm" random $workload $(length_of "$workload") --manager "$manager" ;;
    esac
  } >"$fragmentation_parts/single.$1.$2" 2>&1
}
# Every workload's runs under the managers named by index.
fragmentation_singles() {
  local workload manager
  for workload in "${!fragmentation_workloads[@]}"; do
    for manager in "$@"; do fragmentation_single "$workload" "$manager"; done
  done
}
# The pool and the async manager's driver pool count their own reserved bytes and the best fit
# computes them, so these may run beside other GPU work; the default manager's are read from the
# device's free memory (fragmentation_alone), which another process would change.
fragmentation_runs() {
  rm -rf "$fragmentation_parts" && mkdir -p "$fragmentation_parts"
  {
    if [ -n "${fragmentation_beside:-}" ]; then
      echo "# The pool's, the async manager's and the best fit's runs went beside $fragmentation_beside, which time nothing, on the cores they leave idle (so that a full check has time for them): their ns per operation may read a little higher than alone. The default manager's runs, whose reserved bytes are read from the device's free memory, ran alone after the suites."
    fi
    # (Spliced into another run's RESULTS.md, these say where they came from.)
    for setting in CUEMM_GPU_FRAGMENTATION_ONLY CUEMM_GPU_TESTS_ONLY; do
      [ "${!setting:-0}" = 1 ] &&
        echo "# From a run of its own (\`$setting=1\`) of commit \`${CUEMM_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null)}\`, $(date -u +%F), on $(head -1 "$logs/gpu.txt")."
    done
  } >"$fragmentation_parts/notes"
  fragmentation_singles 0 1 3 4
  fragmentation_seeds >"$fragmentation_parts/seeds" 2>&1
  # Beside nothing, the default manager's runs too.
  [ -z "${fragmentation_beside:-}" ] && fragmentation_alone
}
fragmentation_alone() { fragmentation_singles 2; }
# The parts in the table's order: notes, each workload's runs by manager, the seeds.
assemble_fragmentation() {
  local workload manager
  cat "$fragmentation_parts/notes"
  for workload in "${!fragmentation_workloads[@]}"; do
    for manager in "${!fragmentation_managers[@]}"; do
      [ -f "$fragmentation_parts/single.$workload.$manager" ] && cat "$fragmentation_parts/single.$workload.$manager"
    done
  done
  cat "$fragmentation_parts/seeds"
}
fragmentation_seeds() {
  # Other traces of the same workloads, and of smaller live sets: seeds 1-8,
  # side by side (each its own process and pool; only the ratios are kept).
  for workload in "${seed_workloads[@]}"; do
    if [ "$(time_left)" -lt 40 ]; then
      not_run "seeds 1-8 $workload"
      continue
    fi
    # Both pools' eight seeds at once (16 processes for the 16 cores); then, for the
    # 512 MiB workloads and the queues, the expandable pool without thread caches (the
    # setting for a program short of memory: README); the best-fit reference's take a moment.
    batches=("0 1")
    case "$workload" in *"--live 512M" | *queue*) batches+=("2") ;; *per-layer) batches+=("4") ;; esac
    # Blocks assembled from pages' free ends near the peak, where sizes reach 4 MiB (Note [Assembled blocks]),
    # and where layers keep sizes of their own (beside Note [Own segments in the arena]).
    case "$workload" in *"4M --live 512M" | *"4M --live 128M" | *per-layer) batches+=("6") ;; esac
    # Through allocate(size, stream), as RMM and PyTorch call the pool.
    case "$workload" in *"4M --live 512M" | *"64M --live 256M" | *inference) batches+=("5") ;; esac
    batches+=("3")
    for batch in "${batches[@]}"; do
      for variant in $batch; do
        for seed in 1 2 3 4 5 6 7 8; do
          random_variant $variant $workload $(length_of "$workload") --seed $seed >"$logs/seed.$variant.$seed" 2>&1 &
        done
      done
      wait
    done
    for variant in ${batches[*]}; do
      ratios=""
      for seed in 1 2 3 4 5 6 7 8; do
        ratios="$ratios $(reserved_over_live_or_failed <"$logs/seed.$variant.$seed")"
      done
      echo "== seeds 1-8 $workload, ${labels[$variant]}:$ratios"
    done
    rm -f "$logs"/seed.*
  done
  # Threads side by side: seeds 1-3, one process at a time (each uses the cores). The best fit's
  # figure is the one the pool's run prints, of its operations in the order they ran there (with
  # `--manager best-fit` alone the threads take turns, whose live bytes differ).
  for workload in "--max-size 1M --live 512M --threads 4" "--max-size 256K --live 64M --threads 8" \
      "--max-size 64M --live 1G --threads 8"; do
    for variant in 0 1; do
      if [ "$(time_left)" -lt 30 ]; then
        not_run "seeds 1-3 $workload, ${labels[$variant]}"
        continue
      fi
      ratios="" references=""
      for seed in 1 2 3; do
        random_variant $variant $workload --operations 20000 --seed $seed >"$logs/threads.$seed" 2>&1
        ratios="$ratios $(reserved_over_live_or_failed <"$logs/threads.$seed")"
        references="$references $(same_order_reference_or_failed <"$logs/threads.$seed")"
      done
      echo "== seeds 1-3 $workload, ${labels[$variant]}:$ratios"
      [ "$variant" = 0 ] && echo "== seeds 1-3 $workload, best fit (reference, in the pool's order):$references"
    done
    rm -f "$logs"/threads.*
  done
}

# The replay of the largest of numba-cuda's suite processes' logs (recorded by the suite's run under cuemm).
replay_suite_log() {
  suite_log=$(ls -S /tmp/cuemm-suite-logs/*.csv 2>/dev/null | head -1)
  if [ -z "$suite_log" ] && [ "${CUEMM_GPU_FRAGMENTATION_ONLY:-0}" = 1 ]; then
    echo "== replay of numba-cuda's suite log: not run (numba-cuda's suite, which records it, is not run here)"
  elif [ -n "$suite_log" ] && [ "$(time_left)" -lt 20 ]; then
    not_run "replay of numba-cuda's suite log"
  elif [ -n "$suite_log" ]; then
    for manager in pool async default; do
      echo "== replay of numba-cuda's suite log ($(($(wc -l <"$suite_log") - 1)) rows), $manager"
      CUEMM_DRIVER=cuda "$build/bin/cuemm" replay "$suite_log" --manager $manager
    done
    echo "== replay of numba-cuda's suite log ($(($(wc -l <"$suite_log") - 1)) rows), pool (expandable)"
    CUEMM_POOL_EXPANDABLE=1 CUEMM_DRIVER=cuda "$build/bin/cuemm" replay "$suite_log" --manager pool
    echo "== replay of numba-cuda's suite log ($(($(wc -l <"$suite_log") - 1)) rows), best fit (reference)"
    CUEMM_DRIVER=cuda "$build/bin/cuemm" replay "$suite_log" --manager best-fit
  fi
}

# The pool's placement with its seals paced (scripts/fragmentation-seeds.sh, PACE=500: every run the
# same), on the real driver and on the simulated one: where the two read alike, seed by seed and
# seal by seal, the simulated figures of CI and docs/pool-measurements.md stand for the GPU's
# (alike on the H100 at d7e1297). A difference is reported, not failed: it says the simulated
# driver's seals or pages no longer model the GPU's, not that a block went wrong.
paced_seeds_against_simulation() {
  if [ "$(time_left)" -lt 60 ]; then
    summary+=("paced seeds, the real driver against the simulated one: $(left_out)")
    return
  fi
  local driver statuses=() real=$logs/paced-seeds-cuda.txt simulated=$logs/paced-seeds-sim.txt
  for driver in cuda sim; do
    PER_SEED=1 PACE=500 CUEMM_TOOL="$build/bin/cuemm" CUEMM_DRIVER=$driver bash "$root/scripts/fragmentation-seeds.sh" \
      >"$logs/paced-seeds-$driver.txt" 2>&1
    statuses+=($?)
  done
  local line="paced seeds (PACE=500), the real driver against the simulated one (exit ${statuses[0]} / ${statuses[1]}):"
  if cmp -s "$real" "$simulated"; then
    summary+=("$line the same in all $(grep -c '^    seed ' "$real") runs, footprints and seals")
  else
    summary+=("$line $(diff "$real" "$simulated" | grep -c '^<') line(s) differ (paced-seeds-cuda.txt, paced-seeds-sim.txt)")
  fi
  check_failed $((statuses[0] | statuses[1]))
}

# The summary lines of the fragmentation runs.
fragmentation_summary() {
  local label ratios
  for label in pool "pool (expandable)" "best fit (reference)"; do
    ratios=$(grep -A2 ", $label\$" "$logs/bench_fragmentation.txt" | reserved_over_live | tr '\n' ' ')
    # (The deadline may have left every run out: the file's "not run" lines say which.)
    summary+=("fragmentation ($label, reserved/live): ${ratios:-none run (bench_fragmentation.txt)}")
  done
  summary+=("$(awk -F': ' '/^== seeds.*: [0-9. a-z]+$/ {n = split($2, v, " "); k = 0; f = 0; s = 0; m = 0
    for (i = 1; i <= n; i++) { if (v[i] == "failed") { f++; continue } k++; s += v[i]; if (v[i] > m) m = v[i] }
    sub(/^== seeds [0-9]+-[0-9]+ (--max-size )?/, "", $1); sub(/ --live /, "/", $1); sub(/ --threads /, " x", $1)
    if (k > 0) printf "%s mean %.3f max %.3f", $1, s / k, m; else printf "%s", $1
    if (f > 0) printf " (%d FAILED)", f; if (k > 0 || f > 0) printf "; "}' "$logs/bench_fragmentation.txt")")
  # A run that printed no reserved/live, or a seed that printed none, crashed or erred (`cuemm`
  # exits 0 where allocations fail, and counts them): named, and the check fails.
  local broken
  broken=$(fragmentation_failures <"$logs/bench_fragmentation.txt")
  if [ -n "$broken" ]; then
    summary+=("fragmentation runs that FAILED: $(echo "$broken" | wc -l) (bench_fragmentation.txt; the first: $(echo "$broken" | head -3 | awk 'NR > 1 {printf "; "} {printf "%s", $0}'))")
    checks_status=1
  fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$logs/gpu.txt" 2>&1
summary+=("gpu: $(head -1 "$logs/gpu.txt")")

gtest_args=()
add_carried_flags gtest_args
python=$(command -v python3)
add_python_flags gtest_args "$python"
# PyTorch's caching allocator as a benchmark anchor, where torch is installed.
torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
torch_abi=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || true)
[ -n "$torch_dir" ] && gtest_args+=(-DCUEMM_TORCH_DIR="$torch_dir" -DCUEMM_TORCH_CXX11_ABI="$torch_abi")
# Which parts run (the header says what each setting leaves out).
tests_part=1 timings_part=1 fragmentation_part=1
[ "${CUEMM_GPU_TESTS_ONLY:-0}" = 1 ] && timings_part=0
[ "${CUEMM_GPU_TIMINGS_ONLY:-0}" = 1 ] && tests_part=0 fragmentation_part=0
[ "${CUEMM_GPU_FRAGMENTATION_ONLY:-0}" = 1 ] && tests_part=0 timings_part=0
[ "${CUEMM_GPU_SKIP_FRAGMENTATION:-0}" = 1 ] && fragmentation_part=0
# (Without the tests, the build is about a minute shorter. Both ways are said
# outright: a machine still warm from a run without them keeps its build folder,
# whose cache would otherwise leave them out of this one.)
skip_ctest=${CUEMM_GPU_SKIP_CTEST:-0}
if [ $tests_part = 0 ]; then
  gtest_args+=(-DCUEMM_BUILD_TESTS=OFF -DCUEMM_BUILD_EXAMPLES=OFF)
elif [ "$skip_ctest" = 1 ]; then
  gtest_args+=(-DCUEMM_BUILD_TESTS=OFF -DCUEMM_BUILD_EXAMPLES=ON)
else
  gtest_args+=(-DCUEMM_BUILD_TESTS=ON -DCUEMM_BUILD_EXAMPLES=ON)
fi
if CMAKE_POLICY_VERSION_MINIMUM=3.5 BUILD_DIR=$build "$root/scripts/build.sh" -DCUEMM_TEST_DRIVER=cuda \
    "${gtest_args[@]}" >"$logs/build.log" 2>&1; then
  summary+=("build: ok")
else
  tail -30 "$logs/build.log"
  echo "SUMMARY: build failed"
  exit 1
fi

ctest_status=0 example_status=0
python_checks=0
[ -d "$build/python/cuemm" ] && [ "${CUEMM_GPU_SKIP_PYTHON:-0}" != 1 ] && python_checks=1
# CUEMM_GPU_FRAGMENTATION_ONLY=1: the build, then only the fragmentation runs below (their own run, where
# a full check ran out of time before them; bench/make_results.py --splice-fragmentation puts them in RESULTS.md).
if [ $tests_part = 1 ]; then
  # The package's own build from source (pip, scikit-build-core) runs on the CPUs while ctest
  # runs: no test times anything, and it saves the half minute of that build.
  if [ $python_checks = 1 ]; then
    (cd "$root" && CMAKE_POLICY_VERSION_MINIMUM=3.5 "$python" -m pip install --no-build-isolation --no-deps \
        --target /tmp/cuemm-pip . >"$logs/pip.log" 2>&1 &&
      cd /tmp && PYTHONPATH=/tmp/cuemm-pip "$python" -c "import cuemm, cuemm._core as c; print(c.driver_kind(), cuemm.bundled_managers())") \
      >>"$logs/pip.log" 2>&1 &
    pip_pid=$!
  fi

  # The conformance suite under the pools' other options (tests/CMakeLists.txt) takes about 40 s a
  # setting here: left out unless CUEMM_GPU_CONFORMANCE_OPTIONS is 1 (with the rest) or "only".
  options_tests="^test_manager_conformance_options_"
  case "${CUEMM_GPU_CONFORMANCE_OPTIONS:-0}" in
    1) ctest_selection=() ;;
    only) ctest_selection=(-R "$options_tests") ;;
    *) ctest_selection=(-E "$options_tests") ;;
  esac
  if [ "$skip_ctest" = 1 ]; then
    summary+=("ctest: left out (CUEMM_GPU_SKIP_CTEST=1)")
    phase_done build
  else
    (cd "$build" && CUEMM_DRIVER=cuda ctest --output-on-failure --timeout 300 -V "${ctest_selection[@]}") \
      >"$logs/ctest.log" 2>&1
    ctest_status=$?
    # (ctest exits 0 when it finds no test at all.)
    grep -q "No tests were found" "$logs/ctest.log" && { echo "ctest found no tests in $build"; ctest_status=1; }
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests passed|^[0-9]+: \[  SKIPPED" "$logs/ctest.log" | tail -40
    summary+=("ctest (real driver): $(grep -E 'tests passed' "$logs/ctest.log" | tail -1)")
    summary+=("gtest cases: $(gtest_case_counts "$logs/ctest.log")")
    phase_done build+ctest
  fi

  # The fragmentation runs (below) measure memory, not time: the pool's, the async manager's and
  # the best fit's go beside the example, pytest and numba-cuda's suites, which time nothing and
  # assert nothing about the device's free memory (ctest's tests do), rather than after the
  # benchmarks, where slow hosts left them no time inside the device's 10 minutes (the default
  # manager's runs, which read the device's free memory, come right after the suites).
  if [ $python_checks = 1 ] && [ $fragmentation_part = 1 ]; then
    fragmentation_beside="the example, pytest and numba-cuda's test suites"
    fragmentation_runs >"$logs/fragmentation-runs.log" 2>&1 &
    fragmentation_pid=$!
  fi

  CUEMM_DRIVER=cuda "$build/bin/zeros_to_device" >"$logs/example.log" 2>&1
  example_status=$?
  cat "$logs/example.log"
  summary+=("example (real driver): exit $example_status")

  if [ $python_checks = 1 ]; then
    (cd /tmp && PYTHONPATH="$build/python" CUEMM_DRIVER=cuda "$python" -m pytest -q -p no:cacheprovider "$root/tests/python") \
      >"$logs/pytest.log" 2>&1
    check_failed $?
    summary+=("pytest (real driver): $(tail -1 "$logs/pytest.log")")
    wait "$pip_pid"
    check_failed $? pip_status
    summary+=("pip install . (scikit-build-core): exit $pip_status ($(tail -1 "$logs/pip.log"))")
    phase_done example+pytest+pip
    # Under cuemm every process of the suite logs its allocations (for the replay below).
    suite_logs=/tmp/cuemm-suite-logs
    rm -rf "$suite_logs" && mkdir -p "$suite_logs"
    # The default manager's outcomes are kept for the runs after it of some of the same modules
    # (its half of each of them took 30-40 s).
    baseline=/tmp/cuemm-suite-baseline.json
    rm -f "$baseline"
    compare_suite "numba-cuda suite" numba-cuda-suite.log CUEMM_LOG_FILE="$suite_logs/cuemm-%p.csv" \
      CUEMM_COMPARE_SAVE_BASELINE="$baseline" --
    grep -E "^(default|cuemm|difference|raw-handle|  worse|  skipped|  fails)" "$logs/numba-cuda-suite.log"
    # Its IPC tests again with the expandable pool, whose arena blocks have cuemm's own handles.
    compare_suite "numba-cuda test_ipc, expandable pool" numba-cuda-ipc-expandable.log CUEMM_POOL_EXPANDABLE=1 \
      CUEMM_COMPARE_BASELINE="$baseline" -- numba.cuda.tests.cudapy.test_ipc
    # Its driver tests (contexts, resets, deallocations) and IPC tests under the async manager, its pool exportable.
    compare_suite "numba-cuda cudadrv and test_ipc, async (exportable)" numba-cuda-async.log \
      CUEMM_MEMORY_MANAGER=async CUEMM_ASYNC_EXPORTABLE=1 CUEMM_COMPARE_BASELINE="$baseline" -- \
      numba.cuda.tests.cudadrv numba.cuda.tests.cudapy.test_ipc
    # Its driver and IPC tests under the pool wrapped in every adaptor at once (IPC handles,
    # memory info and resets pass through each; the cap is one the tests stay under).
    compare_suite "numba-cuda cudadrv and test_ipc, pool under statistics,log,tracking,limit" numba-cuda-adaptors.log \
      CUEMM_ADAPTORS=statistics,log,tracking,limit CUEMM_LIMIT=64G CUEMM_LOG_FILE=/tmp/cuemm-adaptors-suite-%p.csv \
      CUEMM_COMPARE_BASELINE="$baseline" -- numba.cuda.tests.cudadrv numba.cuda.tests.cudapy.test_ipc
    rm -f /tmp/cuemm-adaptors-suite-*.csv
    # Its driver tests under cuemm's default manager, Numba's own behaviour rebuilt (20 s: the
    # default's outcomes are the first run's).
    compare_suite "numba-cuda cudadrv, cuemm's default manager" numba-cuda-default.log \
      CUEMM_MEMORY_MANAGER=default CUEMM_COMPARE_BASELINE="$baseline" -- numba.cuda.tests.cudadrv
    # With several GPUs, numba-cuda's tests of them (skipped on one) under each device manager
    # (peers use the blocks: Note [Peer access]).
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "$gpus" -ge 2 ]; then
      # (The async manager exports only from a pool created exportable: docs/ipc-offsets.md.)
      for setting in CUEMM_MEMORY_MANAGER=pool CUEMM_POOL_EXPANDABLE=1 CUEMM_MEMORY_MANAGER=async; do
        compare_suite "numba-cuda multi-GPU tests ($gpus GPUs, $setting)" "numba-cuda-multi-gpu-${setting#*=}.log" \
          "$setting" CUEMM_ASYNC_EXPORTABLE=1 -- numba.cuda.tests.cudapy.test_multigpu \
          numba.cuda.tests.cudadrv.test_context_stack numba.cuda.tests.cudapy.test_ipc
      done
    fi
    if [ -n "${fragmentation_pid:-}" ]; then
      wait "$fragmentation_pid"
      phase_done numba-cuda-suites+fragmentation
    else
      phase_done numba-cuda-suites
    fi
    # The replay of the suite's log (seconds), then the default manager's fragmentation runs
    # (about 20 s), while nothing else runs: the default manager's reserved bytes are read from
    # the device's free memory. After the benchmarks, the deadline left them out of most runs.
    if [ $fragmentation_part = 1 ]; then
      replay_suite_log >"$logs/replay.txt" 2>&1
      fragmentation_alone
      phase_done replay+default-fragmentation
    fi
  fi
else
  phase_done build
fi

if [ $timings_part = 1 ]; then
  if [ $python_checks = 1 ]; then
    # Two rounds of separate processes (about 40 s less than three: the run of
    # 66ec2ed took 575 of the device's 600 s), one where the parts before ran slow (the run of
    # 49c7151 had 219 s left here, and the device's limit cut it off after the benchmarks);
    # the interleaved figures are the ones held to bounds.
    numba_rounds=2
    [ "$(time_left)" -lt 240 ] && numba_rounds=1
    # (A timings-only run has the time for three, about 145 s.)
    [ "$(time_left)" -ge 420 ] && numba_rounds=3
    (cd /tmp && "$python" "$root/bench/bench_numba.py" --cuemm "$build/python" --rounds $numba_rounds \
      --out "$logs/bench_numba.json") >"$logs/bench_numba.txt" 2>&1
    check_failed $? run_status
    summary+=("numba benchmark: exit $run_status (bench_numba.txt)")
    # The interleaved figures the issue's bounds are about, so the summary alone tells.
    interleaved() {  # $1: the call; $2: the column
      "$python" "$root/bench/interleaved_ratios.py" "$logs/bench_numba.json" "$1" "$2" 2>&1
    }
    summary+=("numba device_array interleaved, cuemm/floor (256 B, 64 KiB, 4 MiB, 64 MiB): $(interleaved device_array cuemm/floor)")
    summary+=("numba mapped_array interleaved, default/cuemm (4 KiB, 1 MiB, 64 MiB): $(interleaved mapped_array default/cuemm)")
    phase_done numba-benchmark
    # CuPy's and PyTorch's pools from Python beside cuemm's (about a minute).
    if [ "$(time_left)" -ge 150 ]; then
      (cd /tmp && "$python" "$root/bench/bench_python_pools.py" --cuemm "$build/python" --tool "$build/bin/cuemm" \
        --out "$logs/bench_python_pools.json") >"$logs/bench_python_pools.txt" 2>&1
      check_failed $? run_status
      summary+=("python pools: exit $run_status ($(grep -m1 '^summary:' "$logs/bench_python_pools.txt" | cut -c10-))")
      phase_done python-pools
    else
      summary+=("python pools: not run ($(time_left) s left before the deadline)")
    fi
  fi

  anchors=()
  # Three repetitions took 112 s on a slow host; where less is left before the device's limit, two
  # (medians of two; the run of 781317a had 100 s left here, and the limit cut its three).
  repetitions=3
  [ "$(time_left)" -lt 150 ] && repetitions=2
  if [ -x "$build/bin/bench_allocators" ] && [ "$(time_left)" -lt 60 ]; then
    summary+=("benchmarks: $(left_out)")
  elif [ -x "$build/bin/bench_allocators" ]; then
    CUEMM_DRIVER=cuda "$build/bin/bench_allocators" --benchmark_repetitions=$repetitions --benchmark_report_aggregates_only=true \
      --benchmark_min_time=0.1 --benchmark_out="$logs/bench_allocators.json" --benchmark_out_format=json \
      >"$logs/bench_allocators.txt" 2>&1
    check_failed $? run_status
    summary+=("benchmarks: exit $run_status ($(grep -c _median "$logs/bench_allocators.txt") medians in bench_allocators.txt)")
    if [ -x "$build/bin/bench_torch_allocator" ]; then
      "$build/bin/bench_torch_allocator" --benchmark_repetitions=$repetitions --benchmark_report_aggregates_only=true \
        --benchmark_min_time=0.1 --benchmark_out="$logs/bench_torch_allocator.json" --benchmark_out_format=json \
        >"$logs/bench_torch_allocator.txt" 2>&1
      check_failed $? run_status
      summary+=("PyTorch anchor: exit $run_status ($(grep -c _median "$logs/bench_torch_allocator.txt") medians)")
      [ -s "$logs/bench_torch_allocator.json" ] && anchors+=("$logs/bench_torch_allocator.json")
    else
      summary+=("PyTorch anchor: not built (see build.log)")
    fi
  else
    summary+=("benchmarks: not built (no Google Benchmark)")
  fi
  phase_done benchmarks

  cuemm_bench
fi

if [ $fragmentation_part = 1 ]; then
  # The replay of numba-cuda's log and the fragmentation runs where they have not run yet (beside
  # and after numba-cuda's suites, above).
  [ -f "$logs/replay.txt" ] || replay_suite_log >"$logs/replay.txt" 2>&1
  [ -n "${fragmentation_pid:-}" ] || fragmentation_runs >"$logs/fragmentation-runs.log" 2>&1
  { assemble_fragmentation; cat "$logs/replay.txt"; } >"$logs/bench_fragmentation.txt" 2>&1
  fragmentation_summary
  phase_done fragmentation
  paced_seeds_against_simulation
  phase_done paced-seeds
fi
# The run of its own also has the time for the tool's table, which a full check's deadline often cuts.
if [ "${CUEMM_GPU_FRAGMENTATION_ONLY:-0}" = 1 ]; then
  cuemm_bench
  phase_done "cuemm bench"
fi

if [ -f "$logs/bench_allocators.json" ] && [ -f "$logs/bench_numba.json" ]; then
  # (A timings-only run's RESULTS.md has no fragmentation: the tests-only run's is spliced in.)
  results_args=()
  [ -f "$logs/bench_fragmentation.txt" ] && results_args=(--fragmentation "$logs/bench_fragmentation.txt")
  [ -s "$logs/bench_python_pools.json" ] && results_args+=(--python-pools "$logs/bench_python_pools.json")
  (cd "$root" && "$python" bench/make_results.py --allocators "$logs/bench_allocators.json" "${anchors[@]}" \
    --numba "$logs/bench_numba.json" --gpu "$logs/gpu.txt" --out "$logs/RESULTS.md" \
    "${results_args[@]}" --previous bench/RESULTS*.md \
    ${CUEMM_COMMIT:+--commit "$CUEMM_COMMIT"}) >"$logs/results.log" 2>&1
  check_failed $? run_status
  summary+=("bench/RESULTS.md: written to $logs/RESULTS.md (exit $run_status)")
  summary+=("$(grep -m1 '^pairs over 2x slower' "$logs/results.log")")
  summary+=("$(grep -m1 '^fragmentation means over' "$logs/results.log")")
fi

phase_done results
finish
