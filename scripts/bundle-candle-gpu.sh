#!/usr/bin/env bash
# Builds the Candle GPU check binary (backend/tests/candle_gpu.rs, feature `candle-cuda`) and
# writes it stripped and xz-compressed to .gpu-candle/candle_gpu.xz (git-ignored) together with
# run-candle-gpu.sh, for a CUDA machine without a Rust toolchain or nvcc.
# Needs scripts/setup-candle-cuda.sh (run here once). Usage: scripts/bundle-candle-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
eval "$(scripts/setup-candle-cuda.sh --env)"
exe="$(cargo test --release -p cudnn-backend --no-default-features --features candle-cuda --test candle_gpu \
  --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "candle_gpu":
        print(m["executable"])
')"
mkdir -p .gpu-candle
strip -o .gpu-candle/candle_gpu "$exe"
xz -T0 -6 -f .gpu-candle/candle_gpu
cp scripts/run-candle-gpu.sh bench/compare_torch.py .gpu-candle/
ls -la .gpu-candle
