#!/usr/bin/env bash
# Training throughput of the standard models (examples/train_models.rs) next to PyTorch
# (bench/train_models_torch.py) in one run on one GPU: BENCHMARKS.md's model table.
# Run from the bundle (scripts/bundle-gpu.sh): .gpu/models-bench.sh LOG_DIR [CONFIG...] with
# CONFIG = model:dtype:batch (default resnet50:bf16:64 resnet50:f32:64; models: resnet50, gpt2,
# vit_b16, bert_base).
# MODELS_BENCH_VARIANTS (default "stock-fusion fused-fusion"): ours, as in train-bench.sh,
# and `candle` / `candle-stock` (train_candle_models from the Candle bundle, resnet50 and gpt2,
# this crate's Candle layers or candle-nn's);
# a suffix +tf32 runs it with CUDNN_BACKEND_ALLOW_TF32=1 (TF32 f32 convolutions, as PyTorch's
# default), +nhwc with CUDNN_BACKEND_CONV_LAYOUT=nhwc (channels-last convolutions), +nchw
# with CUDNN_BACKEND_CONV_LAYOUT=nchw, +balanced with `--checkpointing balanced` (burn-autodiff's
# BalancedCheckpointing; Burn models only).
# MODELS_BENCH_TORCH (default "default tuned compile"): PyTorch settings (see the script;
# compile-ro adds mode="reduce-overhead").
# MODELS_BENCH_REPEATS=R (default 3) rounds alternate PyTorch's eager settings and ours; the
# compiled settings run MODELS_BENCH_COMPILE_REPEATS rounds (default 1: each compiles for a
# minute or more). MODELS_BENCH_STEPS (default 30) steps per epoch, 3 epochs, the last timed.
# MODELS_BENCH_ENV adds environment settings to our runs (e.g. "CUDNN_BACKEND_CONV_LAYOUT=nchw").
# MODELS_BIN_DIR: where our binaries are (default: this script's folder).
# Every run's JSON line goes to LOG_DIR/results.jsonl; the table (medians) is printed last.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?log dir}"; shift
configs=("$@")
[[ $# -eq 0 ]] && configs=(resnet50:bf16:64 resnet50:f32:64)
mkdir -p "$logs"
py="${PYTHON:-python3}"
repeats="${MODELS_BENCH_REPEATS:-3}"
compile_repeats="${MODELS_BENCH_COMPILE_REPEATS:-1}"
steps="${MODELS_BENCH_STEPS:-30}"
read -r -a variants <<<"${MODELS_BENCH_VARIANTS:-stock-fusion fused-fusion}"
read -r -a settings <<<"${MODELS_BENCH_TORCH:-default tuned compile}"
read -r -a ours_env <<<"${MODELS_BENCH_ENV:-}"
results="$logs/results.jsonl"
bins="${MODELS_BIN_DIR:-$here}"
failures=0
# Runs one command into LOG and appends its JSON line (with the round) to results.jsonl.
record() { # log round command...
  local log=$1 round=$2; shift 2
  "$@" >"$log" 2>&1
  local rc=$? line
  line=$(grep -E '^\{' "$log" | tail -1)
  if [[ -n $line ]]; then
    echo "${line%\}}, \"round\": $round}" >>"$results"
  else
    echo "failed (exit $rc): $log" >&2
    failures=$((failures + 1))
  fi
}
for cfg in "${configs[@]}"; do
  IFS=: read -r model dtype batch <<<"$cfg"
  tag="$model-$dtype-$batch"
  for ((round = 1; round <= repeats; round++)); do
    for s in "${settings[@]}"; do
      if [[ $s == compile* ]] && ((round > compile_repeats)); then continue; fi
      PYTHONUNBUFFERED=1 record "$logs/torch-$s-$tag-r$round.log" "$round" \
        "$py" "$here/train_models_torch.py" --model "$model" --setting "$s" --dtype "$dtype" \
        --batch-size "$batch" --steps "$steps"
    done
    for v in "${variants[@]}"; do
      flags=(--benchmark --variant "$v")
      bin=train_models
      v_env=("${ours_env[@]}")
      [[ $v == *+tf32* ]] && v_env+=(CUDNN_BACKEND_ALLOW_TF32=1)
      [[ $v == *+nchw* ]] && v_env+=(CUDNN_BACKEND_CONV_LAYOUT=nchw)
      [[ $v == *+nhwc* ]] && v_env+=(CUDNN_BACKEND_CONV_LAYOUT=nhwc)
      [[ $v == *+balanced* ]] && flags+=(--checkpointing balanced)
      case ${v%%+*} in
        stock) flags+=(--stock) ;;
        stock-fusion) flags+=(--stock --fusion) ;;
        fused-fusion) flags+=(--fusion) ;;
        candle) bin=train_candle_models ;;
        candle-stock) bin=train_candle_models flags+=(--stock) ;;
      esac
      record "$logs/ours-$v-$tag-r$round.log" "$round" env "${v_env[@]}" "$bins/$bin" --model "$model" \
        --dtype "$dtype" --batch-size "$batch" --steps "$steps" "${flags[@]}"
    done
  done
done
"$py" - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(xs):
    return statistics.median(xs) if xs else None
configs = []
for r in rows:
    c = (r["model"], r["dtype"], r["batch"])
    if c not in configs:
        configs.append(c)
for model, dtype, batch in configs:
    sel = [r for r in rows if (r["model"], r["dtype"], r["batch"]) == (model, dtype, batch)]
    torch = {}
    for r in sel:
        if "setting" in r:
            torch.setdefault(r["setting"], []).append(r)
    ours = {}
    for r in sel:
        if "variant" in r:
            ours.setdefault(r["variant"], []).append(r)
    print(f"\n{model} {dtype} batch {batch}: ms/step (median of rounds; throughput ratios = PyTorch ms / ours)")
    t = {s: med([r["ms_per_step"] for r in rs]) for s, rs in torch.items()}
    head = "| ours | ms/step | rounds | first step s | launches/step | loss first -> last | " + " | ".join(
        f"vs {s} ({t[s]:.2f} ms, {len(torch[s])} rd)" for s in t) + " |"
    print(head)
    print("|" + " --- |" * (6 + len(t)))
    for v, rs in ours.items():
        ms = med([r["ms_per_step"] for r in rs])
        cells = " | ".join(f"{t[s] / ms:.3f}" for s in t)
        loss = f"{rs[-1]['loss_first']:.3f} -> {rs[-1]['loss_last']:.3f}"
        print(f"| {v} | {ms:.2f} | {len(rs)} | {med([r['first_step_s'] for r in rs]):.2f} | "
              f"{rs[-1]['launches_per_step']} | {loss} | {cells} |")
    for s, rs in torch.items():
        print(f"PyTorch {s}: {t[s]:.2f} ms/step, first step {med([r['first_step_s'] for r in rs]):.2f} s, "
              f"rounds {[r['ms_per_step'] for r in rs]}")
PY
# Any run that gave no result fails the script (the table above has the others).
if ((failures > 0)); then
  echo "$failures run(s) failed (see the logs named above)"
  exit 1
fi
