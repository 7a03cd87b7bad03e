#!/usr/bin/env bash
# Installs every build and test dependency from Debian 12 packages. Idempotent: packages already
# present are skipped, so repeated runs cost one dpkg query. The Dockerfile calls this same script.
#
# Usage: scripts/install_deps.sh [--build-only]   (--build-only: skip the test-only tools)
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build pkg-config git patchelf
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev prometheus-cpp-dev libcurl4-openssl-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
test_packages=(
  prometheus python3 python3-numpy python3-yaml python3-grpcio python3-protobuf python3-h2 openssl yamllint
  clang-format
  clang-14 libclang-rt-14-dev
)

packages=("${build_packages[@]}" "${test_packages[@]}")
if [[ "${1:-}" == "--build-only" ]]; then
  packages=("${build_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The tests need Prometheus's binaries and start their own; on a machine run by systemd the
# package also starts (and enables) a server on every interface's port 9090, which nobody asked
# for. Stopped where this run installed it, so one an operator runs is left alone.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]]; then
  "${sudo_cmd[@]}" systemctl disable --now prometheus.service || true
fi
