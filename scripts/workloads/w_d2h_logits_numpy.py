"""A scoring loop that brings the full logits to the host: a small bf16 decoder LM (6 layers,
d=1024, 16 heads, SDPA, vocabulary 32,000, random weights) scores batches of 2 x 256 token ids,
and each batch's logits, cast to fp32 ([2, 256, 32000]: 66 MB), are copied to ordinary
(pageable) host memory with ``.cpu()`` and reduced there with ``numpy.argmax`` to the predicted
token at every position, which is compared with the next input token (a greedy-match accuracy,
as an offline evaluation script computes it). The token ids are made on the host and copied in.

Each batch is an NVTX range ``score_batch`` holding ``forward``, ``copy_out`` and ``argmax``.

Defect: the GPU's part is about a millisecond; then 66 MB go through a pageable copy (staged
through a driver buffer, synchronous, into freshly allocated host memory) and numpy's
single-threaded argmax walks 16M floats, while the GPU waits for the next batch.

    python w_d2h_logits_numpy.py [--steps 30] [--fix argmax_gpu | --fix pinned | --fix half_copy]

Fixes:
  argmax_gpu  ``logits.argmax(-1)`` on the GPU and only the 512 token ids copied (4 KB); numpy
              compares ids as before.
  pinned      one page-locked host buffer allocated once; the logits copied into it with
              ``copy_(non_blocking=True)`` and an event waited for; numpy's argmax kept: the copy
              at DMA speed, the host's argmax pass unchanged.
  half_copy   the logits copied in fp16 (half the bytes, still pageable), then widened to fp32 on
              the host before numpy's argmax: a smaller copy for one more host pass.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("argmax_gpu", "pinned", "half_copy")
CUDA_ONLY = ("pinned",)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.ln(self.blocks(x)))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], float]:
    """The model (and the pinned buffer) with ``fixes`` applied; returns one batch's scoring (its
    greedy-match accuracy, a float on the host)."""
    vocab, d, heads, layers, batch, seq = 32000, 1024, 16, 6, 2, 256
    if args.small:
        vocab, d, heads, layers, batch, seq = 500, 64, 4, 2, 2, 32
    model = LM(vocab, d, heads, layers, seq).to(dev, torch.bfloat16).eval()
    if "pinned" in fixes:
        host = torch.empty(batch, seq, vocab, dtype=torch.float32, pin_memory=True)
        copied = torch.cuda.Event()

    @torch.no_grad()
    def step() -> float:
        ids = torch.randint(0, vocab, (batch, seq))  # a tokenised batch on the host
        with nvtx("score_batch"):
            with nvtx("forward"):
                logits = model(ids.to(dev)).float()
            with nvtx("copy_out"):
                if "argmax_gpu" in fixes:
                    pred = logits.argmax(-1).cpu().numpy()
                elif "pinned" in fixes:
                    host.copy_(logits, non_blocking=True)
                    copied.record()
                    copied.synchronize()
                    arr = host.numpy()
                elif "half_copy" in fixes:
                    arr = logits.half().cpu().float().numpy()
                else:
                    arr = logits.cpu().numpy()
            with nvtx("argmax"):
                if "argmax_gpu" not in fixes:
                    pred = np.argmax(arr, axis=-1)
                target = ids.numpy()
                return float((pred[:, :-1] == target[:, 1:]).mean())
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("argmax_gpu", "pinned"), ("argmax_gpu", "half_copy"),
                                                  ("pinned", "half_copy")],
                                    steps_help="batches (the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_d2h_logits_numpy: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"greedy match {np.mean(ran[1]):.5f}")


if __name__ == "__main__":
    main()
