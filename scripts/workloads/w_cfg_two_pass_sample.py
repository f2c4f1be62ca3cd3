"""Sampling a class-conditional diffusion transformer (DiT-S/2 shaped: 12 blocks of width 384, 6
heads, adaLN modulation, SDPA attention) with classifier-free guidance, as sampling scripts
written from the guidance formula do: the denoiser called twice every step, once with the class
labels and once with the null label, and the two predictions mixed (scale 4); DDIM, 50 steps over
a 1000-step linear schedule; 4 latents of 4 x 32 x 32 (256 tokens each); fp32, weights random.

Each sampling step is an NVTX range ``denoise``.

Defect: two calls of the same model on the same latents, each ~300 small kernels and their
Python on 1,024 token rows; the launches, not the arithmetic, set the pace, and there are twice
as many as one call on both halves of the guidance would need.

    python w_cfg_two_pass_sample.py [--steps 60] [--fix batched_cfg] [--fix graph] [--fix bf16]

Fixes:
  batched_cfg  one call on the conditional and unconditional halves concatenated (batch 8), its
               output split, as the reference DiT sampler does.
  graph        the two calls and the mix captured once in a CUDA graph and replayed each step.
  bf16         bf16 autocast around the denoiser's calls.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("batched_cfg", "graph", "bf16")
CUDA_ONLY = ("graph",)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        s1, sc1, g1, s2, sc2, g2 = self.ada(c).chunk(6, -1)
        b, n, d = x.shape
        q, k, v = self.qkv(modulate(self.norm1(x), s1, sc1)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + g1[:, None] * self.proj(a)
        return x + g2[:, None] * self.fc2(F.gelu(self.fc1(modulate(self.norm2(x), s2, sc2)), approximate="tanh"))


class DiT(nn.Module):
    def __init__(self, d: int = 384, depth: int = 12, heads: int = 6, classes: int = 1000, ch: int = 4,
                 size: int = 32, patch: int = 2) -> None:
        super().__init__()
        self.p, self.ch = patch, ch
        self.patch = nn.Conv2d(ch, d, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2, d) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.y_emb = nn.Embedding(classes + 1, d)  # the last row is the null label
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.out = nn.Linear(d, patch * patch * ch)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        h = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        cond = self.t_mlp(timestep_embedding(t, 256).to(x.dtype)) + self.y_emb(y)
        for blk in self.blocks:
            h = blk(h, cond)
        s, sc = self.final_ada(cond).chunk(2, -1)
        h = self.out(modulate(self.norm(h), s, sc))
        p = self.p
        return h.view(b, hh // p, ww // p, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, hh, ww)


def guidance(model: nn.Module, batched: bool, scale: float) -> Callable:
    """The guided noise prediction: two calls (conditional, then null label), or one on both."""
    def two_pass(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
        eps_c = model(x, t, y)
        eps_u = model(x, t, null)
        return eps_u + scale * (eps_c - eps_u)

    def one_pass(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
        eps_c, eps_u = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null])).chunk(2)
        return eps_u + scale * (eps_c - eps_u)
    return one_pass if batched else two_pass


def ddim_schedule(steps: int, train_steps: int = 1000) -> list[tuple[int, float, float]]:
    """(t, alpha-bar at t, alpha-bar at the next t) for each sampling step, as Python numbers (the
    sampler reads no value back from the GPU)."""
    betas = torch.linspace(1e-4, 0.02, train_steps, dtype=torch.float64)
    acp = torch.cumprod(1 - betas, 0)
    ts = list(range(train_steps - 1, -1, -train_steps // steps))[:steps]
    return [(t, float(acp[t]), float(acp[ts[i + 1]]) if i + 1 < len(ts) else 1.0) for i, t in enumerate(ts)]


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The sampler with ``fixes`` applied; returns one denoising step (the latents after it)."""
    batch, d, depth, heads, classes, size, steps = 4, 384, 12, 6, 1000, 32, 50
    if args.small:
        batch, d, depth, heads, classes, size, steps = 2, 16, 2, 2, 10, 8, 5
    torch.manual_seed(0)
    model = DiT(d, depth, heads, classes, 4, size).to(dev).eval()
    amp = bf16_autocast(dev, "bf16" in fixes)
    mix = guidance(model, "batched_cfg" in fixes, 4.0)
    schedule = ddim_schedule(steps)
    gen = torch.Generator(device=dev).manual_seed(1)
    y = torch.randint(0, classes, (batch,), device=dev, generator=gen)
    null = torch.full((batch,), classes, device=dev, dtype=torch.long)

    def eps(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with amp():
            return mix(x, t, y, null).float()
    call = eps
    if "graph" in fixes:
        sx = torch.randn(batch, 4, size, size, device=dev, generator=gen)
        st = torch.full((batch,), schedule[0][0], device=dev, dtype=torch.long)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(3):
                eps(sx, st)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            out = eps(sx, st)

        def replay(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            sx.copy_(x)
            st.copy_(t)
            graph.replay()
            return out
        call = replay
    state = {"i": 0, "x": None}

    @torch.no_grad()
    def step() -> torch.Tensor:
        with nvtx("denoise"):
            i = state["i"] % len(schedule)
            if i == 0:  # a new sample: fresh noise
                state["x"] = torch.randn(batch, 4, size, size, device=dev, generator=gen)
            state["i"] += 1
            t, a, a_next = schedule[i]
            x = state["x"]
            e = call(x, torch.full((batch,), t, device=dev, dtype=torch.long))
            x0 = (x - math.sqrt(1 - a) * e) / math.sqrt(a)
            state["x"] = math.sqrt(a_next) * x0 + math.sqrt(1 - a_next) * e
            return state["x"]
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=60, steps_help="denoising steps (50 a sample)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_cfg_two_pass_sample: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last latent std {ran[1][-1].std().item():.4f}")


if __name__ == "__main__":
    main()
