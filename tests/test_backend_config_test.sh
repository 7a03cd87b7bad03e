#!/usr/bin/env bash
# scripts/test.sh asks for the CUDA backend whenever it sees a GPU. A build without nvcc has none:
# its end-to-end tests must ask for the CPU backend (a server asked for CUDA refuses to start, so
# every one of them would fail), it says so, and it has no GPU tests, which test.sh then reports.
# With nvcc, the same request stays CUDA. Configures the repository only, in a folder of its own.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

backends() { grep -o "TRANSPOSE_TEST_BACKEND=[a-z]*" "$1/tests/CTestTestfile.cmake" | sort -u; }

said=$(cmake -S "$repo" -B "$dir/cpu" -G Ninja -DTRANSPOSE_CUDA=OFF \
  -DTRANSPOSE_TEST_BACKEND=cuda 2>&1)
[[ "$(backends "$dir/cpu")" == "TRANSPOSE_TEST_BACKEND=cpu" ]] ||
  { echo "FAIL: without CUDA the end-to-end tests ask for: $(backends "$dir/cpu")"; exit 1; }
grep -q "this build has no CUDA backend" <<<"$said" ||
  { echo "FAIL: configuring without CUDA did not say why:"; echo "$said"; exit 1; }
if (cd "$dir/cpu" && ctest -N -L gpu | grep -qE "Test +#"); then
  echo "FAIL: a build without CUDA lists GPU tests"; exit 1
fi

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cmake -S "$repo" -B "$dir/cuda" -G Ninja -DTRANSPOSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTRANSPOSE_TEST_BACKEND=cuda >/dev/null
  [[ "$(backends "$dir/cuda")" == "TRANSPOSE_TEST_BACKEND=cuda" ]] ||
    { echo "FAIL: with CUDA the end-to-end tests ask for: $(backends "$dir/cuda")"; exit 1; }
  echo "PASS: cpu without CUDA (said why, no GPU tests); cuda with it"
else
  echo "PASS: cpu without CUDA (said why, no GPU tests); no nvcc here for the CUDA case"
fi
