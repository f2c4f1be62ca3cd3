"""CLIP-style contrastive training of two towers from scratch: an image tower (ViT: 128 x 128
images in 16 x 16 patches, class token, 4 blocks of d=256, 4 heads) and a text tower (causal
transformer over 32 tokens of a 16,384-token vocabulary, 4 blocks of d=256, features at the
end-of-text token), both projected to a 256-d embedding; batch 1,024 image-text pairs, the
1,024 x 1,024 similarity matrix scaled by a learnable temperature, symmetric cross-entropy; fp32,
AdamW with PyTorch's default implementation (foreach on CUDA), random weights, fresh random
images and token ids made on the GPU each step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward``, ``optimizer`` and
``clamp_scale``.

Defects: after every optimizer step the log of the temperature is clamped with Python logic on
its value (``if model.logit_scale.item() > math.log(100): ...``), which waits for the whole step
on the GPU, so the CPU never queues the next step ahead; the GEMMs run in fp32 on the CUDA cores
(TF32 off by default); AdamW's foreach passes.

    python w_contrastive_clip_train.py [--steps 40] [--fix clamp_on_gpu] [--fix bf16]
        [--fix fused_adamw]

Fixes:
  clamp_on_gpu  ``model.logit_scale.data.clamp_(0, math.log(100))``: the same clamp as a GPU
                kernel, nothing read back.
  bf16          forward and loss under ``torch.autocast(bfloat16)``.
  fused_adamw   ``AdamW(fused=True)``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("clamp_on_gpu", "bf16", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
MAX_LOG_SCALE = math.log(100)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ImageTower(nn.Module):
    def __init__(self, size: int, patch: int, d: int, heads: int, layers: int, embed: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, heads, False) for _ in range(layers)])
        self.ln, self.proj = nn.LayerNorm(d), nn.Linear(d, embed, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), 1) + self.pos
        return self.proj(self.ln(self.blocks(x))[:, 0])


class TextTower(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, heads: int, layers: int, embed: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(1, ctx, d) * 0.01)
        self.blocks = nn.Sequential(*[Block(d, heads, True) for _ in range(layers)])
        self.ln, self.proj = nn.LayerNorm(d), nn.Linear(d, embed, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.blocks(self.tok(ids) + self.pos))
        eot = ids.argmax(-1)  # the end-of-text token has the largest id, as in CLIP's tokenizer
        return self.proj(x[torch.arange(x.shape[0], device=x.device), eot])


class CLIP(nn.Module):
    def __init__(self, image: ImageTower, text: TextTower) -> None:
        super().__init__()
        self.image, self.text = image, text
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        img = F.normalize(self.image(images), dim=-1)
        txt = F.normalize(self.text(ids), dim=-1)
        logits = self.logit_scale.exp() * img @ txt.t()
        labels = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The two towers and the optimizer with ``fixes`` applied; returns one training step (fresh
    pairs; its loss)."""
    size, patch, d, heads, layers, vocab, ctx, embed, batch = 128, 16, 256, 4, 4, 16384, 32, 256, 1024
    if args.small:
        size, patch, d, heads, layers, vocab, ctx, embed, batch = 32, 16, 32, 2, 1, 100, 8, 16, 8
    model = CLIP(ImageTower(size, patch, d, heads, layers, embed),
                 TextTower(vocab, ctx, d, heads, layers, embed)).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.2,
                            fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)
    scales: list[float] = []

    def clamp_scale(_loss: torch.Tensor) -> None:
        with nvtx("clamp_scale"), torch.no_grad():
            if "clamp_on_gpu" in fixes:
                model.logit_scale.data.clamp_(0, MAX_LOG_SCALE)
                return
            value = model.logit_scale.item()  # waits for the whole step
            if value > MAX_LOG_SCALE or value < 0:
                model.logit_scale.data.fill_(float(np.clip(value, 0, MAX_LOG_SCALE)))
            scales.append(value)

    def step() -> torch.Tensor:
        images = torch.randn(batch, 3, size, size, device=dev)
        ids = torch.randint(1, vocab - 1, (batch, ctx), device=dev)
        ends = torch.randint(4, ctx, (batch, 1), device=dev)  # captions of 4 to ctx - 1 tokens
        pos = torch.arange(ctx, device=dev)
        ids = torch.where(pos == ends, vocab - 1, ids).masked_fill(pos > ends, 0)  # end-of-text, then padding
        return train_step(lambda: model(images, ids), opt, amp, after=clamp_scale)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_contrastive_clip_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
