"""A denoising-diffusion (DDPM) training step whose noise schedule lives on the host, as code
ported from a NumPy reference often keeps it: a small UNet (64-128-256 channels, GroupNorm and
SiLU residual blocks, a sinusoidal timestep embedding; fp32 weights, cuDNN's default TF32
convolutions) on 64 images of 3 x 32 x 32, AdamW. Each step draws timesteps on the GPU, looks
their schedule coefficients up in CPU tensors (``sqrt_alphas_cumprod[t.cpu()].to(device)``: a
device-to-host copy and a pageable host-to-device copy), noises the batch, predicts the noise
and logs the loss with ``loss.item()``.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``
(the schedule look-up inside ``forward``, the log after ``optimizer``).

Defect: two waits for the GPU a step (the timesteps read back for the look-up, the loss for the
log) on a step whose GPU work sets the pace; and the convolutions in fp32 (TF32) where bf16
would run them on the full tensor-core rate.

    python w_ddpm_cpu_schedule_train.py [--steps 40] [--fix gpu_schedule] [--fix bf16] [--fix channels_last]

Fixes:
  gpu_schedule   the schedule's tensors on the GPU (indexed there) and the loss summed on the GPU,
                 read once at the end: no wait in the step.
  bf16           the UNet's forward and loss under bf16 autocast.
  channels_last  the UNet and its input in ``torch.channels_last``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("gpu_schedule", "bf16", "channels_last")
CUDA_ONLY: tuple[str, ...] = ()
T = 1000


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=1)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class UNet(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        tdim = 4 * ch
        self.ch = ch
        self.temb = nn.Sequential(nn.Linear(ch, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.d1, self.down1 = Block(ch, ch, tdim), nn.Conv2d(ch, 2 * ch, 3, 2, 1)
        self.d2, self.down2 = Block(2 * ch, 2 * ch, tdim), nn.Conv2d(2 * ch, 4 * ch, 3, 2, 1)
        self.mid = Block(4 * ch, 4 * ch, tdim)
        self.up2, self.u2 = nn.ConvTranspose2d(4 * ch, 2 * ch, 2, 2), Block(4 * ch, 2 * ch, tdim)
        self.up1, self.u1 = nn.ConvTranspose2d(2 * ch, ch, 2, 2), Block(2 * ch, ch, tdim)
        self.out = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.temb(timestep_embedding(t, self.ch))
        h1 = self.d1(self.inp(x), temb)
        h2 = self.d2(self.down1(h1), temb)
        h = self.mid(self.down2(h2), temb)
        h = self.u2(torch.cat([self.up2(h), h2], 1), temb)
        h = self.u1(torch.cat([self.up1(h), h1], 1), temb)
        return self.out(h)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The UNet, optimizer and schedule with ``fixes`` applied; returns one training step (its
    loss)."""
    ch, batch, size = 64, 64, 32
    if args.small:
        ch, batch, size = 8, 2, 8
    torch.manual_seed(0)
    model = UNet(ch).to(dev).train()
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
    betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    ab = torch.cumprod(1 - betas, 0)
    on_gpu = "gpu_schedule" in fixes
    sqrt_ab, sqrt_1mab = ab.sqrt().float(), (1 - ab).sqrt().float()
    if on_gpu:
        sqrt_ab, sqrt_1mab = sqrt_ab.to(dev), sqrt_1mab.to(dev)
    amp = bf16_autocast(dev, "bf16" in fixes)
    total = torch.zeros((), device=dev)
    logged: list[float] = []

    def loss_of() -> torch.Tensor:
        x0 = (torch.rand(batch, 3, size, size, device=dev) * 2 - 1).contiguous(memory_format=fmt)
        t = torch.randint(0, T, (batch,), device=dev)
        idx = t if on_gpu else t.cpu()          # a wait for the GPU, then the look-up on the host
        a, b = (c[idx].to(dev).view(batch, 1, 1, 1) for c in (sqrt_ab, sqrt_1mab))
        noise = torch.randn(x0.shape, device=dev).contiguous(memory_format=fmt)  # the same draws in either format
        return F.mse_loss(model(a * x0 + b * noise, t).float(), noise)

    def log(loss: torch.Tensor) -> None:
        if on_gpu:
            total.add_(loss.detach())
        else:
            logged.append(loss.item())          # a wait for the GPU

    def step() -> torch.Tensor:
        return train_step(loss_of, opt, amp, after=log)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_ddpm_cpu_schedule_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
