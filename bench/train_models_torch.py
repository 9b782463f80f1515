"""PyTorch's side of the model table in BENCHMARKS.md: the models `train_models` trains, with the
same architecture, initialization, optimizer, batch, dtype (the whole model cast, as ours: no
autocast) and synthetic data made on the device (`--data` batches, cycled, so the loss falls):

- `resnet50`: torchvision's ResNet-50 (v1.5) and its initialization; Adam, lr 1e-3; batch 64 of
  normal 224x224 images with uniform labels.
- `gpt2`: GPT-2 small (124M): 12 pre-norm layers, d 768, 12 heads, MLP 3072, GELU, causal
  self-attention, 1024 learned positions, vocabulary 50,257, tied input/output embeddings,
  final layer norm, dropout 0 (as in GPT-2-style pretraining benchmarks); batch 8 of uniform
  random tokens, next-token cross-entropy over every position.
- `vit_b16`: ViT-B/16 (86M): 16x16 patches by a stride-16 convolution, class token, 197
  learned positions, 12 pre-norm layers as above, final layer norm, a 1000-class head on the
  class token, dropout 0; batch 64 as for ResNet.
- `bert_base`: BERT-base masked LM (110M, no segment embeddings): token and position
  embeddings with layer norm and dropout, 12 post-norm layers, dropout 0.1, key padding masks,
  the MLM head (dense, GELU, layer norm, tied decoder plus bias) on the masked positions only
  (gathered before the head); batch 16 of 512 tokens padded after lengths uniform over
  384..512, 15 % of the non-pad positions replaced by a mask token and predicted.

The transformers initialize every linear, convolution and embedding weight (and the class
token and positions) normal(0, 0.02), biases zero, layer norms 1/0, and train with AdamW (lr
1e-4, weight decay 0.01, epsilon 1e-8). Layers are written by hand as PyTorch users write them
(nanoGPT, timm): one packed qkv projection (the same function and parameter count as Burn's
separate query/key/value projections) and `F.scaled_dot_product_attention` with `is_causal`
(GPT-2) or a boolean key padding mask and `dropout_p` (BERT). PyTorch drops attention
weights after the softmax; Burn's `MultiHeadAttention` drops the scores before it (same
cost, a different regularizer). GELU is the exact one on both sides. Layer norm epsilon:
GPT-2 1e-5, ViT 1e-6, BERT 1e-12.

Settings, as a PyTorch user runs them:

- `default`: PyTorch's defaults (NCHW, `Adam`/`AdamW` on their foreach path, TF32 for f32
  convolutions and IEEE f32 matmuls), with `cudnn.benchmark` on as on our side.
- `tuned`: `channels_last`, `Adam(fused=True)`/`AdamW(fused=True)`, TF32 for f32 convolutions
  and matmuls.
- `compile`: `tuned` with the model under `torch.compile` (default mode).
- `compile-ro`: the same with `mode="reduce-overhead"` (CUDA graphs).

Prints `train_models_torch MODEL SETTING dtype=.. batch=..: N images/s ...` (tokens/s for the
language models, counting every position of the padded sequences) and the same as one JSON
object, with `unit`, `images_per_s` or `tokens_per_s`, and `params` (the model's parameter
count, tied weights once). `first_step_s` is the seconds from the script's start (before
`import torch`) to the end of the first step (compiles included). BERT's batches differ in
their number of masked positions: `torch.compile` recompiles for a dynamic size within the
first epoch (the timed epoch is the last). `--profile FILE` writes the
per-kernel GPU time of one step after the timed epochs (torch.profiler).

    python3 bench/train_models_torch.py --model resnet50 --setting tuned --dtype bf16 --batch-size 64
    python3 bench/train_models_torch.py --model gpt2 --setting tuned --dtype bf16
"""
import time

STARTED = time.perf_counter()  # before importing torch: the first-step figure includes it

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
INIT_STD = 0.02  # GPT-2's, ViT's and BERT's initializer range
PAD, MASK, FIRST_TOKEN, MASK_RATE = 0, 1, 2, 0.15  # BERT's synthetic batches, as ours


class Attention(nn.Module):
    """Multi-head self-attention: packed qkv projection, SDPA, output projection."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, causal=False, key_pad=None):
        n, s, d = x.shape
        q, k, v = self.qkv(x).view(n, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # Boolean SDPA masks are True where attention is allowed.
        mask = None if key_pad is None else ~key_pad[:, None, None, :]
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        return self.out(o.transpose(1, 2).reshape(n, s, d))


class Layer(nn.Module):
    """A transformer layer: attention and MLP residual branches with dropout, layer norms
    before (pre-norm) or after (post-norm, BERT) each residual add."""

    def __init__(self, d, heads, ff, dropout, eps, pre_norm):
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = Attention(d, heads, dropout)
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))
        self.norm2 = nn.LayerNorm(d, eps=eps)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, causal=False, key_pad=None):
        if self.pre_norm:
            x = x + self.drop(self.attn(self.norm1(x), causal, key_pad))
            return x + self.drop(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, causal, key_pad)))
        return self.norm2(x + self.drop(self.mlp(x)))


def layers(n, d=768, heads=12, ff=3072, dropout=0.0, eps=1e-5, pre_norm=True):
    return nn.ModuleList(Layer(d, heads, ff, dropout, eps, pre_norm) for _ in range(n))


class GPT2(nn.Module):
    """GPT-2 small: tied embeddings, pre-norm, causal, dropout 0."""

    def __init__(self, vocab=50_257, seq=1024, d=768, n_layers=12):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(seq, d)
        self.layers = layers(n_layers, d, eps=1e-5)
        self.norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, inputs, targets):
        """The mean next-token cross-entropy (the loss inside forward, as nanoGPT)."""
        x = self.tokens(inputs) + self.positions(torch.arange(inputs.shape[1], device=inputs.device))
        for layer in self.layers:
            x = layer(x, causal=True)
        logits = F.linear(self.norm(x), self.tokens.weight)  # tied: h . E^T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)


class ViT(nn.Module):
    """ViT-B/16: patch convolution, class token, learned positions, pre-norm, dropout 0."""

    def __init__(self, image=224, patch=16, d=768, n_layers=12, classes=1000):
        super().__init__()
        self.patches = nn.Conv2d(3, d, patch, stride=patch)
        self.class_token = nn.Parameter(torch.empty(1, 1, d))
        self.positions = nn.Parameter(torch.empty(1, (image // patch) ** 2 + 1, d))
        self.layers = layers(n_layers, d, eps=1e-6)
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


class BertMLM(nn.Module):
    """BERT-base masked LM: post-norm, dropout 0.1, padding masks, tied MLM decoder."""

    def __init__(self, vocab=30_522, seq=512, d=768, n_layers=12, dropout=0.1):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(seq, d)
        self.embedding_norm = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = layers(n_layers, d, dropout=dropout, eps=1e-12, pre_norm=False)
        self.head_dense = nn.Linear(d, d)
        self.head_norm = nn.LayerNorm(d, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids, pad, positions, targets):
        """The mean cross-entropy at the masked positions (the loss inside forward)."""
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        x = self.drop(self.embedding_norm(x))
        for layer in self.layers:
            x = layer(x, key_pad=pad)
        h = x.reshape(-1, x.shape[-1])[positions]  # the masked positions only
        h = self.head_norm(F.gelu(self.head_dense(h)))
        return F.cross_entropy(F.linear(h, self.tokens.weight, self.decoder_bias), targets)


def resnet50():
    """torchvision's ResNet-50 with its own initialization."""
    import torchvision

    return torchvision.models.resnet50(weights=None, num_classes=1000)


def init_transformer(model):
    """GPT-2/ViT/BERT initialization: weights and embeddings normal(0, 0.02), biases 0,
    layer norms 1/0 (PyTorch's default)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=INIT_STD)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=INIT_STD)
    if isinstance(model, ViT):
        nn.init.normal_(model.class_token, std=INIT_STD)
        nn.init.normal_(model.positions, std=INIT_STD)


# name: (constructor, default batch, default lr, unit, tokens per sample)
MODELS = {
    "resnet50": (resnet50, 64, 1e-3, "images", 1),
    "gpt2": (GPT2, 8, 1e-4, "tokens", 1024),
    "vit_b16": (ViT, 64, 1e-4, "images", 1),
    "bert_base": (BertMLM, 16, 1e-4, "tokens", 512),
}


def synthetic_batch(name, n, dev, dtype, fmt):
    """One batch of the scheme `train_models` uses, drawn on the device."""
    if name in ("resnet50", "vit_b16"):
        images = torch.randn(n, 3, 224, 224, device=dev, dtype=dtype).contiguous(memory_format=fmt)
        return images, torch.randint(0, 1000, (n,), device=dev)
    if name == "gpt2":
        tokens = torch.randint(0, 50_257, (n, 1025), device=dev)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1).contiguous()
    seq, vocab = 512, 30_522
    tokens = torch.randint(FIRST_TOKEN, vocab, (n, seq), device=dev)
    lengths = torch.randint(384, seq + 1, (n,), device=dev)
    pad = torch.arange(seq, device=dev)[None, :] >= lengths[:, None]
    chosen = (torch.rand(n, seq, device=dev) < MASK_RATE) & ~pad
    positions = chosen.flatten().nonzero().squeeze(1)
    targets = tokens.flatten()[positions]
    ids = tokens.masked_fill(pad, PAD).masked_fill(chosen, MASK)
    return ids, pad, positions, targets


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=list(MODELS), default="resnet50")
    p.add_argument("--setting", choices=["default", "tuned", "compile", "compile-ro"], default="default")
    p.add_argument("--dtype", choices=list(DTYPES), default="f32")
    p.add_argument("--batch-size", type=int, help="default: the model's (resnet50 64, gpt2 8, vit_b16 64, bert_base 16)")
    p.add_argument("--steps", type=int, default=30, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=3, help="the rate is the last epoch's")
    p.add_argument("--data", type=int, default=4, help="distinct synthetic batches")
    p.add_argument("--lr", type=float, help="default: 1e-3 for resnet50, 1e-4 for the transformers")
    p.add_argument("--profile", help="write one step's per-kernel GPU time here")
    a = p.parse_args()
    make, batch_size, lr, unit, per_sample = MODELS[a.model]
    batch_size = a.batch_size or batch_size
    lr = a.lr or lr
    tuned = a.setting != "default"
    torch.backends.cudnn.benchmark = True
    # f32 convolutions run TF32 by PyTorch's default; matmuls only when tuned.
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = tuned
    dtype = DTYPES[a.dtype]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = make()
    if a.model != "resnet50":
        init_transformer(model)
    model = model.to(dev, dtype)
    fmt = torch.channels_last if tuned else torch.contiguous_format
    model = model.to(memory_format=fmt)
    params = sum(q.numel() for q in model.parameters())
    fused = True if tuned else None
    if a.model == "resnet50":
        opt = torch.optim.Adam(model.parameters(), lr=lr, fused=fused)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=fused)
    net = model
    if a.setting == "compile":
        net = torch.compile(model)
    elif a.setting == "compile-ro":
        net = torch.compile(model, mode="reduce-overhead")
    batches = [synthetic_batch(a.model, batch_size, dev, dtype, fmt) for _ in range(a.data)]

    def loss_of(batch):
        # The image models return logits; the language models their loss.
        if a.model in ("resnet50", "vit_b16"):
            images, labels = batch
            return F.cross_entropy(net(images), labels)
        return net(*batch)

    def step(i):
        loss = loss_of(batches[i % a.data])
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
        rate = a.steps * batch_size * per_sample / seconds
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
        f"train_models_torch {a.model} {a.setting} dtype={a.dtype} batch={batch_size}: loss {loss_first:.4f} -> "
        f"{loss_last:.4f}, {rate:.1f} {unit}/s, {ms:.2f} ms/step, first step {first_step_s:.2f} s, "
        f"{params} parameters"
    )
    print(
        json.dumps(
            {
                "model": a.model,
                "setting": a.setting,
                "dtype": a.dtype,
                "batch": batch_size,
                "unit": unit,
                f"{unit}_per_s": round(rate, 2),
                "ms_per_step": round(ms, 3),
                "first_step_s": round(first_step_s, 3),
                "kernels_per_step": kernels,
                "loss_first": round(loss_first, 5),
                "loss_last": round(loss_last, 5),
                "params": params,
            }
        )
    )


if __name__ == "__main__":
    main()
