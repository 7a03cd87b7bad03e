#!/bin/bash
# The CPU transpose's builds (portable, AVX2, AVX-512) each compile the tiling
# code of cpu_transpose_tiles.h with their own instruction set. None may export
# a weak (shared, linker-chosen) symbol of the project's: the linker would keep
# one copy for all three builds, perhaps the one built for AVX-512.
#   cpu_transpose_symbols_test.sh LIBRARY
set -euo pipefail
library=${1:?usage: cpu_transpose_symbols_test.sh LIBRARY}
# Names in namespace transpose itself (mangled _ZN9transpose..., _ZNK9transpose...), not other
# libraries' templates that merely take its types.
shared=$(nm -A --defined-only "$library" | awk '$2 ~ /^[WVu]$/ && $3 ~ /^_ZN[KVRO]*9transpose/' |
  c++filt || true)
if [[ -n "$shared" ]]; then
  echo "FAIL: weak symbols of the project's in $library:"
  echo "$shared" | cut -c1-300
  exit 1
fi
members=$(nm -A --defined-only "$library" | cut -d: -f2 | sort -u | wc -l)
[[ $members -ge 3 ]] || { echo "FAIL: $library has $members members with symbols"; exit 1; }
echo "PASS: no weak symbols of the project's in $members members of $library"
