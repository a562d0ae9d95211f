#!/usr/bin/env bash
# The C++ suite under the sanitizers, on the simulated driver: AddressSanitizer
# with UndefinedBehaviorSanitizer, then ThreadSanitizer, each in a build of its
# own (BUILD_ROOT, default /tmp/cuemm-sanitizers). On two cores ASan's tests
# took about 46 minutes, and ThreadSanitizer's take some hours (each
# conformance suite up to an hour); not part of CI, which keeps to the plain
# build. Ends with one line per sanitizer.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_root=${BUILD_ROOT:-/tmp/cuemm-sanitizers}
mkdir -p "$build_root"
"$root/scripts/setup.sh"
summary=()
status=0
for sanitizers in address,undefined thread; do
  build="$build_root/${sanitizers//,/-}"
  echo "== $sanitizers: build in $build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUEMM_SANITIZE="$sanitizers" \
    -DCUEMM_BUILD_PYTHON=OFF >"$build.configure.txt" 2>&1 || { tail -20 "$build.configure.txt"; exit 1; }
  cmake --build "$build" >"$build.build.txt" 2>&1 || { tail -30 "$build.build.txt"; exit 1; }
  echo "== $sanitizers: ctest"
  # halt_on_error: a report fails its test, so ctest's count says it. Each
  # test's time limit is tests/CMakeLists.txt's CUEMM_TEST_TIMEOUT.
  if (cd "$build" && ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure \
        >"$build.ctest.txt" 2>&1); then
    summary+=("$sanitizers: $(grep -E 'tests passed' "$build.ctest.txt")")
  else
    tail -60 "$build.ctest.txt"
    summary+=("$sanitizers: FAILED ($(grep -E 'tests passed' "$build.ctest.txt" || echo 'see') $build.ctest.txt)")
    status=1
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
