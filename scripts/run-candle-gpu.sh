#!/usr/bin/env bash
# Runs the Candle bundle (see bundle-candle-gpu.sh) on a CUDA machine.
#   run-candle-gpu.sh LOG_DIR [extra test-binary arguments, e.g. a filter]
#       every test of the Candle GPU check binary, including the #[ignore]d GPU ones, then the
#       ResNet-50 benchmark against PyTorch when torch is importable (logs: candle_gpu.log, ...)
#   run-candle-gpu.sh LOG_DIR train [extra train_candle flags, e.g. --dtype bf16 or --stock]
#       train_candle --epochs 3 (checkpoint and curves in LOG_DIR/train/, log in
#       train_candle.log); prints its last line (test accuracy, images/s, launches/step)
#   run-candle-gpu.sh LOG_DIR bench [CONFIG...]
#       train-bench.sh with train_candle (fused, and --stock) next to PyTorch eager on the same
#       CNN (bench/train_torch.py --model cnn); CONFIG = candle:dtype:batch, default
#       candle:f32:128 candle:bf16:128 candle:f32:512 candle-transformer:f32:32
#       candle-transformer:bf16:32 (train_candle_transformer); the table is printed and in
#       LOG_DIR/train-bench.md (per-run logs in LOG_DIR/train-bench/)
#   run-candle-gpu.sh LOG_DIR models [CONFIG...]
#       models-bench.sh with train_candle_models (variants candle and candle-stock, or
#       MODELS_BENCH_VARIANTS) next to PyTorch (bench/train_models_torch.py); CONFIG =
#       model:dtype:batch, default resnet50:bf16:64 gpt2:bf16:8
# The binaries link (by soname) libcuda.so.1, libcudart.so.13, libcublas.so.13, libcurand.so.10
# and libnvrtc.so.13, and load libcudnn.so.9 at run time: all must be on the loader path.
# CUDA_LIB_DIRS (colon-separated) replaces the default directories prepended to LD_LIBRARY_PATH;
# CUDNN_BACKEND_CUDNN_LIB=/path/to/libcudnn.so.9 picks a cuDNN explicitly (the loaded one is
# printed at the start of the test log).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="$(mkdir -p "${1:?log dir}" && cd "$1" && pwd)"; shift
mode=tests
if [[ ${1:-} == train ]]; then mode=train; shift; fi
if [[ ${1:-} == bench ]]; then mode=bench; shift; fi
if [[ ${1:-} == models ]]; then mode=models; shift; fi
default_dirs="/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib"
export LD_LIBRARY_PATH="${CUDA_LIB_DIRS:-$default_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unpack() { # name: decompresses the binary into LOG_DIR and checks that its libraries resolve
  xz -dc "$here/$1.xz" >"$logs/$1" && chmod +x "$logs/$1" || exit 2
  if ldd "$logs/$1" | grep "not found"; then
    echo "missing libraries above: set CUDA_LIB_DIRS" >&2
    exit 2
  fi
}
cd "$logs"
if [[ $mode == bench ]]; then
  unpack train_candle
  unpack train_candle_transformer
  configs=("$@"); [[ $# -eq 0 ]] && configs=(candle:f32:128 candle:bf16:128 candle:f32:512 \
    candle-transformer:f32:32 candle-transformer:bf16:32)
  TRAIN_BIN_DIR="$logs" PYTHON="${PYTHON:-/opt/torch/.venv/bin/python}" \
    "$here/train-bench.sh" "$logs/train-bench" "${configs[@]}" | tee "$logs/train-bench.md"
  exit "${PIPESTATUS[0]}"
fi
if [[ $mode == models ]]; then
  unpack train_candle_models
  configs=("$@"); [[ $# -eq 0 ]] && configs=(resnet50:bf16:64 gpt2:bf16:8)
  MODELS_BIN_DIR="$logs" MODELS_BENCH_VARIANTS="${MODELS_BENCH_VARIANTS:-candle candle-stock}" \
    PYTHON="${PYTHON:-/opt/torch/.venv/bin/python}" "$here/models-bench.sh" "$logs/models-bench" "${configs[@]}"
  exit $?
fi
if [[ $mode == train ]]; then
  unpack train_candle
  "$logs/train_candle" --epochs 3 --out "$logs/train" "$@" 2>&1 | tee "$logs/train_candle.log"
  rc=${PIPESTATUS[0]}
  echo "last line: $(tail -n 1 "$logs/train_candle.log")"
  exit "$rc"
fi
unpack candle_gpu
two=(); gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $gpus -lt 2 ]]; then # two_gpus_* tests fail by design on fewer GPUs
  two=(--skip two_gpus); echo "two_gpus_* tests: not run, needs two GPUs (found $gpus)"
fi
CANDLE_BENCH_JSON="$logs/candle_bench.json" "$logs/candle_gpu" --include-ignored --test-threads=1 --nocapture "${two[@]}" "$@" 2>&1 \
  | tee "$logs/candle_gpu.log"
rc=${PIPESTATUS[0]}
py="${PYTHON:-/opt/torch/.venv/bin/python}"
if [[ -f $logs/candle_bench.json ]] && "$py" -c "import torch" 2>/dev/null; then
  "$py" "$here/compare_torch.py" --rust "$logs/candle_bench.json" --json "$logs/torch_bench.json" \
    2>&1 | tee "$logs/compare_torch.log"
fi
exit "$rc"
