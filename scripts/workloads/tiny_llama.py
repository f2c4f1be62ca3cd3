"""A small Llama-style decoder built from a config with random weights (no downloads).

Forward passes only, bf16, under NVTX ranges `forward` and `layer{i}`; run it under
`torch.autograd.profiler.emit_nvtx(record_shapes=True)` (``--emit-nvtx``, or
``profkit capture --aten``) to get the aten:: ranges with shapes.

    python scripts/workloads/tiny_llama.py [--emit-nvtx] [--steps 6] [--fused auto|triton|cuda]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 32000
    hidden: int = 2048
    heads: int = 16
    layers: int = 4
    ffn: int = 5632
    batch: int = 4
    seq: int = 512


def _rng(name: str):
    return torch.cuda.nvtx.range(name)


class Attention(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden, bias=False)
        self.out = nn.Linear(c.hidden, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.gate_up = nn.Linear(c.hidden, 2 * c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class Block(nn.Module):
    def __init__(self, c: Config, fused: str | None) -> None:
        super().__init__()
        self.attn, self.mlp = Attention(c), MLP(c)
        self.norm1 = nn.RMSNorm(c.hidden, eps=1e-6)
        self.norm2 = nn.RMSNorm(c.hidden, eps=1e-6)
        self.fused = fused

    def _add_norm(self, x: torch.Tensor, res: torch.Tensor, norm: nn.RMSNorm):
        if self.fused:
            from kernels import add_rmsnorm
            return add_rmsnorm(x, res, norm.weight, norm.eps, backend=self.fused)
        h = x + res
        return norm(h), h

    def forward(self, x: torch.Tensor, res: torch.Tensor):
        h, res = self._add_norm(x, res, self.norm1)
        x = self.attn(h)
        h, res = self._add_norm(x, res, self.norm2)
        return self.mlp(h), res


class TinyLlama(nn.Module):
    def __init__(self, c: Config, fused: str | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c, fused) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden, eps=1e-6)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        res = torch.zeros_like(x)
        for i, blk in enumerate(self.blocks):
            with _rng(f"layer{i}"):
                x, res = blk(x, res)
        return self.head(self.norm(x + res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emit-nvtx", action="store_true", help="record aten:: ranges with shapes")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--fused", choices=["auto", "triton", "cuda"], default=None,
                    help="use the bundled fused add+RMSNorm with this backend")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    torch.manual_seed(0)
    c = Config()
    with torch.device("cuda"):  # weights made on the GPU: no host-to-device copy in the trace
        model = TinyLlama(c, fused=args.fused).to(torch.bfloat16).eval()
    tokens = torch.randint(0, c.vocab, (c.batch, c.seq), device="cuda")
    ctx = (torch.autograd.profiler.emit_nvtx(record_shapes=True) if args.emit_nvtx
           else contextlib.nullcontext())
    with torch.no_grad(), ctx:
        for _ in range(args.steps):
            with _rng("forward"):
                model(tokens)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
