#!/usr/bin/env bash
# Regenerates sim/error_names.inc from a CUDA toolkit's cuda.h (only needed when
# NVIDIA adds CUresult values; the build itself needs no toolkit).
set -euo pipefail
header=${1:-/usr/local/cuda/include/cuda.h}
out=$(dirname "$0")/../src/driver/error_names.inc
{
  echo "// Generated from the CUresult values in the CUDA 13.0 driver documentation (scripts/gen_error_names.sh)."
  echo "// {code, name}"
  grep -E "^\s+CUDA_(SUCCESS|ERROR_[A-Z_0-9]+)\s*=\s*[0-9]+" "$header" |
    sed -E 's/^\s+(CUDA_[A-Z_0-9]+)\s*=\s*([0-9]+).*/{\2, "\1"},/'
} >"$out"
