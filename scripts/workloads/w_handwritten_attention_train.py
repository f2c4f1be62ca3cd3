"""GPT-2 small training step at sequence length 2048 with the attention written out by hand, as
nanoGPT's fallback path and many research code bases do: ``(q @ k.transpose(-2, -1)) /
sqrt(d)``, ``masked_fill`` with a registered lower-triangular mask, ``F.softmax``, dropout,
``@ v``. 12 layers, hidden 768, 12 heads, vocabulary 50304 (tied head), dropout 0.1, batch 2 x
2048 tokens, bf16 autocast over fp32 weights, AdamW with PyTorch's default implementation
(foreach on CUDA; 124M parameters).

Each step (fresh random tokens) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``.

Defect: every layer materialises the 2 x 12 x 2048 x 2048 score matrix several times over: the
bf16 scores, the masked copy, the softmax in fp32 (autocast runs softmax in fp32), the dropout
mask and output, the bf16 copy for ``@ v``, and their gradients in the backward: gigabytes of
memory traffic a layer, where the matrix products of the step are a few TFLOP.

    python w_handwritten_attention_train.py [--steps 30] [--fix sdpa] [--fix compile] [--fix fused_adamw]

Fixes:
  sdpa         ``F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)``
               (FlashAttention on the H200): the score matrix never leaves the chip.
  compile      ``torch.compile(model)`` (default mode), the hand-written attention unchanged:
               Inductor fuses the mask, softmax and dropout passes (and may match the pattern
               to its fused attention), forward and backward.
  fused_adamw  ``AdamW(fused=True)``: one pass over the 124M fp32 weights and states instead of
               about ten foreach passes.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import lm_train_step, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("sdpa", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, dropout: float, sdpa: bool) -> None:
        super().__init__()
        self.heads, self.dropout, self.sdpa = heads, dropout, sdpa
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        if not sdpa:
            self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, dropout: float, sdpa: bool) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, seq, dropout, sdpa)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, dropout: float, sdpa: bool) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(d, heads, seq, dropout, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh token
    ids; the step's loss)."""
    vocab, d, heads, layers, batch, seq = 50304, 768, 12, 12, 2, 2048
    if args.small:
        vocab, d, heads, layers, batch, seq = 256, 64, 4, 2, 2, 64
    model = GPT(vocab, d, heads, layers, seq, 0.1, "sdpa" in fixes).to(dev).train()
    return lm_train_step(model, fixes, vocab, batch, seq, dev)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_handwritten_attention_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
