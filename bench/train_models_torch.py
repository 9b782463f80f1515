"""PyTorch's side of the model table in BENCHMARKS.md: the model `train_models` trains, same
architecture (torchvision's), initialization, optimizer (Adam, lr 1e-3), batch, dtype (the whole
model cast, as ours: no autocast) and synthetic data (`--data` normal batches made on the
device, uniform labels), in one of the settings a PyTorch user runs:

- `default`: PyTorch's defaults (NCHW, `Adam` on its foreach path, TF32 for f32 convolutions and
  IEEE f32 matmuls), with `cudnn.benchmark` on as on our side.
- `tuned`: `channels_last`, `Adam(fused=True)`, TF32 for f32 convolutions and matmuls.
- `compile`: `tuned` with the model under `torch.compile` (default mode).
- `compile-ro`: the same with `mode="reduce-overhead"` (CUDA graphs).

Prints `train_models_torch MODEL SETTING dtype=.. batch=..: N images/s ...` and the same as one
JSON object. `--first-step` reports the seconds from the script's start (before `import torch`)
to the end of the first step (compiles included). `--profile FILE` writes the per-kernel GPU
time of one step after the timed epochs (torch.profiler).

    python3 bench/train_models_torch.py --model resnet50 --setting tuned --dtype bf16 --batch-size 64
"""
import time

STARTED = time.perf_counter()  # before importing torch: the first-step figure includes it

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def build(model_name, classes):
    """The model, with its own initialization."""
    if model_name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None, num_classes=classes)
    raise SystemExit(f"unknown model {model_name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--setting", choices=["default", "tuned", "compile", "compile-ro"], default="default")
    p.add_argument("--dtype", choices=list(DTYPES), default="f32")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=30, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=3, help="the rate is the last epoch's")
    p.add_argument("--data", type=int, default=4, help="distinct synthetic batches")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--profile", help="write one step's per-kernel GPU time here")
    a = p.parse_args()
    tuned = a.setting != "default"
    torch.backends.cudnn.benchmark = True
    # f32 convolutions run TF32 by PyTorch's default; matmuls only when tuned.
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = tuned
    dtype = DTYPES[a.dtype]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    classes = 1000
    model = build(a.model, classes).to(dev, dtype)
    fmt = torch.channels_last if tuned else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, fused=True if tuned else None)
    net = model
    if a.setting == "compile":
        net = torch.compile(model)
    elif a.setting == "compile-ro":
        net = torch.compile(model, mode="reduce-overhead")
    xs = [torch.randn(a.batch_size, 3, 224, 224, device=dev, dtype=dtype).contiguous(memory_format=fmt) for _ in range(a.data)]
    ys = [torch.randint(0, classes, (a.batch_size,), device=dev) for _ in range(a.data)]

    def step(i):
        loss = F.cross_entropy(net(xs[i % a.data]), ys[i % a.data])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    first = step(0)
    torch.cuda.synchronize()
    first_step_s = time.perf_counter() - STARTED
    loss_first = float(first)
    i, rate, ms, loss_last = 1, 0.0, 0.0, 0.0
    for _epoch in range(a.epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = torch.zeros((), device=dev, dtype=torch.float32)
        for _ in range(a.steps):
            total += step(i).float()
            i += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rate = a.steps * a.batch_size / seconds
        ms = 1e3 * seconds / a.steps
        loss_last = float(total) / a.steps
    kernels = 0
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(i)
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        with open(a.profile, "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=100))
    print(
        f"train_models_torch {a.model} {a.setting} dtype={a.dtype} batch={a.batch_size}: loss {loss_first:.4f} -> "
        f"{loss_last:.4f}, {rate:.1f} images/s, {ms:.2f} ms/step, first step {first_step_s:.2f} s"
    )
    print(
        json.dumps(
            {
                "model": a.model,
                "setting": a.setting,
                "dtype": a.dtype,
                "batch": a.batch_size,
                "images_per_s": round(rate, 2),
                "ms_per_step": round(ms, 3),
                "first_step_s": round(first_step_s, 3),
                "kernels_per_step": kernels,
                "loss_first": round(loss_first, 5),
                "loss_last": round(loss_last, 5),
            }
        )
    )


if __name__ == "__main__":
    main()
