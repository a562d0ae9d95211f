#!/usr/bin/env bash
# The tests run without the caller's manager settings (tests/CMakeLists.txt's
# cuemm_manager_settings, tests/python/conftest.py's MANAGER_SETTINGS): every
# environment variable the library reads, but the driver's, must be among
# them, or a shell's setting of a new one would change what the tests check.
# And every variable the library or the simulated driver reads must be in
# src/memory/settings.cpp's table, or cuemm would call it misspelt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
table="$root/src/memory/settings.cpp"
read_anywhere=$(grep -rhoE '"CUEMM_[A-Z0-9_]+"' --exclude=settings.cpp "$root/src" "$root/include" "$root/sim" \
  "$root/python/src" "$root/python/cuemm" | tr -d '"' | sort -u)
read_by_library=$(grep -vxE 'CUEMM_DRIVER|CUEMM_SIM_[A-Z0-9_]*' <<<"$read_anywhere")
listed=$(sed -n '/^set(cuemm_manager_settings/,/)/p' "$root/tests/CMakeLists.txt" | grep -oE 'CUEMM_[A-Z0-9_]+' | sort -u)
prefixes=$(sed -n '/^MANAGER_SETTINGS = /,/)/p' "$root/tests/python/conftest.py" | grep -oE '"[A-Z_]+"' | tr -d '"')
status=0
for variable in $read_by_library; do
  grep -qxF "$variable" <<<"$listed" ||
    { echo "tests/CMakeLists.txt: $variable is not in cuemm_manager_settings"; status=1; }
  matched=0
  for prefix in $prefixes; do [[ $variable == "$prefix"* ]] && matched=1; done
  ((matched)) || { echo "tests/python/conftest.py: $variable matches no MANAGER_SETTINGS prefix"; status=1; }
done
for variable in $read_anywhere; do
  grep -qF "Setting{\"$variable\"" "$table" || { echo "src/memory/settings.cpp: $variable is not in the table"; status=1; }
done
exit $status
