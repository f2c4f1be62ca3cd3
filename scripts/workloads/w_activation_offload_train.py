"""Training a GPT-style decoder with its saved activations offloaded to host memory
(``torch.autograd.graph.save_on_cpu()``, ``pin_memory`` left at its default, False), as a
training script copied from a larger model's memory-saving recipe does: 6 blocks of width 768
(12 heads, causal SDPA, GELU MLP), a vocabulary of 8,192, batches of 4 x 256 tokens, fp32, AdamW.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: every tensor autograd saves for the backward (the activations, and each Linear's weight)
is copied in the forward to freshly allocated pageable host memory, synchronously, and copied
back in the backward: about 0.5 GB each way a step at pageable copy rates, while the model's own
arithmetic is a few milliseconds. The activations would fit on the GPU many times over.

    python w_activation_offload_train.py [--steps 30] [--fix pinned|checkpoint|no_offload] [--fix bf16]

Fixes:
  pinned      ``save_on_cpu(pin_memory=True)``: the same offload, through pinned host buffers.
  checkpoint  no offload; each block under ``torch.utils.checkpoint`` (its forward run again in the
              backward): the memory saving kept, no copies.
  no_offload  no offload: the saved tensors stay on the GPU.
  bf16        bf16 autocast around the forward (the offload kept: most saved tensors half the bytes).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402

FIXES = ("pinned", "checkpoint", "no_offload", "bf16")
CUDA_ONLY = ("pinned",)
ALTERNATIVES = (("pinned", "checkpoint"), ("pinned", "no_offload"), ("checkpoint", "no_offload"))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, ckpt: bool = False) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.ckpt = ckpt

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def offload(fixes: set[str]) -> Callable[[], contextlib.AbstractContextManager]:
    """Where the forward's saved tensors go: host memory (pageable, or pinned with ``pinned``),
    or, with ``checkpoint`` or ``no_offload``, nowhere (they stay on the GPU)."""
    if fixes & {"checkpoint", "no_offload"}:
        return contextlib.nullcontext
    return lambda: torch.autograd.graph.save_on_cpu(pin_memory="pinned" in fixes)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The training step with ``fixes`` applied; returns the step's loss."""
    vocab, d, heads, layers, batch, seq = 8192, 768, 12, 6, 4, 256
    if args.small:
        vocab, d, heads, layers, batch, seq = 64, 32, 4, 2, 2, 16
    torch.manual_seed(0)
    model = Decoder(vocab, d, heads, layers, seq, ckpt="checkpoint" in fixes).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    amp, where = bf16_autocast(dev, "bf16" in fixes), offload(fixes)
    gen = torch.Generator(device=dev).manual_seed(1)

    def forward() -> torch.Tensor:
        data = torch.randint(0, vocab, (batch, seq + 1), device=dev, generator=gen)
        with where():  # the saved tensors of the forward: what the backward reads back
            return model(data[:, :-1], data[:, 1:])

    def step() -> torch.Tensor:
        # the backward unpacks what the forward packed, whatever context it runs in
        return train_step(forward, opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_activation_offload_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
