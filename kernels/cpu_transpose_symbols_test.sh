#!/bin/bash
# The CPU transpose's builds (portable, AVX2, AVX-512) each compile the tiling
# code of cpu_transpose_tiles.h with their own instruction set. Shared code
# compiled that way is weak, and the linker keeps one copy for all three
# builds, perhaps the one built for AVX-512. So:
# - no weak code in namespace transpose::kernels::internal in any member (the
#   tiling code is private to each file);
# - no weak code of the project's in the AVX2 and AVX-512 members (an inline
#   function of a shared header, not inlined, as in a Debug build).
# Weak data, such as an inline constant some builds emit as a unique symbol, is
# the same in every build.
#   cpu_transpose_symbols_test.sh LIBRARY
set -euo pipefail
library=${1:?usage: cpu_transpose_symbols_test.sh LIBRARY}
# nm -A prints "LIBRARY:MEMBER:VALUE TYPE NAME"; names mangled, so that other
# libraries' templates that merely take the project's types do not match.
weak=$(nm -A --defined-only "$library" | awk '$2 == "W"')
shared=$(echo "$weak" | awk '$3 ~ /^_ZN[KVRO]*9transpose7kernels8internal/')
shared+=$(echo "$weak" | grep -E ':cpu_transpose_avx(2|512)\.cc\.o:' |
  awk '$3 ~ /^_ZN[KVRO]*9transpose/' || true)
if [[ -n "$shared" ]]; then
  echo "FAIL: weak code shared between the builds in $library:"
  echo "$shared" | c++filt | cut -c1-300
  exit 1
fi
members=$(nm -A --defined-only "$library" | cut -d: -f2 | sort -u | wc -l)
[[ $members -ge 3 ]] || { echo "FAIL: $library has $members members with symbols"; exit 1; }
echo "PASS: no weak code shared between the builds in $members members of $library"
