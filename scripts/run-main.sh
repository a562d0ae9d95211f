#!/usr/bin/env bash
# The main job: set up, build, and run the seed's example (zeros to the device
# and back, and what the memory manager did) on the real driver when a GPU is
# usable, otherwise on the simulated one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
"${BUILD_DIR:-$root/build}/bin/zeros_to_device"
