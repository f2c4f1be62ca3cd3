"""Inference of a small Mamba-style language model whose selective scan is the reference
implementation, a Python loop over the sequence (as ``selective_scan_ref`` and the minimal
re-implementations do where the fused CUDA scan is not installed): 2 blocks of width 768 (inner
1536, state 16, depthwise convolution of 4), 8 sequences of 256 tokens, fp32, weights random.

Each forward pass is an NVTX range ``infer``.

Defect: the state update ``h = dA[:, t] * h + dBu[:, t]`` and its read-out run once per token
and block: ~1,500 kernels of 0.2 M elements each a call, their launches and the loop's Python
setting the pace while the GPU waits.

    python w_ssm_scan_infer.py [--steps 30] [--fix chunked_scan] [--fix graph] [--fix bf16]

Fixes:
  chunked_scan  the scan over chunks of 16 tokens: inside a chunk the recurrence in closed form
                (cumulative sums of the log decay), the loop only across chunks (16 a block).
  graph         the whole forward captured once in a CUDA graph and replayed.
  bf16          bf16 autocast around the forward (the loop kept).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, graphed, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("chunked_scan", "graph", "bf16")
CUDA_ONLY = ("graph",)


def scan_loop(da: torch.Tensor, dbu: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """y[:, t] = <h_t, c[:, t]> with h_t = da[:, t] * h_{t-1} + dbu[:, t], one token at a time.
    da, dbu: [B, L, D, N]; c: [B, L, N]. Returns [B, L, D]."""
    h = torch.zeros_like(dbu[:, 0])
    ys = []
    for t in range(da.shape[1]):
        h = da[:, t] * h + dbu[:, t]
        ys.append(torch.einsum("bdn,bn->bd", h, c[:, t]))
    return torch.stack(ys, 1)


def scan_chunked(log_da: torch.Tensor, dbu: torch.Tensor, c: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """The same recurrence, from the log decay: inside a chunk h_t = e^{S_t} (h_0 + sum_{s<=t}
    e^{-S_s} dbu_s) with S the chunk's cumulative log decay (S <= 0, so e^{-S} stays within the
    range of fp32 over 16 tokens of decay at most a few units each)."""
    h = torch.zeros_like(dbu[:, 0])
    ys = []
    for s in range(0, log_da.shape[1], chunk):
        seg = log_da[:, s:s + chunk].cumsum(1)
        hs = torch.exp(seg) * (h[:, None] + torch.cumsum(torch.exp(-seg) * dbu[:, s:s + chunk], 1))
        ys.append(torch.einsum("btdn,btn->btd", hs, c[:, s:s + chunk]))
        h = hs[:, -1]
    return torch.cat(ys, 1)


class MambaBlock(nn.Module):
    def __init__(self, d: int, state: int = 16, expand: int = 2, conv: int = 4, chunked: bool = False) -> None:
        super().__init__()
        inner, self.rank, self.state, self.chunked = expand * d, math.ceil(d / 16), state, chunked
        self.norm = nn.LayerNorm(d)
        self.in_proj = nn.Linear(d, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, conv, groups=inner, padding=conv - 1)
        self.x_proj = nn.Linear(inner, self.rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(self.rank, inner)
        with torch.no_grad():  # Mamba's initialisation: step sizes between 1e-3 and 1e-1
            dt = torch.exp(torch.rand(inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.a_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32).repeat(inner, 1)))
        self.skip = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        u, z = self.in_proj(self.norm(x)).chunk(2, -1)
        u = F.silu(self.conv(u.transpose(1, 2))[..., :n]).transpose(1, 2)
        dt, b, c = self.x_proj(u).split([self.rank, self.state, self.state], -1)
        dt = F.softplus(self.dt_proj(dt))
        log_da = dt[..., None] * -torch.exp(self.a_log.float())
        dbu = (dt * u)[..., None] * b[:, :, None, :]
        y = scan_chunked(log_da, dbu, c) if self.chunked else scan_loop(torch.exp(log_da), dbu, c)
        return x + self.out_proj((y + u * self.skip) * F.silu(z))


class MambaLM(nn.Module):
    def __init__(self, vocab: int, d: int, blocks: int, chunked: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(MambaBlock(d, chunked=chunked) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model with ``fixes`` applied; returns one forward (each sequence's last-token logits)."""
    vocab, d, blocks, batch, seq = 8192, 768, 2, 8, 256
    if args.small:
        vocab, d, blocks, batch, seq = 50, 16, 2, 2, 40
    torch.manual_seed(0)
    model = MambaLM(vocab, d, blocks, "chunked_scan" in fixes).to(dev).eval()
    amp = bf16_autocast(dev, "bf16" in fixes)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        with amp():
            return model(ids)[:, -1].float()
    call = forward
    if "graph" in fixes:
        call = graphed(forward, torch.zeros(batch, seq, device=dev, dtype=torch.long))
    gen = torch.Generator(device=dev).manual_seed(1)

    @torch.no_grad()
    def step() -> torch.Tensor:
        with nvtx("infer"):
            ids = torch.randint(0, vocab, (batch, seq), device=dev, generator=gen)
            return call(ids).clone()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30, steps_help="forward passes")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_ssm_scan_infer: {args.steps} calls, fixes {sorted(fixes) or 'none'}, "
              f"last mean logit {ran[1][-1].mean().item():.4f}")


if __name__ == "__main__":
    main()
