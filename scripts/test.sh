#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test. GPU tests run
# when a GPU is visible; otherwise they are listed as skipped. Then, unless TRANSPOSE_QUICK_TESTS=1:
# the whole suite again under AddressSanitizer and UndefinedBehaviorSanitizer, the engine's
# concurrency tests under ThreadSanitizer, and the fuzz targets (Clang, libFuzzer): their seed
# corpus, then a bounded run each. Arguments go to the first ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

scripts/install_deps.sh
# Said either way: the build directory's cache keeps what an earlier run set, so a build first
# configured on a GPU machine would otherwise run its end-to-end tests on the CUDA backend here.
if nvidia-smi -L >/dev/null 2>&1; then
  have_gpu=1
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DTRANSPOSE_TEST_BACKEND=cuda"
else
  have_gpu=0
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DTRANSPOSE_TEST_BACKEND=cpu"
fi
scripts/build.sh

# A stage whose tests were renamed away fails instead of passing with none run.
ctest_args=(--output-on-failure --timeout 1800 --no-tests=error)
(
  cd "${BUILD_DIR:-build}"
  if ((have_gpu)); then
    # The listing first: grep -q would stop reading early, and pipefail count ctest's SIGPIPE.
    unbuilt_tests=$(ctest -N -L unbuilt)
    if grep -qE "Test +#" <<<"$unbuilt_tests"; then
      echo "A GPU is visible, but this build has no CUDA backend (no nvcc at" \
        "/usr/local/cuda/bin): the GPU tests were not built and report themselves skipped;" \
        "the rest run on the CPU backend."
    fi
    ctest "${ctest_args[@]}" "$@"
  else
    echo "No GPU visible: skipping the tests labelled gpu:"
    ctest -N -L gpu | { grep -E "Test +#" || true; } | sed 's/^ */  SKIPPED /'
    ctest -LE gpu "${ctest_args[@]}" "$@"
  fi
)
[[ "${TRANSPOSE_QUICK_TESTS:-0}" == 1 ]] && exit 0

echo "== AddressSanitizer and UndefinedBehaviorSanitizer: the whole suite (but the tool checks)"
BUILD_DIR=build-asan CMAKE_ARGS="-DTRANSPOSE_SANITIZE=address,undefined -DTRANSPOSE_CUDA=OFF" \
  scripts/build.sh
(
  cd build-asan
  ASAN_OPTIONS=detect_leaks=1 \
  LSAN_OPTIONS="suppressions=$repo/tests/sanitizers/lsan.supp" \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest -LE "gpu|tools" "${ctest_args[@]}"
)

# Debian's gRPC and Abseil are not built for TSan, so the RPC-level tests would report races that
# those libraries order internally; the engine's concurrency is all on standard-library locks.
echo "== ThreadSanitizer: the engine's concurrency"
tsan_tests=(engine_concurrency_test engine_test buffer_pool_test call_gate_test worker_pool_test
  stall_watchdog_test)
BUILD_DIR=build-tsan CMAKE_ARGS="-DTRANSPOSE_SANITIZE=thread -DTRANSPOSE_CUDA=OFF" \
  scripts/build.sh --target "${tsan_tests[@]}"
(
  cd build-tsan
  TSAN_OPTIONS="halt_on_error=1 suppressions=$repo/tests/sanitizers/tsan.supp" \
    ctest -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$" "${ctest_args[@]}"
)

echo "== libFuzzer: seed corpus and a bounded run per target"
BUILD_DIR=build-fuzz CMAKE_ARGS="-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
-DTRANSPOSE_CUDA=OFF -DTRANSPOSE_FUZZ=ON -DTRANSPOSE_SANITIZE=address,undefined" \
  scripts/build.sh --target request_fuzzer npy_fuzzer
(cd build-fuzz && ctest -R "fuzzer" "${ctest_args[@]}")
