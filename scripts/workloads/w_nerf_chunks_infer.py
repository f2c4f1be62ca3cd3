"""Rendering rays through a NeRF-style MLP in small chunks from a Python loop, as research code
written for a GPU with little memory does: 2048 rays of 64 samples (131,072 points) a call, the
points positionally encoded (10 frequencies) and run through an 8-layer, 256-wide MLP with a
skip connection, then a view-dependent colour head, in chunks of 2048 points; the chunks' outputs
concatenated and composited along each ray (alpha compositing with a cumulative product); fp32,
weights random.

Each call renders one batch of rays: an NVTX range ``render``.

Defect: 64 chunks a call, each some 30 kernel launches and their Python for about 2 GFLOP of
fp32 GEMMs; the launches and the loop, not the arithmetic, set the pace.

    python w_nerf_chunks_infer.py [--steps 30] [--fix big_chunks] [--fix tf32] [--fix compile]

Fixes:
  big_chunks  chunks of 65,536 points (two a call).
  tf32        ``torch.set_float32_matmul_precision("high")``.
  compile     the MLP under ``torch.compile`` (the chunk loop stays).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("big_chunks", "tf32", "compile")
CUDA_ONLY: tuple[str, ...] = ()


def encode(x: torch.Tensor, freqs: int) -> torch.Tensor:
    """x and sin/cos of x at 2^0..2^(freqs-1) times pi."""
    scales = (2.0 ** torch.arange(freqs, device=x.device, dtype=x.dtype)) * math.pi
    xs = x[..., None, :] * scales[:, None]
    return torch.cat([x, xs.sin().flatten(-2), xs.cos().flatten(-2)], -1)


class Field(nn.Module):
    def __init__(self, width: int = 256, depth: int = 8, skip: int = 4, pos_f: int = 10, dir_f: int = 4) -> None:
        super().__init__()
        self.pos_f, self.dir_f, self.skip = pos_f, dir_f, skip
        pin, din = 3 + 6 * pos_f, 3 + 6 * dir_f
        self.layers = nn.ModuleList(nn.Linear(pin if i == 0 else width + (pin if i == skip else 0), width)
                                    for i in range(depth))
        self.sigma = nn.Linear(width, 1)
        self.feat = nn.Linear(width, width)
        self.rgb = nn.Sequential(nn.Linear(width + din, width // 2), nn.ReLU(), nn.Linear(width // 2, 3))

    def forward(self, pts: torch.Tensor, dirs: torch.Tensor) -> torch.Tensor:
        p = encode(pts, self.pos_f)
        h = p
        for i, lin in enumerate(self.layers):
            h = F.relu(lin(torch.cat([h, p], -1) if i == self.skip else h))
        rgb = torch.sigmoid(self.rgb(torch.cat([self.feat(h), encode(dirs, self.dir_f)], -1)))
        return torch.cat([rgb, F.softplus(self.sigma(h))], -1)


def composite(raw: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Alpha compositing along each ray: raw [R, S, 4] (rgb, density), t [R, S] depths."""
    delta = torch.cat([t[:, 1:] - t[:, :-1], torch.full_like(t[:, :1], 1e10)], -1)
    alpha = 1 - torch.exp(-raw[..., 3] * delta)
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], -1), -1)[:, :-1]
    return ((alpha * trans)[..., None] * raw[..., :3]).sum(1)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The field with ``fixes`` applied; returns one render (each ray's colour)."""
    rays, samples, width, chunk = 2048, 64, 256, 2048
    if args.small:
        rays, samples, width, chunk = 8, 4, 16, 8
    if "big_chunks" in fixes:
        chunk = 32 * chunk
    torch.manual_seed(0)
    field = Field(width).to(dev).eval()
    fwd = torch.compile(field) if "compile" in fixes else field
    gen = torch.Generator(device=dev).manual_seed(1)
    batches = []
    for _ in range(3):
        o = torch.rand(rays, 3, device=dev, generator=gen) * 2 - 1
        d = F.normalize(torch.randn(rays, 3, device=dev, generator=gen), dim=-1)
        t = torch.linspace(2.0, 6.0, samples, device=dev).expand(rays, samples).contiguous()
        pts = (o[:, None] + d[:, None] * t[..., None]).reshape(-1, 3)
        batches.append((pts, d[:, None].expand(rays, samples, 3).reshape(-1, 3), t))
    state = {"i": 0}

    @torch.inference_mode()
    def step() -> torch.Tensor:
        with nvtx("render"):
            pts, dirs, t = batches[state["i"] % len(batches)]
            state["i"] += 1
            out = [fwd(pts[i:i + chunk], dirs[i:i + chunk]) for i in range(0, pts.shape[0], chunk)]
            return composite(torch.cat(out).view(t.shape[0], t.shape[1], 4), t)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_nerf_chunks_infer: {args.steps} calls, fixes {sorted(fixes) or 'none'}, "
              f"last mean colour {ran[1][-1].mean().item():.4f}")


if __name__ == "__main__":
    main()
