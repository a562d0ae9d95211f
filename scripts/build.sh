#!/usr/bin/env bash
# Configures and builds cuemm into ${BUILD_DIR:-build}. Extra arguments go to cmake.
# With --python-only first: the library and the Python module alone (no tests,
# benchmarks or examples), for the python3 first on PATH and its pip-installed
# pybind11 (the GPU machine's numba-cuda runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
if [ "${1:-}" = --python-only ]; then
  shift
  # shellcheck source=scripts/carried-flags.sh
  source "$root/scripts/carried-flags.sh"
  flags=(-DCUEMM_BUILD_TESTS=OFF -DCUEMM_BUILD_BENCHMARKS=OFF -DCUEMM_BUILD_EXAMPLES=OFF)
  add_python_flags flags "$(command -v python3)" || true
  set -- "${flags[@]}" "$@"
fi
# Ninja, or the generator a build folder configured before chose (cmake refuses another there).
generator=Ninja
if [ -f "$build/CMakeCache.txt" ]; then
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
fi
cmake -S "$root" -B "$build" -G "${generator:-Ninja}" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build "$build" --parallel "$(nproc)"
