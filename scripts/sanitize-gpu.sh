#!/usr/bin/env bash
# Runs a subset of the bundled GPU tests under compute-sanitizer (memcheck and racecheck).
# Usage: .gpu/sanitize-gpu.sh LOG_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?log dir}"; mkdir -p "$logs"
# Override with TOOLS="memcheck" TESTS="conv_forward_matches_reference ...".
tools="${TOOLS:-memcheck racecheck}"
tests="${TESTS:-conv_forward_matches_reference conv_bias_act_matches_reference matmul_matches_reference
  pool_forward_matches_reference pool_backward_matches_reference repeated_calls_track_new_input_data}"
for tool in $tools; do
  for t in $tests; do
    timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$here/test-gpu_ops" --include-ignored --exact "$t" --test-threads=1 >"$logs/$tool-$t.log" 2>&1
    rc=$?
    printf '%-10s %-42s rc=%-3s %s\n' "$tool" "$t" "$rc" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$tool-$t.log" | tail -1)"
  done
done
