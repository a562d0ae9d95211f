#!/usr/bin/env bash
# Installs what building and testing cuemm needs on a fresh Debian machine.
# Installs only what is missing, so it is cheap to run again.
set -euo pipefail
packages=(cmake ninja-build g++ libgtest-dev libbenchmark-dev python3 python3-dev python3-numpy python3-numba
  python3-pytest pybind11-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
