#!/usr/bin/env python3
"""Time the cases of a Rust `bench --json out.json` run with PyTorch and print a joined table.

Usage:
    python3 bench/compare_torch.py --rust out.json [--json torch.json] [--only SUBSTRING]

The case list, the number of timed runs, TF32 and the L2 rotation threshold come from the Rust
JSON, so both sides run the same shapes, dtypes and layouts (NHWC = channels_last). PyTorch runs
with torch.backends.cudnn.benchmark = True; TF32 for convolutions and matmuls follows the Rust
run's `allow_tf32`. Each run is timed with a pair of CUDA events (warm-up 5, median of N), the
same as the Rust side. ratio = torch_ms / rust_ms: above 1 means the Rust library is faster.

Needs only torch and the standard library.
"""

import argparse
import json
import math
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

WARMUP = 5
CALLS_PER_RUN = 10  # back-to-back calls per pair of events, as in the Rust bench
ROTATE_SETS = 3
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Cases with no PyTorch counterpart (host-side internals of the Rust library).
RUST_ONLY_KINDS = {"device_check", "handle_acquire", "cache_lookup", "sm_carveout"}


# --------------------------------------------------------------------------------------------
# Helpers


def elem_size(dtype_name):
    return torch.tensor([], dtype=DTYPES[dtype_name]).element_size()


def numel(dims):
    return math.prod(dims)


class Bench:
    """Shared settings: runs, L2 rotation threshold, device."""

    def __init__(self, runs, l2_bytes):
        self.runs = runs
        self.l2_bytes = l2_bytes
        self.device = torch.device("cuda", 0)

    def n_sets(self, set_bytes):
        return ROTATE_SETS if set_bytes <= self.l2_bytes else 1

    def tensor(self, dims, dtype_name, layout, fill="random"):
        """A tensor of logical dims (N, C, H, W for images) in the given layout."""
        dtype = DTYPES[dtype_name]
        fmt = torch.channels_last if (layout == "nhwc" and len(dims) == 4) else torch.contiguous_format
        t = torch.empty(dims, dtype=dtype, device=self.device, memory_format=fmt)
        if fill == "random":
            t.uniform_(-1.0, 1.0)
        else:
            t.zero_()
        return t

    def make_sets(self, specs, dtype_name, layout):
        """specs: list of (dims, fill). Returns a list of sets (lists of tensors); three sets when
        one set fits in L2 (the same rule as the Rust side), else one."""
        set_bytes = sum(numel(d) for d, _ in specs) * elem_size(dtype_name)
        return [
            [self.tensor(d, dtype_name, layout, fill) for d, fill in specs]
            for _ in range(self.n_sets(set_bytes))
        ]

    def time_gpu(self, fn, sets):
        """Warm-up, then the median CUDA-event time (ms) per call over `runs` runs of
        CALLS_PER_RUN back-to-back calls (the same method as the Rust bench)."""
        n = len(sets)
        for i in range(max(WARMUP, n)):
            fn(*sets[i % n])
        torch.cuda.synchronize()
        times = []
        for i in range(self.runs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for k in range(CALLS_PER_RUN):
                fn(*sets[(i * CALLS_PER_RUN + k) % n])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / CALLS_PER_RUN)
        return statistics.median(times)


# --------------------------------------------------------------------------------------------
# Cases. Each returns a dict of torch measurements: median_ms / tflops / gbps / us_per_call.


def conv_dims(sh):
    x = [sh["n"], sh["c"], sh["h"], sh["w"]]
    w = [sh["k"], sh["c"], sh["r"], sh["s"]]
    y = [sh["n"], sh["k"], sh["ho"], sh["wo"]]
    return x, w, y


def conv_flops(sh):
    return 2.0 * sh["n"] * sh["k"] * sh["c"] * sh["r"] * sh["s"] * sh["ho"] * sh["wo"]


def rates(ms, flops=None, nbytes=None):
    return {
        "median_ms": ms,
        "tflops": None if flops is None else flops / (ms * 1e-3) / 1e12,
        "gbps": None if nbytes is None else nbytes / (ms * 1e-3) / 1e9,
    }


def run_conv(b, case):
    sh, kind, dt, layout = case["shape"], case["kind"], case["dtype"], case["layout"]
    x, w, y = conv_dims(sh)
    stride, pad = [sh["stride"]] * 2, [sh["pad"]] * 2
    dil = [1, 1]
    if kind == "conv_fwd":
        sets = b.make_sets([(x, "random"), (w, "random"), (y, "zero")], dt, layout)
        ms = b.time_gpu(lambda xx, ww, _y: F.conv2d(xx, ww, None, stride, pad), sets)
    elif kind == "conv_dgrad":
        # (dy, w, x): x only gives dx its shape and memory format.
        sets = b.make_sets([(y, "random"), (w, "random"), (x, "zero")], dt, layout)

        def dgrad(dy, ww, xx):
            return torch.ops.aten.convolution_backward(
                dy, xx, ww, None, stride, pad, dil, False, [0, 0], 1, [True, False, False]
            )

        ms = b.time_gpu(dgrad, sets)
    elif kind == "conv_wgrad":
        # (x, dy, w): w only gives dw its shape and memory format.
        sets = b.make_sets([(x, "random"), (y, "random"), (w, "zero")], dt, layout)

        def wgrad(xx, dy, ww):
            return torch.ops.aten.convolution_backward(
                dy, xx, ww, None, stride, pad, dil, False, [0, 0], 1, [False, True, False]
            )

        ms = b.time_gpu(wgrad, sets)
    elif kind == "conv_bias_relu":
        specs = [(x, "random"), (w, "random"), ([sh["k"]], "random"), (y, "zero")]
        sets = b.make_sets(specs, dt, layout)
        ms = b.time_gpu(lambda xx, ww, bb, _y: F.relu(F.conv2d(xx, ww, bb, stride, pad)), sets)
    else:
        raise ValueError(f"unknown conv kind {kind}")
    return rates(ms, flops=conv_flops(sh))


def run_matmul(b, case):
    sh, dt = case["shape"], case["dtype"]
    m, n, k = sh["m"], sh["n"], sh["k"]
    sets = b.make_sets([([m, k], "random"), ([k, n], "random"), ([m, n], "zero")], dt, "row_major")
    ms = b.time_gpu(lambda a, bb, _c: torch.matmul(a, bb), sets)
    return rates(ms, flops=2.0 * m * n * k)


def run_sdpa(b, case):
    """PyTorch's cuDNN attention (the same engines) on the same shapes and mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sh, dt = case["shape"], case["dtype"]
    dims = [sh["b"], sh["h"], sh["sq"], sh["d"]]
    kv = [sh["b"], sh["h"], sh["skv"], sh["d"]]
    mask = sh["mask"]
    sets = b.make_sets([(dims, "random"), (kv, "random"), (kv, "random")], dt, "bhsd")
    bias = None
    if mask == "causal_bias":
        sq, skv = sh["sq"], sh["skv"]
        hidden = torch.ones(sq, skv, dtype=torch.bool, device=b.device).triu(skv - sq + 1)
        bias = torch.zeros(1, 1, sq, skv, dtype=DTYPES[dt], device=b.device).masked_fill(hidden, float("-inf"))
    causal = mask == "causal"
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ms = b.time_gpu(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal), sets)
    full = 4.0 * sh["b"] * sh["h"] * sh["sq"] * sh["skv"] * sh["d"]
    return rates(ms, flops=full if mask == "none" else full / 2)


def pool_args(sh):
    return [sh["window"]] * 2, [sh["stride"]] * 2, [sh["pad"]] * 2


def run_pool(b, case):
    sh, kind, dt, layout = case["shape"], case["kind"], case["dtype"], case["layout"]
    mode = sh["mode"]
    x = [sh["n"], sh["c"], sh["h"], sh["w"]]
    y = [sh["n"], sh["c"], sh["ho"], sh["wo"]]
    ksz, st, pad = pool_args(sh)
    include_pad = mode != "avg_exclude_pad"
    es = elem_size(dt)
    xb, yb = numel(x) * es, numel(y) * es
    if kind == "pool_fwd":
        sets = b.make_sets([(x, "random"), (y, "zero")], dt, layout)
        if mode == "max":
            ms = b.time_gpu(lambda xx, _y: F.max_pool2d(xx, ksz, st, pad), sets)
        else:
            ms = b.time_gpu(lambda xx, _y: F.avg_pool2d(xx, ksz, st, pad, False, include_pad), sets)
        return rates(ms, nbytes=xb + yb)
    if mode == "max":
        # Same buffers as the Rust case (x, y, dy, dx); PyTorch's backward reads the forward's
        # indices instead of y.
        sets = b.make_sets([(x, "random"), (y, "zero"), (y, "random"), (x, "zero")], dt, layout)
        for s in sets:
            _, idx = torch.ops.aten.max_pool2d_with_indices(s[0], ksz, st, pad, [1, 1], False)
            s[1] = idx

        def max_bwd(xx, idx, dy, _dx):
            return torch.ops.aten.max_pool2d_with_indices_backward(dy, xx, ksz, st, pad, [1, 1], False, idx)

        ms = b.time_gpu(max_bwd, sets)
        return rates(ms, nbytes=2.0 * (xb + yb))
    sets = b.make_sets([(y, "random"), (x, "zero")], dt, layout)

    def avg_bwd(dy, xx):
        return torch.ops.aten.avg_pool2d_backward(dy, xx, ksz, st, pad, False, include_pad, None)

    ms = b.time_gpu(avg_bwd, sets)
    return rates(ms, nbytes=xb + yb)


def run_host_cost(b, case):
    sh, dt, layout = case["shape"], case["dtype"], case["layout"]
    x, w, _ = conv_dims(sh)
    calls = int(sh.get("calls", 5000))
    xx, ww = b.tensor(x, dt, layout), b.tensor(w, dt, layout)
    stride, pad = [sh["stride"]] * 2, [sh["pad"]] * 2
    for _ in range(100):
        F.conv2d(xx, ww, None, stride, pad)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        F.conv2d(xx, ww, None, stride, pad)
    enqueue = time.perf_counter() - t0
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    print(f"    (incl. final sync {total * 1e6 / calls:.2f} us/call)")
    return {"us_per_call": enqueue * 1e6 / calls}


# The PyTorch twin of each Rust cold-start program: train_torch.py's arguments (quickstart has
# none: its case stays Rust only).
COLD_START_TWINS = {
    "train_burn": ["--model", "cnn", "--batch-size", "128"],
    "train_transformer": ["--model", "transformer", "--batch-size", "32"],
    "train_transformer_bf16": ["--model", "transformer", "--batch-size", "32", "--dtype", "bf16"],
}


def run_cold_start(b, case):
    """`cold_start/<program>/<fresh_cache|warm_cache>`: the wall time of a whole child process
    running one training step of the same network in PyTorch (train_torch.py --first-step),
    with the driver's JIT cache off as on the Rust side. `warm_cache` times a second run after
    an untimed one (the libraries then come from the page cache, as the Rust warm run's do).
    Prints the child's `first step:` line."""
    import os
    import subprocess

    _, program, mode = case["name"].split("/")
    twin = COLD_START_TWINS.get(program)
    if twin is None:
        return None
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_torch.py")
    cmd = [sys.executable, script, *twin, "--steps", "1", "--epochs", "1", "--first-step"]
    env = dict(os.environ, CUDA_CACHE_DISABLE="1")
    runs = 2 if mode == "warm_cache" else 1
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"train_torch.py exited with {done.returncode}: {done.stderr[-400:]}")
    first = [line for line in done.stdout.splitlines() if line.startswith("first step:")]
    print(f"  {case['name']} (torch): process {wall:.2f} s, {first[0] if first else 'no first-step line'}")
    return {"median_ms": wall * 1e3}


def first_calls(shapes, call):
    """Median wall time (ms) of the first call of each never-seen shape, to synchronize."""
    ms = []
    for i in range(shapes):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(i)
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def run_new_shape(b, case):
    """`new_shape/*`: the first call of a never-seen shape, the shapes of the Rust cases, in
    PyTorch's default heuristic mode (cudnn.benchmark off for these: it would autotune every
    new shape, as the Rust side does only in benchmark mode)."""
    import os

    name = case["name"].split("/")[1]
    dev = torch.device("cuda")
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        shapes = int(case["shape"].get("shapes", 9))
        if name == "conv_fprop_f16":
            w = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
            xs = [
                torch.randn(8, 64, hw, hw, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
                for hw in (41 + 3 * i + os.getpid() % 7 for i in range(shapes))
            ]
            return {"median_ms": first_calls(shapes, lambda i: F.conv2d(xs[i], w, None, 1, 1))}
        if name == "matmul_f32":
            w = torch.randn(512, 512, device=dev)
            xs = [torch.randn(1000 + 17 * i + os.getpid() % 13, 512, device=dev) for i in range(shapes)]
            return {"median_ms": first_calls(shapes, lambda i: xs[i] @ w)}
        if name.startswith(("burn_lu_", "burn_det_")):
            # As the Rust case: a warm-up on an 8 x 8 matrix, then the first n x n call.
            op = torch.linalg.det if name.startswith("burn_det_") else torch.linalg.lu
            op(torch.randn(8, 8, device=dev))
            n = int(case["shape"]["n"])
            m = torch.randn(n, n, device=dev)
            torch.cuda.synchronize()
            return {"median_ms": first_calls(1, lambda _: op(m))}
        return None
    finally:
        torch.backends.cudnn.benchmark = benchmark


RUNNERS = {
    "cold_start": run_cold_start,
    "new_shape": run_new_shape,
    "conv_fwd": run_conv,
    "conv_dgrad": run_conv,
    "conv_wgrad": run_conv,
    "conv_bias_relu": run_conv,
    "matmul": run_matmul,
    "sdpa": run_sdpa,
    "pool_fwd": run_pool,
    "pool_bwd": run_pool,
    "host_cost": run_host_cost,
}


# --------------------------------------------------------------------------------------------
# Driver and report


def primary(m):
    """(value, unit) compared between Rust and torch: time in ms, host us/call, or ns."""
    for key, unit in (("median_ms", "ms"), ("us_per_call", "us"), ("ns", "ns")):
        if m.get(key) is not None:
            return m[key], unit
    return None, None


def rate(m):
    if m.get("tflops") is not None:
        return f"{m['tflops']:.2f}"
    if m.get("gbps") is not None:
        return f"{m['gbps']:.1f} GB/s"
    return "-"


def fmt_val(v, unit):
    if v is None:
        return "-"
    return f"{v:.4f}" if unit == "ms" else f"{v:.2f}{unit}"


def configure(rust):
    """cudnn.benchmark on; TF32 for conv and matmul as the Rust run had it."""
    tf32 = bool(rust.get("allow_tf32", False))
    torch.backends.cudnn.benchmark = True
    try:
        torch.backends.cudnn.allow_tf32 = tf32
        # cuDNN's f32 matmul engines compute in TF32 (the Rust side has no IEEE-f32 matmul
        # engine), so compare with TF32 cuBLAS.
        torch.backends.cuda.matmul.allow_tf32 = True
    except Exception:  # newer releases: the fp32_precision API
        precision = "tf32" if tf32 else "ieee"
        torch.backends.cudnn.conv.fp32_precision = precision
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.manual_seed(0)
    return tf32


def run_case(b, case):
    """Returns (torch measurements, error string)."""
    runner = RUNNERS.get(case["kind"])
    if runner is None:
        return None, None
    try:
        return runner(b, case), None
    except Exception as e:  # one failing case must not stop the others
        err = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
        try:
            torch.cuda.synchronize()
        except Exception as sync_err:
            err += f" (sync: {sync_err})"
        return None, err
    finally:
        try:
            torch.cuda.empty_cache()
        except Exception:
            pass


def print_table(rows):
    head = f"{'case':<48} | {'rust ms':>10} | {'torch ms':>10} | {'ratio':>6} | {'rust TFLOP/s':>13} | {'torch TFLOP/s':>13}"
    print()
    print(head)
    print("-" * len(head))
    for case, tm, err in rows:
        rv, unit = primary(case)
        if err is not None:
            print(f"{case['name']:<48} | {fmt_val(rv, unit):>10} | torch ERROR: {err}")
            continue
        if tm is None:
            tv, ratio = None, "-"
        else:
            tv, _ = primary(tm)
            ratio = f"{tv / rv:.3f}" if (rv and tv) else "-"
        rust_rate = rate(case) if case.get("error") is None else "ERROR"
        torch_rate = rate(tm) if tm else "-"
        print(
            f"{case['name']:<48} | {fmt_val(rv, unit):>10} | {fmt_val(tv, unit):>10} | {ratio:>6} | "
            f"{rust_rate:>13} | {torch_rate:>13}"
        )


def geomeans(rows):
    per_kind = {}
    for case, tm, _ in rows:
        rv, _ = primary(case)
        tv = primary(tm)[0] if tm else None
        if rv and tv:
            per_kind.setdefault(case["kind"], []).append(math.log(tv / rv))
    return {k: (math.exp(sum(v) / len(v)), len(v)) for k, v in per_kind.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rust", required=True, help="JSON written by `bench --json`")
    ap.add_argument("--json", help="write the torch results (and ratios) here")
    ap.add_argument("--only", help="only cases whose name contains this substring")
    args = ap.parse_args()

    with open(args.rust) as f:
        rust = json.load(f)
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 0
    warnings.filterwarnings("ignore", category=UserWarning)
    tf32 = configure(rust)
    b = Bench(int(rust.get("runs", 50)), int(rust.get("l2_rotate_bytes", 50 << 20)))
    dev = torch.cuda.get_device_name(0)
    print(f"device            : {dev} (rust run: {rust.get('device')})")
    print(f"torch             : {torch.__version__}, cuDNN {torch.backends.cudnn.version()} "
          f"(rust run: cuDNN {rust.get('cudnn_version')})")
    print(f"cudnn.benchmark   : True (rust benchmark_mode: {rust.get('benchmark_mode')})")
    print(f"TF32              : conv {tf32} (from the rust run's allow_tf32), matmul True (cuDNN's f32 matmul is TF32)")
    print(f"runs              : {b.runs} (warm-up {WARMUP})\n")

    cases = [c for c in rust.get("cases", []) if not args.only or args.only in c["name"]]
    rows = []
    for case in cases:
        if case["kind"] in RUST_ONLY_KINDS:
            rows.append((case, None, None))
            continue
        tm, err = run_case(b, case)
        if err is not None:
            print(f"ERROR {case['name']}: {err}")
        elif tm is not None:
            v, unit = primary(tm)
            print(f"{case['name']:<48} {fmt_val(v, unit):>10} {unit}  {rate(tm)}")
        rows.append((case, tm, err))

    print_table(rows)
    gm = geomeans(rows)
    print("\ngeomean ratio torch/rust (>1: rust faster): " +
          ", ".join(f"{k} {r:.3f} (n={n})" for k, (r, n) in sorted(gm.items())))

    if args.json:
        out_cases = []
        for case, tm, err in rows:
            if case["kind"] in RUST_ONLY_KINDS:
                continue
            tm = tm or {}
            rv, _ = primary(case)
            tv, _ = primary(tm)
            out_cases.append({
                "name": case["name"], "kind": case["kind"], "dtype": case.get("dtype"),
                "layout": case.get("layout"), "shape": case.get("shape"),
                "median_ms": tm.get("median_ms"), "tflops": tm.get("tflops"), "gbps": tm.get("gbps"),
                "us_per_call": tm.get("us_per_call"), "ns": None, "error": err,
                "rust_median_ms": case.get("median_ms"), "rust_us_per_call": case.get("us_per_call"),
                "ratio": (tv / rv) if (rv and tv) else None,
            })
        doc = {
            "device": dev, "torch_version": torch.__version__,
            "cudnn_version": torch.backends.cudnn.version(), "allow_tf32": tf32,
            "benchmark_mode": True, "runs": b.runs,
            "geomean_ratio": {k: r for k, (r, _) in gm.items()}, "cases": out_cases,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
