#!/usr/bin/env bash
# Per-kernel GPU time of training steps of a standard model: ours under Nsight Compute
# (kernel durations of the last PROFILE_STEPS steps, chosen by train_models' --profile-steps),
# PyTorch with its profiler (one step per setting). Run from the bundle:
# .gpu/profile-models.sh LOG_DIR [MODEL DTYPE BATCH]
# PROFILE_VARIANTS (default "stock-fusion fused-fusion") and PROFILE_TORCH (default "default
# tuned") pick the runs; PROFILE_ENV adds environment settings to ours. Writes ncu-VARIANT.csv,
# ncu-VARIANT.txt (kernels by total time) and torch-SETTING.txt.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?log dir}"; model="${2:-resnet50}"; dtype="${3:-bf16}"; batch="${4:-64}"
mkdir -p "$logs"
psteps="${PROFILE_STEPS:-2}"
read -r -a ours_env <<<"${PROFILE_ENV:-}"
for v in ${PROFILE_VARIANTS:-stock-fusion fused-fusion}; do
  flags=(--benchmark)
  case $v in
    stock) flags+=(--stock) ;;
    stock-fusion) flags+=(--stock --fusion) ;;
    fused-fusion) flags+=(--fusion) ;;
  esac
  env "${ours_env[@]}" ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    "$here/train_models" --model "$model" --dtype "$dtype" --batch-size "$batch" --steps $((psteps + 4)) --epochs 1 \
    --profile-steps "$psteps" "${flags[@]}" >"$logs/ncu-$v.csv" 2>"$logs/ncu-$v.err"
  python3 - "$logs/ncu-$v.csv" "$psteps" >"$logs/ncu-$v.txt" <<'PY'
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
steps = int(sys.argv[2])
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print("no ncu rows"); sys.exit()
h = rows[head]; ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
tot = collections.defaultdict(float); n = collections.Counter(); cat = collections.defaultdict(float)
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
def category(name):
    l = name.lower()
    for key, c in [("fused_reduce", "fused reduction (ours)"), ("fused", "fused elementwise (ours)"),
                   ("nchwtonhwc", "layout transform (cuDNN)"), ("nhwctonchw", "layout transform (cuDNN)"),
                   ("transpose", "layout transform"), ("batch_norm", "batch norm (ours)"), ("bn_", "batch norm"),
                   ("adam", "optimizer"), ("wgrad", "conv wgrad"), ("dgrad", "conv dgrad"), ("fprop", "conv fprop"),
                   ("conv", "conv (other)"), ("gemm", "gemm"), ("nvjet", "gemm"), ("pool", "pooling"),
                   ("reduce", "reduction"), ("copy", "copy"), ("elementwise", "elementwise")]:
        if key in l:
            return c
    return "other"
for r in rows[head + 1:]:
    if len(r) <= vi or not r[vi]:
        continue
    us = float(r[vi].replace(",", "")) * scale[r[ui]] / steps
    name = re.sub(r"\(.*", "", r[ki])[:110]
    tot[name] += us; n[name] += 1; cat[category(r[ki])] += us
total = sum(tot.values())
print(f"{total / 1e3:.2f} ms of kernel time per step, {sum(n.values()) // steps} kernels per step")
print("\nby category (ms per step):")
for c, v in sorted(cat.items(), key=lambda t: -t[1]):
    print(f"  {v / 1e3:7.2f}  {c}")
print("\nkernels (us per step, launches per step):")
for k, v in sorted(tot.items(), key=lambda t: -t[1])[:60]:
    print(f"{v:9.1f} us {n[k] // steps:4d}x  {k}")
PY
done
for s in ${PROFILE_TORCH:-default tuned}; do
  PYTHONUNBUFFERED=1 python3 "$here/train_models_torch.py" --model "$model" --setting "$s" --dtype "$dtype" \
    --batch-size "$batch" --steps 5 --epochs 1 --profile "$logs/torch-$s.txt" >"$logs/torch-$s.log" 2>&1
done
for v in ${PROFILE_VARIANTS:-stock-fusion fused-fusion}; do echo "== ours $v"; head -22 "$logs/ncu-$v.txt"; done
for s in ${PROFILE_TORCH:-default tuned}; do echo "== torch $s"; grep -E 'Self CUDA time total|^train_models_torch' "$logs/torch-$s.txt" "$logs/torch-$s.log"; done
