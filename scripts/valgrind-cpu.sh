#!/usr/bin/env bash
# Runs the CPU tests of the handle pool and the plan cache under valgrind's memcheck
# (invalid reads/writes, uses of uninitialised memory, leaks) — the memory-safety check for
# the pool's unsafe code on stable Rust, where Miri and the sanitizers are not available.
#
#   scripts/valgrind-cpu.sh            # needs valgrind (apt-get install valgrind)
#
# Builds the test binaries, runs each with one test thread under
# `valgrind --leak-check=full --error-exitcode=1` with scripts/valgrind-cpu.supp (leaks that
# are by design: the pool never destroys handles; libstd's one-time allocations), and prints
# per binary: errors, definitely and indirectly lost bytes, and suppressed errors. RAW=1
# runs without the suppressions. Exits non-zero when any run fails or reports errors.
# Logs go to $CARGO_TARGET_DIR/valgrind (default target/valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || {
    echo "valgrind not found: apt-get install valgrind" >&2
    exit 2
}
target="${CARGO_TARGET_DIR:-target}"
logs="$target/valgrind"
mkdir -p "$logs"

# "<name> <binary> [test filters...]" per line.
runs=()
exe() { sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1; }
for t in handle_pool plan_cache; do
    bin=$(cargo test -p integration-tests --test "$t" --no-run 2>&1 | exe)
    runs+=("$t $bin")
done
lib=$(cargo test -p cudnn-backend-core --lib --no-run 2>&1 | exe)
runs+=("lib-handle-plan $lib handle:: plan::")

supp=(--suppressions=scripts/valgrind-cpu.supp)
[ "${RAW:-0}" = 1 ] && supp=()

status=0
printf '%-18s %8s %12s %12s %10s %s\n' binary errors definitely indirectly suppressed result
for r in "${runs[@]}"; do
    read -r name bin filters <<<"$r"
    log="$logs/$name.log"
    # shellcheck disable=SC2086
    if valgrind --leak-check=full --error-exitcode=1 "${supp[@]}" --log-file="$log" \
        "$bin" --test-threads=1 $filters >"$logs/$name.out" 2>&1; then
        result=ok
    else
        result="FAILED (see $log and $logs/$name.out)"
        status=1
    fi
    errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9,]*\) errors.*/\1/p' "$log" | tail -n 1)
    definite=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
    suppressed=$(sed -n 's/.*ERROR SUMMARY: .*(suppressed: \([0-9,]*\) from.*/\1/p' "$log" | tail -n 1)
    indirect=$(sed -n 's/.*indirectly lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
    printf '%-18s %8s %12s %12s %10s %s\n' "$name" "${errors:-?}" "${definite:-0}" "${indirect:-0}" \
        "${suppressed:-0}" "$result"
done
exit $status
