#!/bin/bash
# transpose_bench refuses a usage mistake with exit code 2 before it touches a
# GPU (so this runs without one): it used to ignore unknown arguments, run the
# whole benchmark on --reps=0 and read an empty vector, and drop the JSON
# silently when its file could not be written, after a ten-minute run.
#
#   transpose_bench_usage_test.sh PATH_TO_transpose_bench
set -u
bench=$1
failed=0
expect_usage_error() {
  local message=$1
  shift
  local output
  output=$("$bench" "$@" 2>&1)
  local code=$?
  if [[ $code != 2 || $output != *"$message"* ]]; then
    echo "FAIL: transpose_bench $*: exit code $code (expected 2), output:"
    echo "$output"
    failed=1
  else
    echo "ok: transpose_bench $* -> $message"
  fi
}
expect_usage_error "--reps=0: expected 1 to 100000 runs" --reps=0
expect_usage_error "--reps=abc: expected 1 to 100000 runs" --reps=abc
expect_usage_error "--reps=-3: expected 1 to 100000 runs" --reps=-3
expect_usage_error "unknown argument '--json'" --json out.json
expect_usage_error "unknown argument '--rep=5'" --rep=5
expect_usage_error "--case=no-such-case matches no case" --case=no-such-case
expect_usage_error "--json=/nonexistent/x.json: No such file or directory" \
  --quick --json=/nonexistent/x.json
expect_usage_error "--shape=3:4x4: element size 3 is not 1, 2, 4, 8 or 16" \
  --shape=3:4x4
expect_usage_error "--shape=2:0x4: zero dimension" --shape=2:0x4
expect_usage_error "--shape=2:4x-4: expected SIZE:ROWSxCOLS" --shape=2:4x-4
expect_usage_error "--shape=2:4: expected SIZE:ROWSxCOLS" --shape=2:4
expect_usage_error "--shape=2:2x3x4x5: expected SIZE:ROWSxCOLS" \
  --shape=2:2x3x4x5
expect_usage_error "--shape=16:99999999999x99999999999: matrix size overflows" \
  --shape=16:99999999999x99999999999
expect_usage_error "--quick picks among the built-in cases" --quick \
  --shape=2:4097x4099
expect_usage_error "--case=x(2 matches no case" --shape=2:4097x4099 \
  --shape=1:3x4097x4099 --case="x(2"
exit $failed
