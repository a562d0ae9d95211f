#!/usr/bin/env bash
# The main job: set up, build, and run the seed's example (zeros to the device
# and back, and what the memory manager did) on the real driver when a GPU is
# usable, otherwise on the simulated one. It builds the library, the tool and
# the examples only, so it needs a compiler, cmake and ninja, nothing more; in
# a folder of its own (build-main), so that the tests' build keeps its parts.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-main}
"$root/scripts/setup.sh" main
BUILD_DIR=$build "$root/scripts/build.sh" -DCUEMM_BUILD_TESTS=OFF -DCUEMM_BUILD_BENCHMARKS=OFF -DCUEMM_BUILD_PYTHON=OFF \
  -DCUEMM_BUILD_EXAMPLES=ON
"$build/bin/zeros_to_device"
