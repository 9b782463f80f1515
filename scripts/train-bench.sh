#!/usr/bin/env bash
# Training throughput of the examples (fused drop-in modules, stock burn::nn modules) next to
# PyTorch eager on the same network, batch and dtype, in one run on one GPU. Run from the
# bundle (scripts/bundle-gpu.sh): .gpu/train-bench.sh LOG_DIR [CONFIG...] with
# CONFIG = model:dtype:batch, model cnn (train_burn), transformer (train_transformer) or
# candle (train_candle: the same CNN on Candle, fused batch norm and FusedAdamW, and with
# --stock candle-nn's AdamW and composed batch norm) or candle-transformer
# (train_candle_transformer: the transformer on Candle, our linear, layer norm, attention and
# FusedAdamW, and with --stock candle-nn's); both need the Candle bundle
# (scripts/bundle-candle-gpu.sh, then run-candle-gpu.sh LOG_DIR bench). For the Candle models,
# "our launches/step" counts this crate's launches only, not Candle's own kernels.
# The example binaries are taken from TRAIN_BIN_DIR (default: this script's folder).
# Both sides autotune convolutions (--benchmark; torch.backends.cudnn.benchmark).
# Variants (TRAIN_BENCH_VARIANTS, default "fused stock stock-fusion"): fused (this crate's
# drop-in modules and fused Adam on Autodiff<Cudnn>), stock (burn::nn modules and Burn's Adam),
# stock-fusion (the stock model on Autodiff<CudnnFusion>: unchanged Burn code, lazy fusion),
# fused-fusion (the drop-ins on Autodiff<CudnnFusion>), burn-cuda (the stock model on Burn's
# own CUDA backend, Autodiff<burn::backend::Cuda> with burn-fusion and autotuning: flags
# --stock --backend burn-cuda; needs train_burn/train_transformer built with
# `--features burn-cuda`, e.g. BUNDLE_BURN_CUDA=1 scripts/bundle-gpu.sh). The Candle models
# run the fused and stock variants only.
# burn-cuda runs with CUBECL_AUTOTUNE_LEVEL=minimal unless the variable is set (minimal,
# balanced, extensive or full; CubeCL keeps autotune results in ~/.cache/cubecl, or in
# target/ under the nearest folder with a Cargo.toml, so a second run skips the tuning).
# burn-cuda needs NVRTC (libnvrtc.so.13) on the loader path and a CUDA toolkit's headers
# (CUDA_PATH, default /usr/local/cuda). Its rows report n/a for our launches/step.
# TRAIN_BENCH_BURN_CUDA_WARM=SECONDS first runs burn-cuda's compiles and tuning for every config
# at once (see below), each log's first-step time printed on stderr; with TRAIN_BENCH_REPEATS=0
# the script stops there (a warm-up call, the measured rounds in a later call on the same machine).
# Each log ends with "process: X s, exit status N", the wall time of the whole process (start-up, kernel
# compiles and autotuning included, which burn-cuda does before and during its first steps).
# Prints one table row per config and variant; f32 rows also compare with PyTorch on TF32
# matmuls (`--matmul-tf32`), the arithmetic of our f32 matmuls. Ratios have three decimals, so
# a row just under a target (0.797) does not print as reaching it (0.80).
# TRAIN_BENCH_REPEATS=R (default 1) runs R rounds per config, each round PyTorch then every
# variant; ms/step and ratios are from the medians over the rounds, and "per-round ratios"
# gives the lowest and highest ours/PyTorch of a single round (these hosts' CPU speed moves
# between runs, and the stock lazy-fusion rows are bound by the host). TRAIN_BENCH_TF32=0
# skips the TF32-matmul PyTorch runs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bins="${TRAIN_BIN_DIR:-$here}"
logs="${1:?log dir}"; shift
configs=("$@")
[[ $# -eq 0 ]] && configs=(cnn:f32:128 cnn:bf16:128 cnn:f32:512 transformer:f32:32 transformer:bf16:32)
mkdir -p "$logs"
py="${PYTHON:-python3}"
rows=()
repeats="${TRAIN_BENCH_REPEATS:-1}"
# Median of the numbers given as arguments (0 when none is positive: a failed run).
median() { printf '%s\n' "$@" | awk '$1 > 0' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# "min–max" of the ratios a[i] / b[i] over the rounds where both ran.
ratio_range() { local -n a=$1 b=$2; local i out=()
  for i in "${!a[@]}"; do out+=("${a[$i]} ${b[$i]}"); done
  printf '%s\n' "${out[@]}" | awk '$1 > 0 && $2 > 0 { r = $1 / $2; if (n++ == 0 || r < lo) lo = r; if (n == 1 || r > hi) hi = r }
    END { if (n) printf "%.3f–%.3f", lo, hi; else printf "-" }'; }
# The rate in a result line: PATTERN's group followed by the unit (0 when the run failed).
rate_of() { local r; r=$(sed -nE "s/.*$1$unit.*/\\1/p" <<<"$2"); echo "${r:-0}"; }
# Sets model, dtype, batch, n, steps, unit, torch_args, ours and tag for CONFIG.
config_args() {
  IFS=: read -r model dtype batch <<<"$1"
  if [[ $model == cnn ]]; then
    n=10000; steps=$((n / batch)); unit=images
    torch_args=(--model cnn); ours=("$bins/train_burn" --benchmark --train "$n" --test 1000)
  elif [[ $model == candle ]]; then
    n=10000; steps=$((n / batch)); unit=images
    torch_args=(--model cnn); ours=("$bins/train_candle" --device gpu --benchmark --train "$n" --test 1000)
  elif [[ $model == candle-transformer ]]; then
    n=2048; steps=$((n / batch)); unit=sequences
    torch_args=(--model transformer); ours=("$bins/train_candle_transformer" --device gpu --train "$n" --test 256)
  else
    n=2048; steps=$((n / batch)); unit=sequences
    torch_args=(--model transformer); ours=("$bins/train_transformer" --train "$n" --test 256)
  fi
  tag="$model-$dtype-$batch"
}
# Runs our program on the current config as VARIANT for EPOCHS epochs, its output into LOG,
# then "process: X s, exit status N" (the whole process's wall time); under `timeout LIMIT`
# when LIMIT is given.
run_ours() {
  local variant=$1 log=$2 epochs=$3 limit=${4:-} flag=() env_set=() wrap=() t0 rc
  case $variant in
    stock) flag=(--stock) ;;
    stock-fusion) flag=(--stock --fusion) ;;
    fused-fusion) flag=(--fusion) ;;
    burn-cuda) flag=(--stock --backend burn-cuda) ;;
  esac
  [[ $variant == burn-cuda ]] && env_set=(CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}")
  [[ -n $limit ]] && wrap=(timeout "$limit")
  t0=$(date +%s.%N)
  env "${env_set[@]}" "${wrap[@]}" "${ours[@]}" --dtype "$dtype" --batch-size "$batch" --epochs "$epochs" \
      --out "/tmp/train-bench-out/$(basename "$log" .log)" "${flag[@]}" >"$log" 2>&1
  rc=$?
  if [[ $variant == burn-cuda ]]; then
    echo "CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal}" >>"$log"
  fi
  awk -v a="$t0" -v b="$(date +%s.%N)" -v r="$rc" 'BEGIN { printf "process: %.1f s, exit status %d\n", b - a, r }' >>"$log"
}
# With the burn-cuda variant and TRAIN_BENCH_BURN_CUDA_WARM=SECONDS, burn-cuda's compiles and
# autotuning run first, one epoch of every config at once (each stopped after SECONDS), so the
# measured runs start from CubeCL's caches: its start-up costs minutes per config, more than a
# device call may last for several configs run one after the other. Tuning while the others
# share the GPU may choose some of burn-cuda's kernels less well.
if [[ " ${TRAIN_BENCH_VARIANTS:-} " == *" burn-cuda "* && -n ${TRAIN_BENCH_BURN_CUDA_WARM:-} ]]; then
  for cfg in "${configs[@]}"; do
    config_args "$cfg"
    [[ $model == candle* ]] && continue
    run_ours burn-cuda "$logs/burn-cuda-warm-$tag.log" 1 "$TRAIN_BENCH_BURN_CUDA_WARM" &
  done
  wait
  for cfg in "${configs[@]}"; do
    config_args "$cfg"
    f="$logs/burn-cuda-warm-$tag.log"
    [[ -f $f ]] && echo "burn-cuda warm-up $tag: $(grep -h 'first step' "$f" | tail -1)$(grep -h '^process:' "$f" | tail -1 | sed 's/^/; /')" >&2
  done
fi
# No rounds asked: nothing to measure or tabulate.
(( repeats > 0 )) || exit 0
for cfg in "${configs[@]}"; do
  config_args "$cfg"
  variants=()
  for variant in ${TRAIN_BENCH_VARIANTS:-fused stock stock-fusion}; do
    # Lazy fusion and burn-cuda are Burn backends: the Candle models take fused and stock only.
    if [[ $model == candle* && $variant != fused && $variant != stock ]]; then
      continue
    fi
    variants+=("$variant")
  done
  torch_rates=(); tf32_rates=(); torch_kernels=0
  declare -A rates=() launches=() acc=()
  # Rounds alternate PyTorch and ours, so a slow spell of the host falls on both sides;
  # each side's rate is the median over the rounds (METHOD: repeat and take the median).
  for ((round = 1; round <= repeats; round++)); do
    suffix=""; [[ $repeats -gt 1 ]] && suffix="-r$round"
    torch_line=$(PYTHONUNBUFFERED=1 "$py" "$here/train_torch.py" "${torch_args[@]}" --dtype "$dtype" --batch-size "$batch" \
        --steps "$steps" --epochs 3 --count-kernels 2>&1 | tee "$logs/torch-$tag$suffix.log" | grep '^train_torch')
    torch_rates+=("$(rate_of ': ([0-9.]+) ' "$torch_line")")
    kernels=$(sed -nE 's/.*, ([0-9]+) kernels\/step.*/\1/p' <<<"$torch_line")
    [[ -n $kernels ]] && torch_kernels=$kernels
    # f32: PyTorch again with TF32 matmuls, the arithmetic of our f32 matmuls (cuDNN's f32
    # matmul engines are TF32; PyTorch's default f32 matmul is IEEE f32).
    if [[ $dtype == f32 && ${TRAIN_BENCH_TF32:-1} != 0 ]]; then
      tf32_line=$(PYTHONUNBUFFERED=1 "$py" "$here/train_torch.py" "${torch_args[@]}" --dtype "$dtype" --batch-size "$batch" \
          --steps "$steps" --epochs 3 --matmul-tf32 2>&1 | tee "$logs/torch-tf32-$tag$suffix.log" | grep '^train_torch')
      tf32_rates+=("$(rate_of ': ([0-9.]+) ' "$tf32_line")")
    fi
    for variant in "${variants[@]}"; do
      log="$logs/ours-$variant-$tag$suffix.log"
      run_ours "$variant" "$log" 3
      line=$(grep -E '^train_(burn|transformer|candle|candle_transformer) ' "$log")
      rates[$variant]+="$(rate_of '%\), ([0-9.]+) ' "$line") "
      # Launches and accuracy: the last round that ran.
      if [[ -n $line ]]; then
        launches[$variant]=$(sed -nE 's/.*, ([0-9]+|n\/a) launches\/step.*/\1/p' <<<"$line")
        acc[$variant]=$(sed -nE 's/.*test accuracy ([0-9.]+)%.*/\1/p' <<<"$line")
      fi
    done
  done
  torch_rate=$(median "${torch_rates[@]}")
  tf32_rate=0; [[ ${#tf32_rates[@]} -gt 0 ]] && tf32_rate=$(median "${tf32_rates[@]}")
  for variant in "${variants[@]}"; do
    read -ra ours_rates <<<"${rates[$variant]}"
    rate=$(median "${ours_rates[@]}")
    spread=$(ratio_range ours_rates torch_rates)
    ran=$(printf '%s\n' "${ours_rates[@]}" | awk '$1 > 0' | wc -l)
    [[ $ran -lt $repeats ]] && ran="$ran of $repeats (see logs)"
    rows+=("$(awk -v m="$model" -v d="$dtype" -v b="$batch" -v v="$variant" -v r="$rate" -v t="$torch_rate" \
        -v l="${launches[$variant]}" -v k="$torch_kernels" -v a="${acc[$variant]}" -v x="$tf32_rate" -v s="$spread" \
        -v n="$ran" 'BEGIN {
          tf = (x > 0) ? sprintf("%.2f | %.3f", 1000*b/x, r/x) : "- | -";
          if (r > 0 && t > 0) printf "| %s | %s | %s | %s | %.2f | %.2f | %.3f | %s | %s | %s | %s | %s%% | %s |", m, d, b, v, 1000*b/r, 1000*b/t, r/t, s, tf, l, k, a, n;
          else printf "| %s | %s | %s | %s | failed (see logs) |", m, d, b, v }')")
  done
  unset rates launches acc
done
echo "| model | dtype | batch | ours | ours ms/step | PyTorch ms/step | ours/PyTorch throughput | per-round ratios | PyTorch TF32-matmul ms/step | ours/PyTorch TF32-matmul | our launches/step | PyTorch kernels/step | our test accuracy | rounds |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
# A configuration whose run failed (a "failed" row, or fewer rounds than asked) fails the script.
if printf '%s\n' "${rows[@]}" | grep -qE 'failed|see logs'; then
  exit 1
fi
