#!/usr/bin/env bash
# Runs the Candle GPU check binary (see bundle-candle-gpu.sh) on a CUDA machine: every test,
# including the #[ignore]d GPU ones, then the ResNet-50 benchmark against PyTorch when torch
# is importable. Usage: run-candle-gpu.sh LOG_DIR [extra test-binary arguments, e.g. a filter]
# The binary links (by soname) libcuda.so.1, libcudart.so.13, libcublas.so.13, libcurand.so.10
# and libnvrtc.so.13, and loads libcudnn.so.9 at run time: all must be on the loader path.
# CUDA_LIB_DIRS (colon-separated) is prepended to LD_LIBRARY_PATH.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="$(mkdir -p "${1:?log dir}" && cd "$1" && pwd)"; shift
bin="$logs/candle_gpu"
xz -dc "$here/candle_gpu.xz" >"$bin" && chmod +x "$bin"
default_dirs="/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib"
export LD_LIBRARY_PATH="${CUDA_LIB_DIRS:-$default_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$bin" | grep "not found"; then
  echo "missing libraries above: set CUDA_LIB_DIRS" >&2
  exit 2
fi
cd "$logs"
CANDLE_BENCH_JSON="$logs/candle_bench.json" "$bin" --include-ignored --test-threads=1 --nocapture "$@" 2>&1 \
  | tee "$logs/candle_gpu.log"
rc=${PIPESTATUS[0]}
py="${PYTHON:-/opt/torch/.venv/bin/python}"
if [[ -f $logs/candle_bench.json ]] && "$py" -c "import torch" 2>/dev/null; then
  "$py" "$here/compare_torch.py" --rust "$logs/candle_bench.json" --json "$logs/torch_bench.json" \
    2>&1 | tee "$logs/compare_torch.log"
fi
exit "$rc"
