#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA file differs from clang-format's Google style.
set -euo pipefail
cd "$(dirname "$0")/.."
# Listed first: a failing git inside <(...) would go unnoticed, and clang-format given no files
# reads standard input.
listing=$(git ls-files '*.cc' '*.h' '*.cu')
mapfile -t files <<<"$listing"
if [[ -z "$listing" ]]; then
  echo "check_format: git lists no C++ or CUDA files here" >&2
  exit 1
fi
clang-format --dry-run --Werror "${files[@]}"
echo "clang-format: ${#files[@]} files clean"
