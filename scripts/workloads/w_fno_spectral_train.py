"""Training a 2-D Fourier neural operator (FNO) on a PDE surrogate task, as its reference code
writes it: batch 16 of 128 x 128 grids, 3 input channels lifted to 64, four Fourier layers, each
``torch.fft.rfft2`` of the activations, the lowest 24 x 24 modes of both corners multiplied by
complex64 weights with ``torch.einsum("bixy,ioxy->boxy")``, ``torch.fft.irfft2`` back, plus a
1x1 convolution, GELU; a projection to one channel, relative L2 loss; fp32, AdamW.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): cuFFT's transforms, complex64 contractions over the retained modes (small
batched complex GEMMs, one per mode) and fp32 elementwise work between them; which of it a
switch reaches is the question (autocast runs the FFTs in fp32, TF32 reaches the 1x1
convolutions and, maybe, the complex contractions).

    python w_fno_spectral_train.py [--steps 30] [--fix tf32] [--fix bf16] [--fix compile]

Fixes:
  tf32     TF32 for float32 matmuls (``set_float32_matmul_precision("high")``).
  bf16     bf16 autocast over the forward (the FFTs and the complex contraction stay float32).
  compile  ``torch.compile(model)`` (default mode).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402

FIXES = ("tf32", "bf16", "compile")
CUDA_ONLY: tuple[str, ...] = ()


class SpectralConv2d(nn.Module):
    """The Fourier layer's global part: the lowest ``modes`` x ``modes`` frequencies of both
    corners of the rfft2 spectrum, each multiplied by its own ``width`` x ``width`` complex
    matrix; the other frequencies dropped."""

    def __init__(self, width: int, modes: int) -> None:
        super().__init__()
        scale = 1.0 / (width * width)
        self.modes = modes
        self.w1 = nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat))
        self.w2 = nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        m = self.modes
        x_ft = torch.fft.rfft2(x.float())
        out = torch.zeros(b, self.w1.shape[1], h, w // 2 + 1, dtype=torch.cfloat, device=x.device)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m, :m], self.w1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m:, :m], self.w2)
        return torch.fft.irfft2(out, s=(h, w))


class FNO2d(nn.Module):
    def __init__(self, width: int, modes: int, layers: int) -> None:
        super().__init__()
        self.lift = nn.Conv2d(3, width, 1)
        self.spectral = nn.ModuleList(SpectralConv2d(width, modes) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv2d(width, width, 1) for _ in range(layers))
        self.proj = nn.Sequential(nn.Conv2d(width, 128, 1), nn.GELU(), nn.Conv2d(128, 1, 1))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        x = self.lift(a)
        for i, (spec, pw) in enumerate(zip(self.spectral, self.pointwise)):
            x = spec(x) + pw(x)
            if i < len(self.spectral) - 1:
                x = F.gelu(x)
        return self.proj(x)


def relative_l2(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean over the batch of ||pred - target|| / ||target||, in float32."""
    diff = (pred.float() - target).flatten(1).norm(dim=1)
    return (diff / target.flatten(1).norm(dim=1)).mean()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The operator and optimizer with ``fixes`` applied; returns one training step (a fresh batch
    of smooth random fields and a target computed from them; the step's loss)."""
    batch, size, width, modes, layers = 16, 128, 64, 24, 4
    if args.small:
        batch, size, width, modes, layers = 2, 16, 4, 3, 2
    torch.manual_seed(0)
    model = FNO2d(width, modes, layers).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev, "bf16" in fixes)
    grid = torch.linspace(0, 1, size, device=dev)
    gy, gx = torch.meshgrid(grid, grid, indexing="ij")

    def step() -> torch.Tensor:
        # a smooth random field (a few sines) and the target a fixed nonlinear map of it
        k = torch.randint(1, 5, (batch, 2, 1, 1), device=dev).float()
        field = torch.sin(torch.pi * (k[:, :1] * gx + k[:, 1:] * gy))
        a = torch.cat([field, gx.expand_as(field), gy.expand_as(field)], 1)
        target = torch.tanh(2 * field) * (1 + gx)
        return train_step(lambda: relative_l2(fwd(a), target), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_fno_spectral_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
