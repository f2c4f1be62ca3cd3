"""Training step of a small mixture-of-experts language model: 4 pre-norm transformer blocks
(hidden 1024, 16 heads, SDPA causal attention) whose feed-forward is a top-2 mixture of 16
expert MLPs (1024-2048-1024, GELU), a softmax router with the Switch load-balancing loss,
vocabulary 32768, batch 8 x 1024 tokens, bf16 autocast over fp32 weights, AdamW with PyTorch's
default implementation (foreach on CUDA; 290M parameters).

The tokens are routed the way most first MoE implementations (and HF's Mixtral) do it: per
expert ``tok, slot = (topk_idx == e).nonzero(as_tuple=True)``, ``x.index_select``, the
expert's MLP, and ``out.index_add_`` back, weighted by the router's probability.

Each step (fresh random tokens) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``.

Defects: each ``nonzero`` makes the CPU wait for the GPU (16 experts x 4 layers = 64 waits in
every forward), after which the next expert's dozen small launches start from an empty queue;
the experts' GEMMs are small (about 1k tokens each) and their shapes change every step, so the
forward crawls at the CPU's pace and the CPU never gets ahead of the GPU.

    python w_moe_routing_train.py [--steps 30] [--fix capacity] [--fix compile] [--fix fused_adamw]

Fixes:
  capacity     fixed expert capacity (1.25 x tokens x 2 / 16 slots an expert): each token's
               slot in its expert computed on the GPU (a one-hot cumulative sum), the tokens
               scattered into a padded [16, capacity, 1024] buffer, the experts run as two
               ``torch.baddbmm`` over stacked weights, the results gathered back. No
               ``nonzero``, no wait, static shapes; tokens over capacity are dropped (few, with
               a random router), and the padding costs up to 25% more expert FLOPs.
  compile      ``torch.compile(model)`` (default mode), the routing loop unchanged: Dynamo
               cannot trace ``nonzero`` and the loop around it runs eagerly, the rest
               (attention, norms, each expert's MLP with dynamic shapes) compiled.
  fused_adamw  ``AdamW(fused=True)``: one pass over the 290M fp32 weights and states instead of
               about ten foreach passes.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("capacity", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
TOP_K, CAPACITY_FACTOR, AUX_WEIGHT = 2, 1.25, 0.01


class Expert(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """Top-2 MoE: per-expert ``nonzero`` routing, or (``capacity``) a padded batched dispatch."""

    def __init__(self, d: int, ffn: int, experts: int, capacity: bool) -> None:
        super().__init__()
        self.e, self.capacity = experts, capacity
        self.router = nn.Linear(d, experts, bias=False)
        if capacity:  # the same experts, their weights stacked for torch.baddbmm
            # nn.Linear's default init range, per expert
            self.w1 = nn.Parameter(torch.empty(experts, d, ffn).uniform_(-d ** -0.5, d ** -0.5))
            self.b1 = nn.Parameter(torch.empty(experts, 1, ffn).uniform_(-d ** -0.5, d ** -0.5))
            self.w2 = nn.Parameter(torch.empty(experts, ffn, d).uniform_(-ffn ** -0.5, ffn ** -0.5))
            self.b2 = nn.Parameter(torch.empty(experts, 1, d).uniform_(-ffn ** -0.5, ffn ** -0.5))
        else:
            self.experts = nn.ModuleList(Expert(d, ffn) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t, d = x.shape
        probs = self.router(x).float().softmax(-1)                       # [T, E]
        topw, topi = probs.topk(TOP_K, dim=-1)
        topw = (topw / topw.sum(-1, keepdim=True)).to(x.dtype)
        # Switch load-balancing loss: fraction of tokens routed to each expert x mean router prob
        frac = F.one_hot(topi[:, 0], self.e).float().mean(0)
        aux = self.e * (frac * probs.mean(0)).sum()
        if not self.capacity:
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                tok, slot = (topi == e).nonzero(as_tuple=True)          # waits for the GPU
                if tok.numel() == 0:
                    continue
                y = expert(x.index_select(0, tok)) * topw[tok, slot, None]
                out.index_add_(0, tok, y.to(out.dtype))
            return out, aux
        cap = math.ceil(CAPACITY_FACTOR * t * TOP_K / self.e)
        flat_e = topi.t().reshape(-1)                                  # first choices first
        onehot = F.one_hot(flat_e, self.e)
        pos = ((onehot.cumsum(0) - 1) * onehot).sum(-1)                # rank within its expert
        keep = pos < cap
        dest = torch.where(keep, flat_e * cap + pos, self.e * cap)     # dropped -> a spare row
        src = x.repeat(TOP_K, 1)
        buf = x.new_zeros(self.e * cap + 1, d).index_copy(0, dest, src)
        h = buf[:-1].view(self.e, cap, d)
        h = F.gelu(torch.baddbmm(self.b1, h, self.w1))                # all experts at once
        y = torch.baddbmm(self.b2, h, self.w2).view(self.e * cap, d)
        y = torch.cat([y, y.new_zeros(1, d)])[dest]                   # dropped ones get zeros
        w = topw.t().reshape(-1, 1) * keep.unsqueeze(1)
        return (y * w).view(TOP_K, t, d).sum(0), aux


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, experts: int, capacity: bool) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.moe = MoE(d, ffn, experts, capacity)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        y, aux = self.moe(self.ln2(x).view(b * s, d))
        return x + y.view(b, s, d), aux


class MoELM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, ffn: int, experts: int, layers: int, seq: int,
                 capacity: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn, experts, capacity) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        aux_total = x.new_zeros(())
        for blk in self.blocks:
            x, aux = blk(x)
            aux_total = aux_total + aux
        logits = self.head(self.ln(x))
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        return loss + AUX_WEIGHT * aux_total


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh token
    ids; the step's loss)."""
    vocab, d, heads, ffn, experts, layers, batch, seq = 32768, 1024, 16, 2048, 16, 4, 8, 1024
    if args.small:
        vocab, d, heads, ffn, experts, layers, batch, seq = 256, 32, 4, 64, 4, 2, 2, 16
    model = MoELM(vocab, d, heads, ffn, experts, layers, seq, "capacity" in fixes).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev)

    def step() -> torch.Tensor:
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        return train_step(lambda: fwd(ids), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_moe_routing_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
