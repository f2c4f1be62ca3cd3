"""GPT-2 small training step at sequence length 2048 whose attention calls PyTorch's fused
``F.scaled_dot_product_attention`` with the causal mask passed as a tensor: a lower-triangular
boolean ``attn_mask`` built once and sliced per call, as code ported from a hand-written
attention (or one that also supports padding masks) often does. 12 layers, hidden 768, 12
heads, vocabulary 50304 (tied head), no dropout, batch 4 x 2048 tokens, bf16 autocast over fp32
weights, AdamW with PyTorch's default implementation (foreach on CUDA; 124M parameters).

Each step (fresh random tokens) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``.

Defect: with a mask tensor SDPA cannot use its flash kernels (they take no mask); it runs the
memory-efficient kernels, which read the mask and compute every block of the 2048 x 2048 score
matrix, the half above the diagonal too, forward and backward; ``is_causal=True`` says the
same thing and lets the flash kernels skip the masked half.

    python w_masked_sdpa_train.py [--steps 30] [--fix is_causal] [--fix compile] [--fix fused_adamw]

Fixes:
  is_causal    ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, no mask tensor.
  compile      ``torch.compile(model)`` (default mode), the mask tensor kept.
  fused_adamw  ``AdamW(fused=True)``: one pass over the 124M fp32 weights and states.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import lm_train_step, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("is_causal", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, is_causal: bool) -> None:
        super().__init__()
        self.heads, self.is_causal = heads, is_causal
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        if not is_causal:
            self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if self.is_causal:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T])
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, is_causal: bool) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, seq, is_causal)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, is_causal: bool) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads, seq, is_causal) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh token
    ids; the step's loss)."""
    vocab, d, heads, layers, batch, seq = 50304, 768, 12, 12, 4, 2048
    if args.small:
        vocab, d, heads, layers, batch, seq = 256, 64, 4, 2, 2, 64
    torch.manual_seed(0)
    model = GPT(vocab, d, heads, layers, seq, "is_causal" in fixes).to(dev).train()
    return lm_train_step(model, fixes, vocab, batch, seq, dev)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_masked_sdpa_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
