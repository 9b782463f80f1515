#!/usr/bin/env bash
# Builds the Candle GPU check binary (backend/tests/candle_gpu.rs, feature `candle-cuda`) and the
# train_candle, train_candle_transformer and train_candle_models examples (examples feature
# `candle-cuda`), and writes
# them stripped and xz-compressed to .gpu-candle/<name>.xz (git-ignored) together
# with run-candle-gpu.sh, train-bench.sh and the PyTorch scripts (compare_torch.py,
# train_torch.py), for a CUDA machine without a Rust toolchain or nvcc.
# The check binary is built with CANDLE_TEST_FEATURES (default `candle-cudnn`: Candle's own conv2d
# then uses cuDNN, the fair baseline for the benchmark; `candle-cuda` leaves Candle's kernels).
# Needs scripts/setup-candle-cuda.sh (run here once). Usage: scripts/bundle-candle-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
eval "$(scripts/setup-candle-cuda.sh --env)"
# The executable of target $1 in cargo's JSON messages on stdin.
executable() {
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])
' "$1"
}
tests="$(cargo test --release -p cudnn-backend --no-default-features --features "${CANDLE_TEST_FEATURES:-candle-cudnn}" --test candle_gpu \
  --no-run --message-format=json | executable candle_gpu)"
train="$(cargo build --release -p examples --features candle-cuda --example train_candle \
  --message-format=json | executable train_candle)"
transformer="$(cargo build --release -p examples --features candle-cuda --example train_candle_transformer \
  --message-format=json | executable train_candle_transformer)"
models="$(cargo build --release -p examples --features candle-cuda --example train_candle_models \
  --message-format=json | executable train_candle_models)"
mkdir -p .gpu-candle
for pair in "candle_gpu:$tests" "train_candle:$train" "train_candle_transformer:$transformer" \
  "train_candle_models:$models"; do
  name="${pair%%:*}"
  strip -o ".gpu-candle/$name" "${pair#*:}"
  xz -T0 -6 -f ".gpu-candle/$name"
done
cp scripts/run-candle-gpu.sh scripts/train-bench.sh scripts/models-bench.sh bench/compare_torch.py bench/train_torch.py \
  bench/train_models_torch.py .gpu-candle/
ls -la .gpu-candle
