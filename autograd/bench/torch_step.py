"""PyTorch (CPU) reference for `cargo run --release -p autograd --example step_bench`.

The same GPT-shaped stack and the same ops as examples/gpt/mod.rs: token embedding, pre-norm
blocks (RMSNorm -> fused QKV linear -> RoPE (rotate-half) -> causal SDPA -> output linear ->
residual; RMSNorm -> SwiGLU MLP (gate, up, down) -> residual), final RMSNorm, LM head, mean
cross-entropy; one step = forward + backward + torch.optim.AdamW (PyTorch defaults, lr 1e-3).

    python3 -m venv target/venv-torch && target/venv-torch/bin/pip install torch   # once
    target/venv-torch/bin/python autograd/bench/torch_step.py [--threads 2] [--steps 10] [--warmup 2]
        [--bf16]   # also time torch.autocast("cpu", dtype=torch.bfloat16)

Prints median times (and the fastest step) and tokens/s in the same table format as step_bench.
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(t, d, base):
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    th = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    return th.cos().float(), th.sin().float()


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, d, heads, hidden, eps):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(d, eps)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d, eps)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Gpt(nn.Module):
    def __init__(self, vocab, d, heads, layers, hidden, eps=1e-5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, hidden, eps) for _ in range(layers))
        self.norm = RMSNorm(d, eps)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, targets, cos, sin):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def bench(args, autocast):
    torch.manual_seed(0)
    model = Gpt(args.vocab, args.d_model, args.heads, args.layers, args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1234)
    stream = torch.randint(0, args.vocab, (args.batch * args.seq + 1,), generator=g)
    tokens = stream[:-1].view(args.batch, args.seq)
    targets = stream[1:].view(args.batch, args.seq)
    cos, sin = rope_tables(args.seq, args.d_model // args.heads, 10000.0)
    fwd, bwd, opt_t, step = [], [], [], []
    loss = None
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(tokens, targets, cos, sin)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if i >= args.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            opt_t.append(t3 - t2)
            step.append(t3 - t0)
    n_tok = args.batch * args.seq
    s = statistics.median(step)
    name = "torch-bf16" if autocast else "torch-fp32"
    print(
        f"{name:<11} {1e3 * statistics.median(fwd):>9.1f} {1e3 * statistics.median(bwd):>9.1f} "
        f"{1e3 * statistics.median(opt_t):>9.1f} {1e3 * s:>9.1f} {1e3 * min(step):>9.1f} "
        f"{n_tok / s:>10.0f} {loss.item():>8.4f}"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
        f"SwiGLU {args.hidden}, vocab {args.vocab}, batch {args.batch} x seq {args.seq}, "
        f"{torch.get_num_threads()} threads, AdamW"
    )
    print(
        f"{'policy':<11} {'fwd ms':>9} {'bwd ms':>9} {'optim ms':>9} {'step ms':>9} {'best ms':>9} "
        f"{'tokens/s':>10} {'loss':>8}"
    )
    bench(args, False)
    if args.bf16:
        bench(args, True)


if __name__ == "__main__":
    main()
