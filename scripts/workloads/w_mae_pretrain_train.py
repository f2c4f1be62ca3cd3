"""A masked-autoencoder (MAE) pre-training step as its reference code writes it, in fp32: images
of 224 x 224 cut into 196 patches of 16 x 16, 75% of them masked per image (``argsort`` of
random noise, ``gather`` of the kept 49), a ViT-S encoder on the visible patches (12 blocks,
width 384, 6 heads), a 4-block decoder (width 256, 8 heads) on all 196 positions with mask
tokens, and the mean squared error of the normalised pixels on the masked patches only; batch
64, AdamW. Its blocks use ``nn.MultiheadAttention`` called as ``attn(x, x, x)``: the default
``need_weights=True`` computes the attention weights explicitly (a batched GEMM, softmax and a
second GEMM, the weights averaged over the heads and returned) where ``need_weights=False``
lets it call ``scaled_dot_product_attention``.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defect: every GEMM in full fp32 (PyTorch's default matmul precision), and the attention by
the explicit path.

    python w_mae_pretrain_train.py [--steps 30] [--fix tf32] [--fix bf16] [--fix sdpa] [--fix fused_adamw]

Fixes:
  tf32         ``torch.set_float32_matmul_precision("high")`` before the model is built.
  bf16         the forward and the loss under bf16 autocast.
  sdpa         ``need_weights=False`` in every block's attention call.
  fused_adamw  ``AdamW(fused=True)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16", "sdpa", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
MASK_RATIO = 0.75


class Block(nn.Module):
    def __init__(self, d: int, heads: int, need_weights: bool) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=self.need_weights)[0]
        return x + self.mlp(self.n2(x))


class MAE(nn.Module):
    def __init__(self, patch: int, n: int, d: int, depth: int, heads: int, dd: int, ddepth: int,
                 dheads: int, need_weights: bool) -> None:
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, d)
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
        self.enc = nn.Sequential(*(Block(d, heads, need_weights) for _ in range(depth)), nn.LayerNorm(d))
        self.to_dec = nn.Linear(d, dd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dd))
        self.dpos = nn.Parameter(torch.randn(1, n, dd) * 0.02)
        self.dec = nn.Sequential(*(Block(dd, dheads, need_weights) for _ in range(ddepth)), nn.LayerNorm(dd))
        self.head = nn.Linear(dd, 3 * patch * patch)

    def patchify(self, img: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = img.shape
        p = self.patch
        x = img.reshape(b, c, hh // p, p, ww // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, (hh // p) * (ww // p), p * p * c)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """The loss: mean squared error of the normalised pixels over the masked patches."""
        target = self.patchify(img)
        b, n, _ = target.shape
        keep = int(n * (1 - MASK_RATIO))
        shuffle = torch.argsort(torch.rand(b, n, device=img.device), dim=1)
        restore = torch.argsort(shuffle, dim=1)
        kept = shuffle[:, :keep]
        x = self.embed(target) + self.pos
        x = self.enc(torch.gather(x, 1, kept[..., None].expand(-1, -1, x.shape[-1])))
        y = self.to_dec(x)
        y = torch.cat([y, self.mask_token.expand(b, n - keep, -1)], 1)
        y = torch.gather(y, 1, restore[..., None].expand(-1, -1, y.shape[-1])) + self.dpos
        pred = self.head(self.dec(y)).float()
        mask = torch.ones(b, n, device=img.device)
        mask[:, :keep] = 0
        mask = torch.gather(mask, 1, restore)
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        err = ((pred - (target - mean) / (var + 1e-6).sqrt()) ** 2).mean(-1)
        return (err * mask).sum() / mask.sum()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (its loss)."""
    size, patch, d, depth, heads, dd, ddepth, dheads, batch = 224, 16, 384, 12, 6, 256, 4, 8, 64
    if args.small:
        size, patch, d, depth, heads, dd, ddepth, dheads, batch = 32, 8, 16, 1, 2, 8, 1, 2, 2
    torch.manual_seed(0)
    model = MAE(patch, (size // patch) ** 2, d, depth, heads, dd, ddepth, dheads,
                need_weights="sdpa" not in fixes).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1.5e-4, weight_decay=0.05, betas=(0.9, 0.95),
                            fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)
    # images with a structure to learn: smooth random fields (low-frequency noise upsampled)
    low = torch.randn(16, 3, size // patch, size // patch, device=dev)

    def loss_of() -> torch.Tensor:
        pick = torch.randint(0, low.shape[0], (batch,), device=dev)
        img = nn.functional.interpolate(low[pick], size=(size, size), mode="bilinear", align_corners=False)
        return model(img + 0.1 * torch.randn_like(img))

    def step() -> torch.Tensor:
        return train_step(loss_of, opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_mae_pretrain_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
