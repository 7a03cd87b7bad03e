#!/usr/bin/env bash
# scripts/test.sh asks for the CUDA backend whenever it sees a GPU. A build without nvcc has none:
# its end-to-end tests must ask for the CPU backend (a server asked for CUDA refuses to start, so
# every one of them would fail), it says so, and its GPU tests report themselves skipped.
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
# Its GPU tests are still listed, and report themselves skipped, saying why.
ran=$(cd "$dir/cpu" && ctest -L gpu --output-on-failure -V 2>&1 || true)
for test in gpu_transpose_test cuda_backend_test; do
  grep -qE "$test .*Skipped" <<<"$ran" ||
    { echo "FAIL: a build without CUDA does not report $test skipped:"; echo "$ran"; exit 1; }
done
grep -q "was not built: this build has no CUDA backend" <<<"$ran" ||
  { echo "FAIL: the skipped GPU tests do not say why:"; echo "$ran"; exit 1; }

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cmake -S "$repo" -B "$dir/cuda" -G Ninja -DTRANSPOSE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTRANSPOSE_TEST_BACKEND=cuda >/dev/null
  [[ "$(backends "$dir/cuda")" == "TRANSPOSE_TEST_BACKEND=cuda" ]] ||
    { echo "FAIL: with CUDA the end-to-end tests ask for: $(backends "$dir/cuda")"; exit 1; }
  echo "PASS: cpu without CUDA (said why, GPU tests skipped); cuda with it"
else
  echo "PASS: cpu without CUDA (said why, GPU tests skipped); no nvcc here for the CUDA case"
fi
