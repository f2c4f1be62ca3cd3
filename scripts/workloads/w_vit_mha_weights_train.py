"""Training a ViT-S/8 written with ``nn.MultiheadAttention`` called with its defaults: 12 layers,
hidden 384, 6 heads, 8x8 patches of 224x224 images (785 tokens with the class token), batch 32,
bf16 autocast over fp32 weights, AdamW (PyTorch's default implementation, foreach on CUDA),
fresh random images and labels each step, cross-entropy over 1,000 classes.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: the blocks call ``self.attn(x, x, x)``, and ``nn.MultiheadAttention.forward`` defaults to
``need_weights=True``: to return the attention weights averaged over the heads it computes them
explicitly (Q K^T, softmax, @ V), as a hand-written attention does, instead of
``F.scaled_dot_product_attention``'s fused kernels. Each layer materialises 32 x 6 x 785 x 785
scores (the softmax in fp32 under autocast: 0.47 GB) forward and backward, and averages them over
the heads for a result the program throws away.

    python w_vit_mha_weights_train.py [--steps 30] [--fix need_weights_false] [--fix compile] [--fix fused_adamw]

Fixes:
  need_weights_false  ``self.attn(x, x, x, need_weights=False)``: the module calls SDPA (flash
                      attention for bf16), no score matrix in memory.
  compile             ``torch.compile(model)`` (default mode), the call unchanged.
  fused_adamw         ``AdamW(fused=True)``: one pass over the 22M weights and states.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402

FIXES = ("need_weights_false", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class Block(nn.Module):
    def __init__(self, d: int, heads: int, need_weights: bool) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        if self.need_weights:
            a = self.attn(h, h, h)[0]  # the module's default: need_weights=True
        else:
            a = self.attn(h, h, h, need_weights=False)[0]
        x = x + a
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, d: int, heads: int, layers: int, classes: int,
                 need_weights: bool) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, tokens, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, need_weights) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x)[:, 0])


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh images
    and labels; the step's loss)."""
    image, patch, d, heads, layers, classes, batch = 224, 8, 384, 6, 12, 1000, 32
    if args.small:
        image, patch, d, heads, layers, classes, batch = 32, 8, 32, 4, 2, 10, 2
    torch.manual_seed(0)
    model = ViT(image, patch, d, heads, layers, classes, "need_weights_false" not in fixes).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05,
                            fused=True if "fused_adamw" in fixes else None)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev)

    def step() -> torch.Tensor:
        x = torch.randn(batch, 3, image, image, device=dev)
        y = torch.randint(0, classes, (batch,), device=dev)
        return train_step(lambda: F.cross_entropy(fwd(x), y), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_vit_mha_weights_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
