#!/usr/bin/env bash
# Every variable the library or the simulated driver reads must be in
# src/memory/settings.cpp's table: cuemm would call it misspelt otherwise,
# and ctest leaves the table's manager settings out of every test's
# environment (tests/CMakeLists.txt reads the table). pytest leaves out those
# matching tests/python/conftest.py's MANAGER_SETTINGS prefixes: each one
# but the driver's must match one, or a shell's setting of a new one would
# change what the tests check.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
table="$root/src/memory/settings.cpp"
read_anywhere=$(grep -rhoE '"CUEMM_[A-Z0-9_]+"' --exclude=settings.cpp "$root/src" "$root/include" "$root/sim" \
  "$root/python/src" "$root/python/cuemm" | tr -d '"' | sort -u)
read_by_library=$(grep -vxE 'CUEMM_DRIVER|CUEMM_SIM_[A-Z0-9_]*' <<<"$read_anywhere")
prefixes=$(sed -n '/^MANAGER_SETTINGS = /,/)/p' "$root/tests/python/conftest.py" | grep -oE '"[A-Z_]+"' | tr -d '"')
status=0
for variable in $read_anywhere; do
  grep -qF "Setting{\"$variable\"" "$table" || { echo "src/memory/settings.cpp: $variable is not in the table"; status=1; }
done
for variable in $read_by_library; do
  matched=0
  for prefix in $prefixes; do [[ $variable == "$prefix"* ]] && matched=1; done
  ((matched)) || { echo "tests/python/conftest.py: $variable matches no MANAGER_SETTINGS prefix"; status=1; }
done
exit $status
