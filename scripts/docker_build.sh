#!/usr/bin/env bash
# The Docker image's build stage, as one script so that CI runs exactly what the image runs
# (tests/docker_build_test.sh): install the build dependencies, build the server and the CLI,
# stage them with their libraries into PREFIX.
#
# Usage: scripts/docker_build.sh PREFIX
# Environment: CUDA_ARCHITECTURES (e.g. "75;80;90"), BUILD_DIR, BUILD_TYPE (default Release).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/docker_build.sh PREFIX}

scripts/install_deps.sh --build-only
BUILD_TYPE=${BUILD_TYPE:-Release} scripts/build.sh --target transpose_server transpose
scripts/package_runtime.sh "$prefix"
