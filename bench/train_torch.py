"""Throughput of the training examples' networks in PyTorch eager, for the ratios in
BENCHMARKS.md: same layers, batch, dtype and optimizer (Adam), cudnn.benchmark on.

- `--model cnn` (default): the train_burn CNN on random 32x32 inputs, lr 1e-3. Prints
  `train_torch dtype=.. batch=..: N images/s`.
- `--model transformer`: the train_transformer encoder classifier (d_model 512, 8 heads,
  d_ff 2048, GELU, post-norm, dropout 0, mean pooling) on random tokens, lr 3e-4. Prints
  `train_torch transformer dtype=.. batch=..: N sequences/s`.

- `--devices N` (CNN): DistributedDataParallel over GPUs 0..N through NCCL, one process per
  GPU, `--batch-size` images per GPU. Prints `train_torch ddp devices=N ..: N images/s`
  (all GPUs together).

    python3 bench/train_torch.py --batch-size 128 --dtype f32 --steps 78 --epochs 3
    python3 bench/train_torch.py --model transformer --batch-size 32 --dtype bf16 --steps 64
    python3 bench/train_torch.py --batch-size 256 --devices 2

- `--first-step`: one training step only, then `first step: X s after start` (the script's
  start, before `import torch`, to the end of the first step): the start-up figure that
  `compare_torch.py` sets beside the Rust `cold_start/*` cases.
"""
import time

STARTED = time.perf_counter()  # before importing torch: the start-up figure includes it

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class ConvBn(nn.Module):
    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class Residual(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.a = ConvBn(cin, cout, 3)
        self.b = ConvBn(cout, cout, 3)
        self.shortcut = ConvBn(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        skip = self.shortcut(x) if self.shortcut is not None else x
        return F.relu(self.b(F.relu(self.a(x))) + skip)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBn(3, 32, 3)
        self.block1 = Residual(32, 32)
        self.block2 = Residual(32, 64)
        self.block3 = Residual(64, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.max_pool2d(self.block1(x), 2)
        x = F.max_pool2d(self.block2(x), 2)
        x = F.adaptive_avg_pool2d(self.block3(x), 1)
        return self.head(x.flatten(1))


class Encoder(nn.Module):
    def __init__(self, vocab=64, seq=256, d_model=512, heads=8, d_ff=2048, layers=4, classes=10):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=False
        )
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, t):
        pos = torch.arange(t.shape[1], device=t.device)
        x = self.tokens(t) + self.positions(pos)[None]
        return self.head(self.layers(x).mean(1))


DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def step(model, opt, x, y):
    """One training step: forward, cross-entropy, backward, Adam."""
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def last_epoch_seconds(model, opt, x, y, epochs, barrier=lambda: None):
    """Trains `epochs` epochs over the batches of `x`/`y`; the seconds of the last one
    (`barrier` runs before and after each epoch: the DDP ranks start and stop together)."""
    seconds = 0.0
    for _epoch in range(epochs):
        barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(len(x)):
            step(model, opt, x[s], y[s])
        torch.cuda.synchronize()
        barrier()
        seconds = time.perf_counter() - t0
    return seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    p.add_argument("--steps", type=int, default=78, help="steps per epoch (train set / batch)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--count-kernels", action="store_true", help="also count the CUDA kernels of one step")
    p.add_argument("--model", choices=["cnn", "transformer"], default="cnn")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--devices", type=int, default=1, help="DDP over this many GPUs (CNN only)")
    p.add_argument(
        "--matmul-tf32",
        action="store_true",
        help="f32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32), the arithmetic of our f32 matmuls",
    )
    p.add_argument("--first-step", action="store_true", help="one step, then the seconds from start to its end")
    a = p.parse_args()
    if a.devices > 1:
        if a.model != "cnn":
            p.error("--devices takes the cnn model only")
        import torch.multiprocessing as mp

        mp.spawn(ddp_worker, args=(a,), nprocs=a.devices, join=True)
        return
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # f32 convolutions in f32, as ours by default
    torch.backends.cuda.matmul.allow_tf32 = a.matmul_tf32
    dtype = DTYPES[a.dtype]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if a.model == "cnn":
        model = Net().to(dev, dtype)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.rand(a.steps, a.batch_size, 3, 32, 32, device=dev, dtype=dtype) - 0.5
    else:
        model = Encoder(seq=a.seq, layers=a.layers).to(dev, dtype)
        opt = torch.optim.Adam(model.parameters(), lr=3e-4)
        x = torch.randint(0, 64, (a.steps, a.batch_size, a.seq), device=dev)
    y = torch.randint(0, 10, (a.steps, a.batch_size), device=dev)
    if a.first_step:
        step(model, opt, x[0], y[0])
        torch.cuda.synchronize()
        print(f"first step: {time.perf_counter() - STARTED:.2f} s after start")
        return
    rate = a.steps * a.batch_size / last_epoch_seconds(model, opt, x, y, a.epochs)
    kernels = ""
    if a.count_kernels:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(model, opt, x[0], y[0])
            torch.cuda.synchronize()
        n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        kernels = f", {n} kernels/step"
    tf32 = ", TF32 matmuls" if a.matmul_tf32 else ""
    if a.model == "cnn":
        print(f"train_torch dtype={a.dtype} batch={a.batch_size}: {rate:.0f} images/s (last of {a.epochs} epochs){kernels}{tf32}")
    else:
        print(
            f"train_torch transformer dtype={a.dtype} batch={a.batch_size}: {rate:.1f} sequences/s "
            f"(last of {a.epochs} epochs){kernels}{tf32}"
        )


def ddp_worker(rank, a):
    """One DDP rank: the CNN on GPU `rank`, gradients averaged through NCCL during backward."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=rank, world_size=a.devices)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    dtype = DTYPES[a.dtype]
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    model = DistributedDataParallel(Net().to(dev, dtype), device_ids=[rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(a.steps, a.batch_size, 3, 32, 32, device=dev, dtype=dtype) - 0.5
    y = torch.randint(0, 10, (a.steps, a.batch_size), device=dev)
    seconds = last_epoch_seconds(model, opt, x, y, a.epochs, barrier=dist.barrier)
    rate = a.devices * a.steps * a.batch_size / seconds
    if rank == 0:
        print(
            f"train_torch ddp devices={a.devices} dtype={a.dtype} batch={a.batch_size} per GPU: "
            f"{rate:.0f} images/s (all GPUs, last of {a.epochs} epochs)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
