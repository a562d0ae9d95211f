# shellcheck shell=bash
# Sourced by scripts/gpu-ab.sh and scripts/fragmentation-ab.sh: the source of
# an earlier commit (.carry/base, from `scripts/prepare-gpu-carry.sh --base
# COMMIT`) and the working tree, each built once into $work/base and
# $work/new, both configured alike. BASE_SOURCE and NEW_SOURCE name other
# folders (say, a branch's source carried beside main's), so that one carried
# tree serves several comparisons.

# shellcheck source=scripts/carried-flags.sh
source "$root/scripts/carried-flags.sh"

base_source=${BASE_SOURCE:-$root/.carry/base}
new_source=${NEW_SOURCE:-$root}
work=${AB_WORK:-/tmp/cuemm-ab}
[ -f "$base_source/CMakeLists.txt" ] ||
  { echo "$(basename "$0"): no source in $base_source (scripts/prepare-gpu-carry.sh --base COMMIT)" >&2; exit 1; }
[ -f "$new_source/CMakeLists.txt" ] || { echo "$(basename "$0"): no source in $new_source" >&2; exit 1; }
mkdir -p "$work"

# Builds one target of the base and of the working tree, side by side.
build_both() {  # target
  local target=$1
  build_one() {  # source folder, build folder
    local args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUEMM_BUILD_TESTS=OFF -DCUEMM_BUILD_EXAMPLES=OFF
                -DCUEMM_BUILD_PYTHON=OFF)
    add_carried_flags args
    if ! { CMAKE_POLICY_VERSION_MINIMUM=3.5 cmake -S "$1" -B "$2" "${args[@]}" >"$2.log" 2>&1 &&
           cmake --build "$2" --target "$target" >>"$2.log" 2>&1; }; then
      tail -20 "$2.log"
      return 1
    fi
  }
  build_one "$base_source" "$work/base" & local base_build=$!
  build_one "$new_source" "$work/new" & local new_build=$!
  wait $base_build && wait $new_build
}
