#!/usr/bin/env bash
# Installs with apt-get what building cuemm needs and this machine lacks:
#   setup.sh main    the library and the examples (the main job)
#   setup.sh         every test too: clang (a second compiler), GoogleTest, Google Benchmark, the
#                    Python package's and classic Numba's tests
# Each need is looked for as what it is (a command, a header, a Python
# module), not as a Debian package, so a machine that has the tools from
# elsewhere (the GPU machine: cmake and ninja in a venv, and no package
# archive to reach) needs nothing installed. Cheap to run again.
set -euo pipefail
purpose=${1:-tests}
case $purpose in
  main | tests) ;;
  *) echo "setup: '$purpose' is not a purpose (main or tests)" >&2; exit 2 ;;
esac

has_header() { [ -e "/usr/include/$1" ] || [ -e "/usr/local/include/$1" ]; }
# Classic Numba and the tests' modules come from Debian's python3 (run-tests.sh uses /usr/bin/python3).
has_module() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import $1" 2>/dev/null; }
has_python_headers() {  # those of that python3's own version
  [ -x /usr/bin/python3 ] && /usr/bin/python3 -c \
    "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"
}

# need: the package that provides it, and the check that it is here.
needs=(
  "cmake|command -v cmake"
  "ninja-build|command -v ninja"
  "g++|command -v g++"
)
if [ "$purpose" = tests ]; then
  needs+=(
    "clang|command -v clang++"
    "libgtest-dev|has_header gtest/gtest.h"
    "libbenchmark-dev|has_header benchmark/benchmark.h"
    "python3|[ -x /usr/bin/python3 ]"
    "python3-dev|has_python_headers"
    "pybind11-dev|has_header pybind11/pybind11.h"
    "python3-numpy|has_module numpy"
    "python3-numba|has_module numba"
    "python3-pytest|has_module pytest"
  )
fi

missing=()
for need in "${needs[@]}"; do
  eval "${need#*|}" >/dev/null 2>&1 || missing+=("${need%%|*}")
done
((${#missing[@]})) || exit 0

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
  what="the main job"
  [ "$purpose" = tests ] && what="the tests"
  echo "setup: apt-get could not install ${missing[*]}, needed by $what." >&2
  if [ "$purpose" = tests ]; then
    echo "setup: on a machine without a package archive (the GPU machine), scripts/gpu-check.sh runs the tests" \
      "with what scripts/prepare-gpu-carry.sh brings." >&2
  fi
  exit 1
fi
