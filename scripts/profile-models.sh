#!/usr/bin/env bash
# Per-kernel GPU time of training steps of a standard model: ours under Nsight Compute
# (kernel durations of the last PROFILE_STEPS steps, chosen by train_models' --profile-steps),
# PyTorch with its profiler (one step per setting). Run from the bundle:
# .gpu/profile-models.sh LOG_DIR [MODEL DTYPE BATCH]
# PROFILE_VARIANTS (default "stock-fusion fused-fusion"; a suffix +nhwc runs that variant with
# channels-last convolutions and +balanced with `--checkpointing balanced`, as in
# models-bench.sh; `candle` and `candle-stock` profile
# train_candle_models from the Candle bundle) and PROFILE_TORCH (default "default
# tuned"; "none" for no PyTorch run) pick the runs; PROFILE_ENV adds environment settings to ours. PROFILE_DETAIL=REGEX
# adds, per variant, Nsight Compute's throughput, occupancy and launch sections for the first
# PROFILE_DETAIL_COUNT (default 12) kernels of the profiled steps whose name matches REGEX
# (ncu-VARIANT-detail.txt): why a kernel is slow, not only how long it takes. Writes ncu-VARIANT.csv,
# ncu-VARIANT.txt (kernels by total time) and torch-SETTING.txt. PROFILE_KERNEL_LOG=1 also
# collects each kernel's DRAM bytes, registers and occupancy and train_models' --kernel-log,
# joined into kernels-VARIANT.txt (bench/kernel_table.py): the fused kernels grouped by launch
# signature, the groups with the most time above the memory bound first.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?log dir}"; model="${2:-resnet50}"; dtype="${3:-bf16}"; batch="${4:-64}"
mkdir -p "$logs"
psteps="${PROFILE_STEPS:-2}"
metrics="gpu__time_duration.sum"
if [[ ${PROFILE_KERNEL_LOG:-0} == 1 ]]; then
  metrics+=",dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread"
  metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active"
fi
read -r -a ours_env <<<"${PROFILE_ENV:-}"
failures=0
for v in ${PROFILE_VARIANTS:-stock-fusion fused-fusion}; do
  flags=(--benchmark)
  bin=train_models
  v_env=("${ours_env[@]}")
  [[ $v == *+nhwc* ]] && v_env+=(CUDNN_BACKEND_CONV_LAYOUT=nhwc)
  [[ $v == *+balanced* ]] && flags+=(--checkpointing balanced)
  case ${v%%+*} in
    stock) flags+=(--stock) ;;
    stock-fusion) flags+=(--stock --fusion) ;;
    fused-fusion) flags+=(--fusion) ;;
    candle) bin=train_candle_models ;;
    candle-stock) bin=train_candle_models flags+=(--stock) ;;
  esac
  [[ ${PROFILE_KERNEL_LOG:-0} == 1 && $bin == train_models ]] && flags+=(--kernel-log "$logs/kernels-$v.log")
  env "${v_env[@]}" ncu --profile-from-start off --clock-control none --metrics "$metrics" --csv \
    "$here/$bin" --model "$model" --dtype "$dtype" --batch-size "$batch" --steps $((psteps + 4)) --epochs 1 \
    --profile-steps "$psteps" "${flags[@]}" >"$logs/ncu-$v.csv" 2>"$logs/ncu-$v.err" || failures=$((failures + 1))
  python3 "$here/ncu_summary.py" "$logs/ncu-$v.csv" "$psteps" >"$logs/ncu-$v.txt"
  if [[ -f $logs/kernels-$v.log ]]; then
    python3 "$here/kernel_table.py" "$logs/ncu-$v.csv" "$logs/kernels-$v.log" >"$logs/kernels-$v.txt"
  fi
  if [[ -n ${PROFILE_DETAIL:-} ]]; then
    env "${v_env[@]}" ncu --profile-from-start off --clock-control none --kernel-name "regex:$PROFILE_DETAIL" \
      --launch-count "${PROFILE_DETAIL_COUNT:-12}" --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis "$here/$bin" --model "$model" --dtype "$dtype" --batch-size "$batch" \
      --steps $((psteps + 4)) --epochs 1 --profile-steps "$psteps" "${flags[@]}" >"$logs/ncu-$v-detail.txt" 2>&1
  fi
done
for s in ${PROFILE_TORCH:-default tuned}; do
  [[ $s == none ]] && continue
  PYTHONUNBUFFERED=1 python3 "$here/train_models_torch.py" --model "$model" --setting "$s" --dtype "$dtype" \
    --batch-size "$batch" --steps 5 --epochs 1 --profile "$logs/torch-$s.txt" >"$logs/torch-$s.log" 2>&1 \
    || failures=$((failures + 1))
done
for v in ${PROFILE_VARIANTS:-stock-fusion fused-fusion}; do echo "== ours $v"; head -22 "$logs/ncu-$v.txt"; done
for s in ${PROFILE_TORCH:-default tuned}; do [[ $s == none ]] && continue; echo "== torch $s"; grep -E 'Self CUDA time total|^train_models_torch' "$logs/torch-$s.txt" "$logs/torch-$s.log"; done
# A profile that did not run fails the script, so a run cannot look complete by accident.
if ((failures > 0)); then
  echo "$failures profiled run(s) failed (see the .err and .log files)"
  exit 1
fi
