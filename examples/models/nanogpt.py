"""A nanoGPT-size transformer on the simulated device, eager and compiled, forward and backward.

6 layers, d_model 384, 6 heads, sequence 256, vocabulary 512, batch 2 -- the size of the
classic character-level nanoGPT. One training step (forward, loss, backward, AdamW) is
profiled end to end; the top ops by modeled device time are printed.

Run: python examples/models/nanogpt.py [--mode eager|compiled] [--device sim|cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=512, d=384, layers=6, heads=6, seq=256):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--device", choices=("sim", "cpu", "cuda"), default="sim")
    parser.add_argument("--out", default="profile_out/nanogpt")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    from tilescope.profiler import profile

    if args.device == "sim":
        import tilescope.device

        tilescope.device.register()
        tilescope.device.configure(clock="virtual")
    torch.manual_seed(0)
    model = GPT().to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    idx = torch.randint(0, 512, (args.batch, 256)).to(args.device)
    target = torch.randint(0, 512, (args.batch, 256)).to(args.device)
    step_fn = model if args.mode == "eager" else torch.compile(model, backend="tilescope" if args.device == "sim" else "inductor")

    def step():
        logits = step_fn(idx)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(2):  # warm-up: builds every Program (and compiles); the optimizer's first
        step()  # step makes its state and takes another path than the profiled one
    sync = {"sim": lambda: torch.sim.synchronize(), "cuda": torch.cuda.synchronize}.get(args.device, lambda: None)
    sync()
    warm = time.perf_counter() - t0
    with profile(f"{args.out}_{args.mode}_{args.device}", device=args.device) as prof:
        loss = step()
    label = "modeled" if args.device == "sim" else f"measured on {args.device}"
    print(f"nanoGPT {args.mode} on {args.device}: loss {loss.item():.4f}; warm-up (2 steps) {warm:.1f} s wall")
    print(f"top ops by self device time ({label}):")
    sort = "self_device_time_total" if args.device != "cpu" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=15))
    print(f"profile: {prof.profile_dir}")


if __name__ == "__main__":
    main()
