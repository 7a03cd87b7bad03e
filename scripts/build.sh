#!/usr/bin/env bash
# Configures and builds the project. The README's commands, CI and the Dockerfile all build
# through this script.
#
# Usage: scripts/build.sh [cmake --build args, e.g. --target transpose_server]
# Environment:
#   BUILD_DIR           build directory (default: build)
#   BUILD_TYPE          CMake build type (default: RelWithDebInfo)
#   CUDA_ARCHITECTURES  e.g. "90" or "75;80;90" (default: the CMakeLists' list)
#   CMAKE_ARGS          extra configure arguments
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
configure=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}")
if [[ -n "${CUDA_ARCHITECTURES:-}" ]]; then
  configure+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHITECTURES")
fi
# shellcheck disable=SC2206
configure+=(${CMAKE_ARGS:-})

mkdir -p "$build_dir"
cmake "${configure[@]}" >"$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log"
  exit 1
}
grep -E "^-- transpose:" "$build_dir/configure.log" || true
cmake --build "$build_dir" -j "$(nproc)" "$@"
