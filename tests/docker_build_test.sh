#!/usr/bin/env bash
# Runs the Docker image's build stage (scripts/docker_build.sh) the way the image does, on this
# machine, and checks what it staged: the binaries find every library in the stage (glibc aside),
# and the staged server serves the staged CLI's health check. No Docker engine is needed.
#
# Usage: docker_build_test.sh BUILD_DIR   (a directory of its own: the image builds Release)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:?usage: docker_build_test.sh BUILD_DIR}
stage=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$stage"
}
trap cleanup EXIT

BUILD_DIR="$build_dir" "$repo/scripts/docker_build.sh" "$stage/opt/transpose"
# Staged again over the first (an upgrade in place): the same result.
BUILD_DIR="$build_dir" "$repo/scripts/package_runtime.sh" "$stage/opt/transpose" ||
  { echo "FAIL: package_runtime.sh failed over an earlier stage"; exit 1; }

for binary in "$stage"/opt/transpose/bin/transpose "$stage"/opt/transpose/bin/transpose_server; do
  # Each listing whole before grep -q, which stops reading early: pipefail would count the
  # writer's SIGPIPE.
  libraries=$(ldd "$binary")
  if grep -q "not found" <<<"$libraries"; then
    echo "FAIL: $binary has unresolved libraries:"; echo "$libraries"; exit 1
  fi
  dynamic=$(readelf -d "$binary")
  grep -q 'RPATH.*\[\$ORIGIN/\.\./lib\]' <<<"$dynamic" ||
    { echo "FAIL: $binary has no \$ORIGIN/../lib RPATH"; echo "$dynamic"; exit 1; }
  # Everything but the C library and the kernel's vDSO comes from the stage.
  outside=$(ldd "$binary" | awk '/=>/ {print $1, $3}' |
            grep -vE "^(libc|libm|libpthread|libdl|librt|ld-linux|linux-vdso)[.-]" |
            grep -vF " $stage/opt/transpose/" || true)
  if [[ -n "$outside" ]]; then
    echo "FAIL: $binary loads libraries from outside the stage:"; echo "$outside"; exit 1
  fi
done

out="$stage/server.out"
"$stage/opt/transpose/bin/transpose_server" --backend=cpu --address=127.0.0.1:0 \
  --metrics_address= >"$out" 2>"$stage/server.err" &
server_pid=$!
for _ in $(seq 100); do
  grep -q "^listening on" "$out" && break
  sleep 0.1
done
port=$(sed -n 's/^listening on .*://p' "$out")
[[ -n "$port" ]] || { echo "FAIL: staged server did not start"; cat "$stage/server.err"; exit 1; }
health=$("$stage/opt/transpose/bin/transpose" --server="127.0.0.1:$port" --deadline=5s health)
[[ "$health" == "SERVING" ]] || { echo "FAIL: health said '$health'"; exit 1; }
# The image's HEALTHCHECK, told where this server listens, passes; where no server listens (a
# loopback port held bound and not listening, so that nothing else can take it meanwhile) it fails
# with 1 (Docker reserves the CLI's 3 for no answer).
TRANSPOSE_HEALTH_SERVER="127.0.0.1:$port" "$stage/opt/transpose/bin/transpose_healthcheck" ||
  { echo "FAIL: transpose_healthcheck failed against the staged server"; exit 1; }
rc=$(python3 - "$stage/opt/transpose/bin/transpose_healthcheck" <<'EOF'
import os, socket, subprocess, sys
with socket.socket() as refused:
    refused.bind(("127.0.0.1", 0))
    env = dict(os.environ, TRANSPOSE_HEALTH_SERVER="127.0.0.1:%d" % refused.getsockname()[1])
    print(subprocess.run(sys.argv[1:], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL).returncode)
EOF
)
[[ $rc == 1 ]] || { echo "FAIL: transpose_healthcheck with no server exited $rc, not 1"; exit 1; }
echo "PASS: staged $(ls "$stage/opt/transpose/lib" | wc -l) libraries; staged server SERVING"
