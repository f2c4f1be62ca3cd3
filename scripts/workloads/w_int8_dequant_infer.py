"""Batched inference of a decoder-only LM whose linear layers hold int8 weights, quantized per
output channel and dequantized in Python at every call, as hand-rolled weight-only quantization
does it: ``F.linear(x, self.q.to(x.dtype) * self.scale[:, None])`` (8 pre-norm blocks, width
2048, 16 heads, SwiGLU feed-forward 5632, vocabulary 32000; bf16 activations and norms, the
embedding and the head in bf16). Each call scores a batch of 16 sequences of 64 tokens (the
logits of the last position), as a reranker or a classifier head on an LM does.

Each call is an NVTX range ``infer``.

Defect: every call rebuilds each weight in bf16 before its GEMM: the int8 weight read, a bf16
copy written by the cast, read and written again by the scaling, then read by the GEMM: about
7 bytes moved per parameter where a bf16 weight is read once (2 bytes), and two more kernels a
linear layer.

    python w_int8_dequant_infer.py [--steps 40] [--fix bf16_weights] [--fix compile] [--fix graph]

Fixes:
  bf16_weights  the weights dequantized once at load and kept in bf16 (twice the int8 memory).
  compile       the model under ``torch.compile`` (default mode).
  graph         the call captured in a CUDA graph and replayed (the input copied in).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import graphed, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16_weights", "compile", "graph")
CUDA_ONLY = ("graph",)


class QLinear(nn.Module):
    """A linear layer of int8 weights with one scale per output channel (symmetric)."""

    def __init__(self, fin: int, fout: int, dequantized: bool) -> None:
        super().__init__()
        w = torch.randn(fout, fin) / fin ** 0.5
        scale = w.abs().amax(1) / 127
        self.register_buffer("q", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.w = None
        if dequantized:
            self.w = (self.q.to(torch.bfloat16) * self.scale[:, None])

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.w is not None:
            self.w = self.q.to(torch.bfloat16) * self.scale[:, None]   # on the buffers' device
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w if self.w is not None else self.q.to(x.dtype) * self.scale[:, None]
        return F.linear(x, w)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, deq: bool) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = QLinear(d, 3 * d, deq), QLinear(d, d, deq)
        self.gate, self.up, self.down = QLinear(d, ff, deq), QLinear(d, ff, deq), QLinear(ff, d, deq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class QLM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, ff: int, layers: int, deq: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*(Block(d, heads, ff, deq) for _ in range(layers)))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.tok(ids))[:, -1]))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model with ``fixes`` applied; returns one call (the last positions' logits)."""
    vocab, d, heads, ff, layers, batch, seq = 32000, 2048, 16, 5632, 8, 16, 64
    if args.small:
        vocab, d, heads, ff, layers, batch, seq = 64, 32, 4, 48, 2, 2, 8
    torch.manual_seed(0)
    model = QLM(vocab, d, heads, ff, layers, "bf16_weights" in fixes).to(dev)
    model = model.to(torch.bfloat16).eval()   # (int8 buffers stay int8)
    fwd = torch.compile(model) if "compile" in fixes else model
    gen = torch.Generator(device=dev).manual_seed(1)
    batches = [torch.randint(0, vocab, (batch, seq), device=dev, generator=gen) for _ in range(4)]
    state = {"i": 0}
    call = fwd
    if "graph" in fixes:
        with torch.inference_mode():
            call = graphed(fwd, batches[0].clone())

    @torch.inference_mode()
    def step() -> torch.Tensor:
        with nvtx("infer"):
            ids = batches[state["i"] % len(batches)]
            state["i"] += 1
            return call(ids)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, alternatives=[("compile", "graph")], steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_int8_dequant_infer: {args.steps} calls, fixes {sorted(fixes) or 'none'}, "
              f"last mean logit {ran[1][-1].float().mean().item():.4f}")


if __name__ == "__main__":
    main()
