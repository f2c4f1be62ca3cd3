"""A WGAN-GP training step as its reference implementations write it: a DCGAN generator
(latent 128 -> 512 x 4 x 4 -> ... -> 3 x 64 x 64, ConvTranspose2d with BatchNorm and ReLU) and a
critic (Conv2d 3 -> 64 -> 128 -> 256 -> 512 -> 1 with LeakyReLU, no normalisation, as the gradient
penalty requires); five critic updates per generator update, each with the gradient penalty on
images interpolated between real and generated ones (``torch.autograd.grad(...,
create_graph=True)``, so the critic's backward is differentiated again); Adam (lr 1e-4, betas 0
and 0.9) for both; batches of 64; fp32 weights, cuDNN's default TF32 convolutions. The "real"
images are drawn on the GPU from a fixed mixture of smooth patterns. Each critic update logs the
Wasserstein estimate with ``.item()``, as the reference code's running averages do.

Each step (five critic updates and one generator update) is an NVTX range ``train_step``
holding ``critic`` and ``generator``.

Defect: five waits for the GPU a step (the logged estimates) and the convolutions in TF32
where bf16 would run them at the full tensor-core rate; NCHW layouts.

    python w_wgan_gp_train.py [--steps 30] [--fix bf16] [--fix channels_last] [--fix no_item] [--fix fused_adam]

Fixes:
  bf16           the generator's and the critic's forwards (the penalty's too) under bf16 autocast.
  channels_last  both networks and the images in ``torch.channels_last``.
  no_item        the estimates summed on the GPU and read once at the end: no wait in the step.
  fused_adam     ``Adam(fused=True)`` for both optimizers.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16", "channels_last", "no_item", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()
N_CRITIC, GP_WEIGHT = 5, 10.0


def generator(latent: int, ch: int) -> nn.Module:
    def up(cin: int, cout: int) -> list[nn.Module]:
        return [nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]
    return nn.Sequential(nn.ConvTranspose2d(latent, 8 * ch, 4, 1, 0, bias=False), nn.BatchNorm2d(8 * ch),
                         nn.ReLU(True), *up(8 * ch, 4 * ch), *up(4 * ch, 2 * ch), *up(2 * ch, ch),
                         nn.ConvTranspose2d(ch, 3, 4, 2, 1), nn.Tanh())


def critic(ch: int) -> nn.Module:
    def down(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 4, 2, 1), nn.LeakyReLU(0.2, True)]
    return nn.Sequential(*down(3, ch), *down(ch, 2 * ch), *down(2 * ch, 4 * ch), *down(4 * ch, 8 * ch),
                         nn.Conv2d(8 * ch, 1, 4, 1, 0), nn.Flatten())


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """Both networks and optimizers with ``fixes`` applied; returns one training step (the
    generator's loss)."""
    latent, ch, batch, size = 128, 64, 64, 64
    if args.small:
        latent, ch, batch, size = 8, 4, 3, 64  # the networks' strides fix 64 x 64 images
    torch.manual_seed(0)
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    gen, crit = generator(latent, ch).to(dev).to(memory_format=fmt), critic(ch).to(dev).to(memory_format=fmt)
    fused = True if "fused_adam" in fixes else None
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4, betas=(0.0, 0.9), fused=fused)
    opt_c = torch.optim.Adam(crit.parameters(), lr=1e-4, betas=(0.0, 0.9), fused=fused)
    amp = bf16_autocast(dev, "bf16" in fixes)
    on_gpu = "no_item" in fixes
    running = torch.zeros((), device=dev)
    logged: list[float] = []
    grid = torch.linspace(-1, 1, size, device=dev)
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")

    def real_batch() -> torch.Tensor:
        # smooth coloured waves of random frequency and phase: images with a structure to learn
        f = torch.rand(batch, 3, 2, device=dev) * 6 + 1
        ph = torch.rand(batch, 3, 1, 1, device=dev) * 6.28
        img = torch.sin(f[..., 0, None, None] * xx + f[..., 1, None, None] * yy + ph)
        return img.contiguous(memory_format=fmt)

    def noise() -> torch.Tensor:
        return torch.randn(batch, latent, 1, 1, device=dev)

    def critic_update() -> None:
        real = real_batch()
        with torch.no_grad(), amp():
            fake = gen(noise())
        eps = torch.rand(batch, 1, 1, 1, device=dev)
        mixed = (eps * real + (1 - eps) * fake.float()).requires_grad_(True)
        with amp():
            w = crit(real).mean() - crit(fake).mean()
            score = crit(mixed)
        grad = torch.autograd.grad(score.float().sum(), mixed, create_graph=True)[0]
        penalty = (grad.flatten(1).norm(dim=1) - 1).square().mean()
        loss = -w.float() + GP_WEIGHT * penalty
        loss.backward()
        opt_c.step()
        opt_c.zero_grad(set_to_none=True)
        if on_gpu:
            running.add_(w.detach().float())
        else:
            logged.append(w.item())  # a wait for the GPU

    def step() -> torch.Tensor:
        with nvtx("train_step"):
            with nvtx("critic"):
                for _ in range(N_CRITIC):
                    critic_update()
            with nvtx("generator"):
                with amp():
                    g_loss = -crit(gen(noise())).float().mean()
                g_loss.backward()
                opt_g.step()
                opt_g.zero_grad(set_to_none=True)
                opt_c.zero_grad(set_to_none=True)  # the critic's gradients from the generator's loss
        return g_loss.detach()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_wgan_gp_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
