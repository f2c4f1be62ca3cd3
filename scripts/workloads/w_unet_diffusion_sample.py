"""Diffusion sampling with a small pixel-space UNet (DDPM-style: conv residual blocks with
GroupNorm and a timestep embedding, self-attention at 16 x 16 and 8 x 8, base width 128, widths
x1/x2/x2/x2 over 64/32/16/8 px), random weights, the model in fp16 (``model.half()``, as
pipelines load it), batch 32 images of 64 x 64, DDIM sampling with 50 steps.

One iteration is one denoising step: an NVTX range ``denoise_step`` holding ``unet`` (the noise
prediction) and ``scheduler`` (the DDIM update, written in Python on 0-d tensors of the
schedule: a dozen tiny element-wise kernels). Every 50 steps a new batch starts from noise.

The attention is hand-written (``softmax(q @ k^T / sqrt(d)) @ v``, the scores materialised).
The step issues ~400 kernels, most of them short: at this batch the GPU's work is a little longer
than the CPU's launching of it.

    python w_unet_diffusion_sample.py [--steps 150] [--fix channels_last] [--fix sdpa]
        [--fix graph | --fix compile]

Fixes:
  channels_last  model and latents in torch.channels_last: cuDNN's NHWC fp16 convolutions,
                 without the layout transposes around them.
  sdpa           the attention through ``F.scaled_dot_product_attention`` (flash attention:
                 no 1024 x 1024 / 256 x 256 score matrices written and read back).
  graph          the whole denoising step (UNet and DDIM update) captured once as a CUDA graph
                 on static buffers (latents, timestep, schedule coefficients) and replayed: one
                 launch a step instead of ~400.
  compile        ``torch.compile(unet)`` (default mode): GroupNorm + SiLU + residual passes and
                 the attention's scale/softmax fused; still launched one by one from Python.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("channels_last", "sdpa", "graph", "compile")
CUDA_ONLY = ("graph",)
TRAIN_T, SAMPLE_STEPS = 1000, 50


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat((args.cos(), args.sin()), -1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(temb))[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return self.skip(x) + h


class Attention(nn.Module):
    def __init__(self, c: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.norm, self.qkv, self.proj = nn.GroupNorm(32, c), nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # [B, h*w, C]
        q, k, v = self.qkv(tokens).view(b, h * w, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // self.heads), dim=-1) @ v
        return x + self.proj(a.transpose(1, 2).reshape(b, h * w, c)).transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    def __init__(self, base: int, mults: tuple[int, ...], attn_at: tuple[int, ...], sdpa: bool) -> None:
        super().__init__()
        tdim, self.base = 4 * base, base
        self.temb = nn.Sequential(nn.Linear(base, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(3, base, 3, padding=1)
        self.down, self.up = nn.ModuleList(), nn.ModuleList()
        chans, c = [base], base
        for i, m in enumerate(mults):  # two res blocks a level, attention where asked, then downsample
            for _ in range(2):
                self.down.append(nn.ModuleList([ResBlock(c, base * m, tdim),
                                                Attention(base * m, 4, sdpa) if i in attn_at else nn.Identity()]))
                c = base * m
                chans.append(c)
            if i < len(mults) - 1:
                self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                chans.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, tdim), Attention(c, 4, sdpa), ResBlock(c, c, tdim)])
        for i, m in reversed(list(enumerate(mults))):
            for _ in range(3):
                self.up.append(nn.ModuleList([ResBlock(c + chans.pop(), base * m, tdim),
                                              Attention(base * m, 4, sdpa) if i in attn_at else nn.Identity()]))
                c = base * m
            if i > 0:
                self.up.append(nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c, c, 3, padding=1)))
        self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.temb(timestep_embedding(t, self.base).to(x.dtype))
        h = self.inp(x)
        skips = [h]
        for blk in self.down:
            h = blk(h) if isinstance(blk, nn.Conv2d) else blk[1](blk[0](h, temb))
            skips.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, temb)), temb)
        for blk in self.up:
            h = blk(h) if isinstance(blk, nn.Sequential) else blk[1](blk[0](torch.cat((h, skips.pop()), 1), temb))
        return self.out(h)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The UNet and the DDIM schedule with ``fixes`` applied; returns one denoising step (the
    latents after it)."""
    base, mults, attn_at, batch, size = 128, (1, 2, 2, 2), (2, 3), 32, 64
    if args.small:
        base, mults, attn_at, batch, size = 32, (1, 2), (1,), 2, 16
    dtype = torch.float16 if dev.type == "cuda" else torch.float32  # (fp16 is slow on a CPU)
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    unet = UNet(base, mults, attn_at, "sdpa" in fixes).to(dev, dtype, memory_format=fmt).eval()
    net = torch.compile(unet) if "compile" in fixes else unet
    betas = torch.linspace(1e-4, 0.02, TRAIN_T, device=dev, dtype=torch.float64)
    alphas = torch.cumprod(1 - betas, 0).float()
    timesteps = list(range(TRAIN_T - 1, -1, -TRAIN_T // SAMPLE_STEPS))  # 999, 979, ..., 19

    def denoise(x: torch.Tensor, t: torch.Tensor, a_t: torch.Tensor, a_prev: torch.Tensor) -> torch.Tensor:
        with nvtx("unet"):
            eps = net(x, t).float()
        with nvtx("scheduler"):  # DDIM (eta = 0): predict x0, step to the previous timestep
            xf = x.float()
            x0 = ((xf - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-1, 1)
            return (a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps).to(dtype)

    state = {"i": 0, "x": None}
    new_noise = lambda: torch.randn(batch, 3, size, size, device=dev).to(dtype, memory_format=fmt)
    one = torch.ones((), device=dev)
    if "graph" in fixes:
        sx, st = new_noise(), torch.full((batch,), timesteps[0], device=dev)
        sa, sp = alphas[timesteps[0]].clone(), alphas[timesteps[1]].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            for _ in range(3):
                denoise(sx, st, sa, sp)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            sx.copy_(denoise(sx, st, sa, sp))  # the latents updated in place: the next replay's input

    @torch.no_grad()
    def step() -> torch.Tensor:
        k = state["i"] % SAMPLE_STEPS
        state["i"] += 1
        t = timesteps[k]
        a_prev = alphas[timesteps[k + 1]] if k + 1 < SAMPLE_STEPS else one
        with nvtx("denoise_step"):
            if "graph" in fixes:
                if k == 0:
                    sx.copy_(new_noise())
                st.fill_(t)
                sa.copy_(alphas[t])
                sp.copy_(a_prev)
                graph.replay()
                return sx
            if k == 0:
                state["x"] = new_noise()
            state["x"] = denoise(state["x"], torch.full((batch,), t, device=dev), alphas[t], a_prev)
            return state["x"]
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=150,
                                    alternatives=[("graph", "compile")],
                                    steps_help="denoising steps (50 a batch; the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_unet_diffusion_sample: {args.steps} denoising steps, fixes {sorted(fixes) or 'none'}, "
              f"last latents' mean {ran[1][-1].float().mean().item():.4f}")


if __name__ == "__main__":
    main()
