"""Summarizes an Nsight Compute CSV of kernel durations (`--metrics gpu__time_duration.sum
--csv`) over STEPS training steps: kernel time and kernels per step, time by kind of kernel,
and the kernels by total time. Used by scripts/profile-step.sh and scripts/profile-models.sh.

    python3 bench/ncu_summary.py ncu.csv STEPS [KERNELS_ASKED]

KERNELS_ASKED (ncu's --launch-count): a warning when fewer kernels were profiled (the
window ended with the program, so per-step figures are low).
"""
import collections
import csv
import re
import sys

# Unit of ncu's duration column (its spelling depends on ncu's version) in microseconds.
SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
# Kinds of kernel by a substring of the name, first match wins.
KINDS = [
    ("fused_reduce", "fused reduction (ours)"), ("fused", "fused elementwise (ours)"),
    ("nchwtonhwc", "layout transform (cuDNN)"), ("nhwctonchw", "layout transform (cuDNN)"),
    ("transpose", "layout transform"), ("batch_norm", "batch norm"), ("bn_", "batch norm"),
    ("adam", "optimizer"), ("wgrad", "conv wgrad"), ("dgrad", "conv dgrad"), ("fprop", "conv fprop"),
    ("conv", "conv (other)"), ("gemm", "gemm"), ("nvjet", "gemm"), ("matmul", "gemm"), ("pool", "pooling"),
    ("reduce", "reduction"), ("copy", "copy"), ("elementwise", "elementwise"), ("binary", "elementwise"),
    ("unary", "elementwise"),
]


def kind(name):
    low = name.lower()
    return next((k for key, k in KINDS if key in low), "other")


def main():
    path, steps = sys.argv[1], int(sys.argv[2])
    asked = int(sys.argv[3]) if len(sys.argv) > 3 else None
    rows = list(csv.reader(open(path, errors="replace")))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        print("no ncu rows")
        return
    h = rows[head]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    mi = h.index("Metric Name") if "Metric Name" in h else None
    total = collections.defaultdict(float)
    count = collections.Counter()
    kinds = collections.defaultdict(float)
    for r in rows[head + 1:]:
        if len(r) <= vi or not r[vi]:
            continue
        # Only the durations count (a CSV may hold other metrics of each kernel too).
        if mi is not None and r[mi] != "gpu__time_duration.sum":
            continue
        us = float(r[vi].replace(",", "")) * SCALE[r[ui]] / steps
        name = re.sub(r"\(.*", "", r[ki])[:110]
        total[name] += us
        count[name] += 1
        kinds[kind(r[ki])] += us
    seen = sum(count.values())
    print(f"{sum(total.values()) / 1e3:.2f} ms of kernel time per step, {seen // steps} kernels per step")
    if asked is not None and seen < asked:
        print(f"warning: {seen} kernels profiled of {asked} asked: the window ended with the program, "
              "per-step figures are low")
    print("\nby kind (ms per step):")
    for k, v in sorted(kinds.items(), key=lambda t: -t[1]):
        print(f"  {v / 1e3:7.2f}  {k}")
    print("\nkernels (us per step, launches per step):")
    for k, v in sorted(total.items(), key=lambda t: -t[1])[:60]:
        print(f"{v:9.1f} us {count[k] // steps:4d}x  {k}")


if __name__ == "__main__":
    main()
