# shellcheck shell=bash
# Sourced by the scripts that build on the GPU machine, where nothing can be
# installed (gpu-check.sh, gpu-quick-check.sh, ab-common.sh, build.sh): the
# CMake flags for what scripts/prepare-gpu-carry.sh put in .carry, and for
# pip's pybind11. One place, so the scripts cannot drift apart.

carried_flags_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Appends to the array named $1 a flag for each of .carry's GoogleTest
# sources and Google Benchmark that is there. (A flag for a part the build
# leaves out is harmless: CMake only notes it as unused.)
add_carried_flags() {  # array name
  local -n carried_into=$1
  local carry=$carried_flags_root/.carry
  [ -d "$carry/googletest" ] && carried_into+=(-DCUEMM_GTEST_SOURCE_DIR="$carry/googletest")
  [ -d "$carry/benchmark" ] && carried_into+=(-DCUEMM_BENCHMARK_ROOT="$carry/benchmark")
  return 0
}

# Appends to the array named $1 the interpreter that builds the Python module
# and, where pip installed pybind11 for it (the GPU machine), that pybind11;
# elsewhere CMake finds the system's. Returns 1 when there is none from pip.
add_python_flags() {  # array name, python
  local -n python_into=$1
  local dir
  python_into+=(-DPython_EXECUTABLE="$2")
  dir=$("$2" -m pybind11 --cmakedir 2>/dev/null) || return 1
  [ -n "$dir" ] || return 1
  python_into+=(-Dpybind11_DIR="$dir")
}
