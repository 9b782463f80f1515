"""Throughput of the train_burn network (examples/train_burn.rs) in PyTorch, for the ratio
in BENCHMARKS.md: same layers, batch, dtype and optimizer (Adam, lr 1e-3), random 32x32
inputs, cudnn.benchmark on. Prints one line: `train_torch dtype=.. batch=..: N images/s`.

    python3 bench/train_torch.py --batch-size 128 --dtype f32 --steps 78 --epochs 3
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    p.add_argument("--steps", type=int, default=78, help="steps per epoch (train set / batch)")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # f32 convolutions in f32, as ours by default
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = Net().to(dev, dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(a.steps, a.batch_size, 3, 32, 32, device=dev, dtype=dtype) - 0.5
    y = torch.randint(0, 10, (a.steps, a.batch_size), device=dev)
    rate = 0.0
    for _epoch in range(a.epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(a.steps):
            loss = F.cross_entropy(model(x[s]), y[s])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        rate = a.steps * a.batch_size / (time.perf_counter() - t0)
    print(f"train_torch dtype={a.dtype} batch={a.batch_size}: {rate:.0f} images/s (last of {a.epochs} epochs)")


if __name__ == "__main__":
    main()
