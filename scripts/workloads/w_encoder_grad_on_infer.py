"""Sentence embeddings from an ``nn.TransformerEncoder`` run for inference with autograd left on,
as evaluation code that calls ``model.eval()`` but forgets ``torch.no_grad()`` does: 6 layers,
width 512, 8 heads, feed-forward 2048, fp32, weights random; batches of 32 sentences of 16 to
128 tokens, padded to 128 with a key padding mask; the embedding is the mean over the real
tokens.

Each call is one batch: an NVTX range ``infer``.

Defect: with gradients enabled, every op records its autograd node and keeps the tensors a
backward would need, and ``nn.TransformerEncoderLayer`` cannot take its inference fast path
(one fused op per layer, and nested tensors that skip the padding): each layer runs as some
twenty separate kernels over all 128 positions, padding included.

    python w_encoder_grad_on_infer.py [--steps 40] [--fix inference_mode] [--fix bf16]
                                      [--fix bf16_inference]

Fixes:
  inference_mode  the call under ``torch.inference_mode()``: no autograd records, and the
                  encoder's fast path with nested tensors (the padding skipped).
  bf16            the call under bf16 autocast, autograd still on (the fast path stays off
                  under autocast).
  bf16_inference  the model cast to bf16 once and called under ``torch.inference_mode()``.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("inference_mode", "bf16", "bf16_inference")
CUDA_ONLY: tuple[str, ...] = ()


class Embedder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, ff: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(max_len, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, batch_first=True, norm_first=False)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=True)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        h = self.enc(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return (h * keep).sum(1) / keep.sum(1)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The encoder with ``fixes`` applied; returns one call (the batch's embeddings)."""
    vocab, d, heads, ff, layers, batch, seq = 30000, 512, 8, 2048, 6, 32, 128
    if args.small:
        vocab, d, heads, ff, layers, batch, seq = 50, 16, 2, 32, 2, 3, 8
    torch.manual_seed(0)
    model = Embedder(vocab, d, heads, ff, layers, seq).to(dev).eval()
    if "bf16_inference" in fixes:
        model = model.to(torch.bfloat16)
    gen = torch.Generator(device=dev).manual_seed(1)
    batches = []
    for _ in range(4):
        ids = torch.randint(1, vocab, (batch, seq), device=dev, generator=gen)
        lengths = torch.randint(seq // 8, seq + 1, (batch,), device=dev, generator=gen)
        lengths[0] = seq   # one full sentence: the padded width stays seq
        pad = torch.arange(seq, device=dev)[None, :] >= lengths[:, None]
        batches.append((ids.masked_fill(pad, 0), pad))
    state = {"i": 0}
    inference = "inference_mode" in fixes or "bf16_inference" in fixes
    amp = (lambda: torch.autocast(dev.type, torch.bfloat16)) if "bf16" in fixes else contextlib.nullcontext

    def step() -> torch.Tensor:
        with nvtx("infer"):
            ids, pad = batches[state["i"] % len(batches)]
            state["i"] += 1
            with (torch.inference_mode() if inference else contextlib.nullcontext()), amp():
                # kept as a plain tensor (a caller that stores the outputs keeps no graph)
                return model(ids, pad).detach()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, alternatives=[("bf16", "bf16_inference")],
                                    steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_encoder_grad_on_infer: {args.steps} calls, fixes {sorted(fixes) or 'none'}, "
              f"last mean |embedding| {ran[1][-1].float().abs().mean().item():.4f}")


if __name__ == "__main__":
    main()
