#!/usr/bin/env bash
# The README's run command: installs what is missing, builds, and starts transpose_server in the
# foreground (every GPU if there is one, else the CPU backend; gRPC on 0.0.0.0:50051, metrics on
# 0.0.0.0:9464). Arguments go to the server, e.g. --address=127.0.0.1:0 --backend=cpu.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh --build-only >&2
scripts/build.sh --target transpose_server transpose >&2
exec "${BUILD_DIR:-build}/server/transpose_server" "$@"
