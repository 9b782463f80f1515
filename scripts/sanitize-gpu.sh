#!/usr/bin/env bash
# Runs the bundled GPU tests (see bundle-gpu.sh) under compute-sanitizer, one process per
# (tool, test binary, test), several at once, and prints one line per process.
#   .gpu/sanitize-gpu.sh LOG_DIR [BINARY...]     (default: every test-* binary next to it)
# Environment:
#   TOOLS="memcheck racecheck"   tools to run
#   PARALLEL=12                  processes at once (each sanitizer process is CPU-heavy)
#   LIMIT=540                    seconds per process (timeout)
#   SHARDS=1                     split every test into this many processes via TEST_SHARD
#                                (only tests that read TEST_SHARD split; others repeat)
#   SANITIZER=compute-sanitizer  the executable; extra options in SANITIZER_ARGS
# Racecheck of sort kernels costs about 90 s per sort call: use the small
# `every_sort_path_on_single_rows` test for it (see docs/reliability.md).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="$(mkdir -p "${1:?log dir}" && cd "$1" && pwd)"; shift
bins=("$@"); [[ ${#bins[@]} -gt 0 ]] || bins=("$here"/test-*)
san="${SANITIZER:-compute-sanitizer}"
shards="${SHARDS:-1}"
queue="$logs/queue.txt"; : >"$queue"
two=(); gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $gpus -lt 2 ]]; then two=(--skip two_gpus); echo "two_gpus_* tests: not run, needs two GPUs (found $gpus)"; fi
for bin in "${bins[@]}"; do
  for t in $("$bin" --list --include-ignored "${two[@]}" 2>/dev/null | sed -n 's/: test$//p'); do
    for tool in ${TOOLS:-memcheck racecheck}; do
      for ((k = 0; k < shards; k++)); do echo "$tool $bin $t $k" >>"$queue"; done
    done
  done
done
one() { # tool binary test shard
  local tool=$1 bin=$2 t=$3 k=$4 t0=$SECONDS
  local log="$logs/$tool-$(basename "$bin")-$t-$k.log"
  local shard=(); [[ $shards -gt 1 ]] && shard=(env "TEST_SHARD=$k/$shards")
  # shellcheck disable=SC2086
  "${shard[@]}" timeout "${LIMIT:-540}" "$san" --tool "$tool" --error-exitcode 9 ${SANITIZER_ARGS:-} \
    "$bin" --include-ignored --exact "$t" --test-threads=1 >"$log" 2>&1
  # Read at once: the command substitutions below would overwrite `$?`.
  local rc=$?
  printf '%-9s %-60s rc=%-3s %4ss %s\n' "$tool" "$(basename "$bin") $t #$k" "$rc" $((SECONDS - t0)) \
    "$(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=* *//')"
}
export -f one; export logs shards san
xargs -P "${PARALLEL:-12}" -L 1 bash -c 'one "$@"' _ <"$queue" | sort | tee "$logs/summary.txt"
# Any test that failed or that the sanitizer flagged (its exit status) fails the run.
if grep -qE ' rc=[1-9]' "$logs/summary.txt"; then
  echo "failed: $(grep -cE ' rc=[1-9]' "$logs/summary.txt") runs (see rc= above)"
  exit 1
fi
