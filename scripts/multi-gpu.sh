#!/usr/bin/env bash
# Data-parallel checks and benchmark on a CUDA machine (bundled binaries, see bundle-gpu.sh):
# the NCCL collective tests, train_burn on 1 and N GPUs (the same global work per step: N x
# --batch-size images; N GPUs as one process per GPU, and as Burn's in-process data
# parallelism with --threads, also on the lazy-fusion backend), train_candle on N GPUs when bundled (.gpu-candle), and PyTorch DDP
# on the same network in the same run. NCCL comes from CUDNN_BACKEND_NCCL_LIB or the
# loader's path; the two_gpus_* tests need two GPUs.
# MULTI_SKIP_TESTS=1 leaves the tests out (the benchmark only).
# Usage: .gpu/multi-gpu.sh LOG_DIR [BATCH_PER_GPU] [EPOCHS]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?log dir}"; batch="${2:-256}"; epochs="${3:-3}"
mkdir -p "$logs"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
summary=(); failed=()
run() { # name, command...
  local name="$1"; shift
  local t0=$SECONDS
  "$@" >"$logs/$name.log" 2>&1; local rc=$?
  ((rc == 0)) || failed+=("$name")
  summary+=("$(printf '%-32s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  return $rc
}
two=(); [[ $gpus -lt 2 ]] && two=(--skip two_gpus)
if [[ ${MULTI_SKIP_TESTS:-0} != 1 ]]; then
  run test-nccl_library "$here/test-nccl_library" --include-ignored
  run test-gpu_nccl "$here/test-gpu_nccl" --include-ignored --test-threads=1 --nocapture "${two[@]}"
  run test-burn_distributed "$here/test-burn_distributed" --include-ignored --nocapture "${two[@]}"
fi
train=$(( 60 * batch * (gpus > 1 ? gpus : 2) ))  # 30 steps per epoch on N GPUs
# cuDNN autotuning on both sides (train_torch.py sets cudnn.benchmark).
common=(--batch-size "$batch" --epochs "$epochs" --train "$train" --test 1024 --dtype f32 --benchmark)
run train_burn_1gpu "$here/train_burn" "${common[@]}" --out "$logs/out-1gpu"
if [[ $gpus -ge 2 ]]; then
  # One process per GPU (the default of --devices), then Burn's in-process data parallelism.
  run train_burn_${gpus}gpu "$here/train_burn" "${common[@]}" --devices "$gpus" --out "$logs/out-${gpus}gpu"
  run train_burn_${gpus}gpu_stock "$here/train_burn" "${common[@]}" --devices "$gpus" --stock --out "$logs/out-${gpus}gpu-stock"
  run train_burn_${gpus}gpu_threads "$here/train_burn_distributed" "${common[@]}" --devices "$gpus" --threads \
    --out "$logs/out-${gpus}gpu-threads"
  # The lazy-fusion backend (Autodiff<CudnnFusion>) takes Burn's in-process layout.
  run train_burn_${gpus}gpu_threads_fusion "$here/train_burn_distributed" "${common[@]}" --devices "$gpus" \
    --threads --fusion --out "$logs/out-${gpus}gpu-threads-fusion"
  if [[ -x $here/train_candle ]]; then
    run train_candle_1gpu "$here/train_candle" --device gpu --benchmark --batch-size "$batch" --epochs "$epochs" \
      --train "$train" --test 1024
    run train_candle_${gpus}gpu "$here/train_candle" --benchmark --batch-size "$batch" --epochs "$epochs" --train "$train" \
      --test 1024 --devices "$gpus"
  fi
  run torch_ddp_${gpus}gpu python3 "$here/train_torch.py" --batch-size "$batch" --steps 30 --epochs "$epochs" --devices "$gpus"
fi
run torch_1gpu python3 "$here/train_torch.py" --batch-size "$batch" --steps 30 --epochs "$epochs"
grep -h -E "^(test result|train_burn |train_candle |train_torch )|FAILED|panicked|replicas identical" "$logs"/*.log | head -40
printf '%s\n' "${summary[@]}"
# A run with any failed suite exits non-zero, so it cannot look green by accident.
if ((${#failed[@]} > 0)); then
  echo "failed: ${failed[*]}"
  exit 1
fi
