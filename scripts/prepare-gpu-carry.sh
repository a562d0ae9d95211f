#!/usr/bin/env bash
# Fills .carry/ with what scripts/gpu-check.sh needs on the GPU machine, where
# nothing can be installed: GoogleTest's sources and Google Benchmark (headers
# and shared library), taken from this machine's Debian packages (which
# scripts/setup.sh installs). Then carry `.carry` along with the working tree
# (the device tool's `carry`); .gitignore keeps it out of git.
# With `--base COMMIT`, also puts that commit's source in .carry/base, for
# scripts/gpu-ab.sh to compare the working tree with; `--tree NAME COMMIT`
# puts one in .carry/NAME (for BASE_SOURCE or NEW_SOURCE). Both may repeat.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
carry=$root/.carry
put_source() {  # folder name, commit
  [ -n "$2" ] || { echo "prepare-gpu-carry: $1 needs a commit" >&2; exit 1; }
  rm -rf "${carry:?}/$1"
  mkdir -p "$carry/$1"
  git -C "$root" archive "$2" | tar -x -C "$carry/$1"
  echo "prepare-gpu-carry: the source of $(git -C "$root" rev-parse --short "$2") in $carry/$1"
}
while [ $# -gt 0 ]; do
  case $1 in
    --base) put_source base "${2:-}"; shift 2 ;;
    --tree) [ -n "${2:-}" ] || { echo "prepare-gpu-carry: --tree needs a name" >&2; exit 1; }
            put_source "$2" "${3:-}"; shift 3 ;;
    *) echo "prepare-gpu-carry: unknown argument $1 (--base COMMIT, --tree NAME COMMIT)" >&2; exit 1 ;;
  esac
done
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
