#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test. GPU tests run
# when a GPU is visible; otherwise they are listed as skipped. Arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
if nvidia-smi -L >/dev/null 2>&1; then
  have_gpu=1
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DTRANSPOSE_TEST_BACKEND=cuda"
else
  have_gpu=0
fi
scripts/build.sh

cd "${BUILD_DIR:-build}"
ctest_args=(--output-on-failure --timeout 1200 "$@")
if ((have_gpu)); then
  ctest "${ctest_args[@]}"
else
  echo "No GPU visible: skipping the tests labelled gpu:"
  ctest -N -L gpu | { grep -E "Test +#" || true; } | sed 's/^ */  SKIPPED /'
  ctest -LE gpu "${ctest_args[@]}"
fi
