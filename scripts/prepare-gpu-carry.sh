#!/usr/bin/env bash
# Fills .carry/ with what scripts/gpu-check.sh needs on the GPU machine, where
# nothing can be installed: GoogleTest's sources and Google Benchmark (headers
# and shared library), taken from this machine's Debian packages (which
# scripts/setup.sh installs). Then carry `.carry` along with the working tree
# (the device tool's `carry`); .gitignore keeps it out of git.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
carry=$root/.carry
library=$(dirname "$(ls /usr/lib/*/libbenchmark.so 2>/dev/null | head -1)")
for needed in /usr/src/googletest /usr/include/benchmark "$library/libbenchmark.so"; do
  [ -e "$needed" ] || { echo "prepare-gpu-carry: $needed is missing (run scripts/setup.sh)" >&2; exit 1; }
done
rm -rf "$carry/googletest" "$carry/benchmark"
mkdir -p "$carry/benchmark/include" "$carry/benchmark/lib"
cp -r /usr/src/googletest "$carry/googletest"
cp -r /usr/include/benchmark "$carry/benchmark/include/"
cp -P "$library"/libbenchmark.so* "$carry/benchmark/lib/"
echo "prepare-gpu-carry: $(du -sh "$carry/googletest" | cut -f1) of GoogleTest, $(du -shL "$carry/benchmark" | cut -f1) of Google Benchmark in $carry"
