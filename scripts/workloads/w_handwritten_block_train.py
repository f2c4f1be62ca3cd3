"""Training step of a plain-PyTorch decoder whose norm, gate, dropout and residual are written
out by hand, as in many research code bases: 3 layers, hidden 2048, 16 heads, SwiGLU MLP of
5632, vocabulary 8192, batch 4 x 1024 tokens, bf16 autocast over fp32 weights, AdamW with
PyTorch's default implementation (foreach on CUDA).

RMSNorm is ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w``, the gate
``F.silu(w1(h)) * w3(h)``, residual dropout ``F.dropout(p=0.1)`` then ``x + ...``; attention is
SDPA. Each step (fresh random tokens) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``. GPU-bound: besides ~5 TFLOP of GEMMs, each of those written-out
ops is its own memory-bound pass over a 4096 x 2048 (or x 5632) tensor, forward and backward.

    python w_handwritten_block_train.py [--steps 40] [--fix compile | --fix fused_adamw]

Fixes:
  compile      ``torch.compile(model)`` (default mode): Inductor fuses each norm, gate, dropout
               and residual chain into a few kernels, forward and backward. Compilation (tens
               of seconds the first time on a machine) happens in the first, warm-up steps.
  fused_adamw  ``AdamW(fused=True)``: one pass over the 188M fp32 weights and states instead of
               about ten foreach passes (several ms of HBM traffic a step).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, finish, program_args, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, p_drop: float) -> None:
        super().__init__()
        self.heads, self.p_drop = heads, p_drop
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, ffn, bias=False)  # gate
        self.w3 = nn.Linear(d, ffn, bias=False)  # up
        self.w2 = nn.Linear(ffn, d, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + F.dropout(self.proj(a), self.p_drop, self.training)
        h = self.norm2(x)
        return x + F.dropout(self.w2(F.silu(self.w1(h)) * self.w3(h)), self.p_drop, self.training)


class Decoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, ffn: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn, 0.1) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)

    vocab, d, heads, ffn, layers, batch, seq = 8192, 2048, 16, 5632, 3, 4, 1024
    if args.small:
        vocab, d, heads, ffn, layers, batch, seq = 256, 64, 4, 160, 2, 2, 32
    model = Decoder(vocab, d, heads, ffn, layers, seq).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)
    fwd = torch.compile(model) if "compile" in fixes else model

    for _ in range(args.steps):
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        loss = train_step(lambda: fwd(ids), opt, bf16_autocast(dev))
    finish(dev)
    print(f"w_handwritten_block_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
          f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
