#!/usr/bin/env bash
# Per-kernel GPU time of one training step: ours under Nsight Compute (kernel durations only),
# PyTorch with its profiler, same network, batch and dtype. Run from the bundle:
# .gpu/profile-step.sh LOG_DIR transformer|cnn DTYPE BATCH
# PROFILE_ARGS adds flags to our program (e.g. "--stock --fusion" for the stock network under
# lazy fusion); ncu.csv keeps every profiled launch in order, with its grid and block sizes.
# PROFILE_SKIP_STEPS (default 2) sets how many steps run before the profiled window: under lazy
# fusion a fused run whose kernel is still loading runs unfused, so a later window shows the
# steady state.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?log dir}"; model="${2:-transformer}"; dtype="${3:-bf16}"; batch="${4:-32}"
mkdir -p "$logs"
skip_steps="${PROFILE_SKIP_STEPS:-2}"
# The window (two steps) ends before the program does: at least 8 steps, 4 beyond the skipped.
steps=$(( skip_steps + 4 > 8 ? skip_steps + 4 : 8 ))
if [[ $model == cnn ]]; then
  ours=("$here/train_burn" --train $((batch * steps)) --test "$batch"); tmodel=cnn
else
  ours=("$here/train_transformer" --train $((batch * steps)) --test "$batch"); tmodel=transformer
fi
read -r -a extra <<<"${PROFILE_ARGS:-}"
ours+=("${extra[@]}")
# The first PROFILE_SKIP_STEPS steps warm up (compiles, plans); about two steps' worth of kernels
# after them are profiled (the summary says how many kernels it saw against the count asked, as
# Nsight counts kernels, not our launches).
per_step=$("${ours[@]}" --dtype "$dtype" --batch-size "$batch" --epochs 1 --out /tmp/profile-out 2>&1 \
    | sed -nE 's/.*, ([0-9]+) launches\/step.*/\1/p')
skip=$((per_step * skip_steps + 50)); count=$((per_step * 2))
ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$skip" --launch-count "$count" \
    "${ours[@]}" --dtype "$dtype" --batch-size "$batch" --epochs 1 --out /tmp/profile-out > "$logs/ncu.csv" 2> "$logs/ncu.err"
PYTHONUNBUFFERED=1 python3 - "$here/train_torch.py" "$tmodel" "$dtype" "$batch" > "$logs/torch-profile.txt" 2>&1 <<'PY'
import sys, runpy, torch
path, model, dtype, batch = sys.argv[1:5]
sys.argv = [path, "--model", model, "--dtype", dtype, "--batch-size", batch, "--steps", "4", "--epochs", "1"]
mod = runpy.run_path(path, run_name="not_main")
import torch.nn.functional as F
dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
torch.backends.cudnn.benchmark = True
# f32 convolutions in f32, as in train_torch.py's rows and ours by default (PyTorch's default is TF32).
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
b = int(batch)
if model == "cnn":
    net = mod["Net"]().to(dev, dt); x = torch.rand(b, 3, 32, 32, device=dev, dtype=dt) - 0.5; lr = 1e-3
else:
    net = mod["Encoder"]().to(dev, dt); x = torch.randint(0, 64, (b, 256), device=dev); lr = 3e-4
y = torch.randint(0, 10, (b,), device=dev)
opt = torch.optim.Adam(net.parameters(), lr=lr)
def step():
    loss = F.cross_entropy(net(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
for _ in range(3): step()
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    step(); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90))
PY
python3 "$here/ncu_summary.py" "$logs/ncu.csv" 2 "$count"
