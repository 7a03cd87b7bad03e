#!/usr/bin/env bash
# Stages the server and the CLI with the shared libraries they need into PREFIX (bin/ and lib/),
# and the container health check (bin/transpose_healthcheck, scripts/healthcheck.sh),
# so that a runtime image (or any machine with the same C library) runs them without the -dev
# packages. glibc and the driver's libcuda stay behind: the runtime image provides them. The
# binaries find their libraries through an $ORIGIN-relative RPATH.
#
# Usage: scripts/package_runtime.sh PREFIX   (after scripts/build.sh; BUILD_DIR as there)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/package_runtime.sh PREFIX}
build_dir=${BUILD_DIR:-build}

command -v patchelf >/dev/null || {
  echo "package_runtime: patchelf is needed (scripts/install_deps.sh installs it)" >&2
  exit 1
}
mkdir -p "$prefix/bin" "$prefix/lib"
binaries=("$build_dir/server/transpose_server" "$build_dir/client/transpose")
# Every copy replaces what an earlier run staged, whatever its date (a library from a package
# upgrade is often older than the staged copy), as a new file: a server running from PREFIX keeps
# the old one it mapped.
cp --remove-destination "${binaries[@]}" "$prefix/bin/"
for binary in "${binaries[@]}"; do
  # Whole, before it is read: a library the loader cannot find is an error, not one left out.
  needed=$(ldd "$binary")
  if missing=$(grep "not found" <<<"$needed" | grep -v "libcuda\.so"); then
    echo "package_runtime: $binary needs libraries this machine lacks:" >&2
    echo "$missing" >&2
    exit 1
  fi
  awk '/=> \// {print $3}' <<<"$needed" | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda.so*) ;;
      *) cp -L --remove-destination "$lib" "$prefix/lib/" ;;
    esac
  done
done
# DT_RPATH rather than RUNPATH: it also serves the libraries' own dependencies.
# The ones staged now, by name: bin/ may hold an earlier run's health check script.
for binary in "${binaries[@]}"; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$prefix/bin/$(basename "$binary")"
done
cp --remove-destination scripts/healthcheck.sh "$prefix/bin/transpose_healthcheck"
echo "package_runtime: $(ls "$prefix/bin" | wc -l) binaries, $(ls "$prefix/lib" | wc -l) libraries in $prefix"
