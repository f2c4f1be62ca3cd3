"""Inference with the weights offloaded to host memory and streamed in layer by layer, as
sequential CPU offload does it (accelerate's ``cpu_offload``: each layer's weights moved to the
GPU just before its forward, dropped after): a stack of 6 pre-norm decoder layers of a 7B-class
model's shape (width 4,096, 32 heads, causal ``scaled_dot_product_attention``, a GELU MLP of
16,384; 201 M parameters a layer, 2.4 GB in all), bf16 weights kept in ordinary (pageable) host
memory as loaded. Each batch scores 4 sequences of 512 tokens (their input hidden states random,
made on the GPU) under ``torch.no_grad()``; each layer's 12 weight tensors are copied to the GPU
with ``.to(device)`` and the layer run on them through ``torch.func.functional_call``.

Each batch is an NVTX range ``infer``.

Defect (if any): 2.4 GB crosses PCIe every batch, from pageable memory: each copy is staged by the
driver through a pinned buffer and blocks the CPU until it is done, at a fraction of the link's
rate, and nothing else runs meanwhile (the GPU waits for each layer's weights, then the copy
engine waits for the layer's compute): ~5 TFLOP of bf16 GEMMs (~10 ms of the GPU's) behind
hundreds of milliseconds of copies, for weights that would fit on an 80 GB GPU 30 times over.

    python w_weight_streaming_infer.py [--steps 30] [--fix pinned | --fix prefetch | --fix resident]

Fixes:
  pinned    the host weights in pinned (page-locked) memory, copied with ``non_blocking=True``:
            the link's full rate and the CPU free to queue ahead; copies and compute still take
            turns on one stream.
  prefetch  pinned weights, and the next layer's copied on a side stream while this layer
            computes (double buffering: an event orders each layer after its copy,
            ``record_stream`` keeps its memory alive until its compute is done).
  resident  all the weights on the GPU (2.4 GB), no copies.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("pinned", "prefetch", "resident")
CUDA_ONLY = ("pinned", "prefetch")
ALTERNATIVES = (("pinned", "prefetch"), ("pinned", "resident"), ("prefetch", "resident"))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_blocks(layers: int, d: int, heads: int, ff: int, dev: torch.device) -> nn.ModuleList:
    """The layers in bf16 in host memory, as loaded from a checkpoint (initialised on ``dev``,
    where it is fast, one layer at a time, and copied out)."""
    blocks = nn.ModuleList()
    for _ in range(layers):
        with torch.device(dev):
            blk = Block(d, heads, ff)
        blocks.append(blk.to(torch.bfloat16).to("cpu").eval())
    return blocks


def streamed(blocks: nn.ModuleList, dev: torch.device, pinned: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """Each layer's weights copied to ``dev`` just before its forward (from pinned memory without
    blocking the CPU, else blocking it), one stream."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        for blk in blocks:
            w = {n: p.to(dev, non_blocking=pinned) for n, p in blk.named_parameters()}
            x = functional_call(blk, w, (x,))
        return x
    return forward


def resident(blocks: nn.ModuleList) -> Callable[[torch.Tensor], torch.Tensor]:
    """The layers run on their own weights, already on the GPU."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        for blk in blocks:
            x = blk(x)
        return x
    return forward


def prefetched(blocks: nn.ModuleList, dev: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """Double buffering: the next layer's pinned weights copied on a side stream while this layer
    computes on the current stream."""
    side = torch.cuda.Stream(dev)

    def fetch(blk: nn.Module) -> tuple[dict[str, torch.Tensor], torch.cuda.Event]:
        with torch.cuda.stream(side):
            w = {n: p.to(dev, non_blocking=True) for n, p in blk.named_parameters()}
            done = torch.cuda.Event()
            done.record(side)
        return w, done

    def forward(x: torch.Tensor) -> torch.Tensor:
        main = torch.cuda.current_stream(dev)
        nxt = fetch(blocks[0])
        for i, blk in enumerate(blocks):
            w, done = nxt
            main.wait_event(done)
            for t in w.values():  # allocated on the side stream, used (and freed) on this one
                t.record_stream(main)
            if i + 1 < len(blocks):
                nxt = fetch(blocks[i + 1])
            x = functional_call(blk, w, (x,))
            del w
        return x
    return forward


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The layers with ``fixes`` applied; returns one batch (the last layer's hidden states)."""
    d, heads, ff, layers, batch, seq = 4096, 32, 16384, 6, 4, 512
    if args.small:
        d, heads, ff, layers, batch, seq = 16, 2, 32, 2, 2, 6
    torch.manual_seed(0)
    blocks = make_blocks(layers, d, heads, ff, dev)
    if "resident" in fixes:
        blocks = blocks.to(dev)
        forward = resident(blocks)
    else:
        if fixes & {"pinned", "prefetch"}:
            for p in blocks.parameters():
                p.data = p.data.pin_memory()
        forward = (prefetched(blocks, dev) if "prefetch" in fixes
                   else streamed(blocks, dev, pinned="pinned" in fixes))
    g = torch.Generator(device=dev).manual_seed(4)

    @torch.no_grad()
    def step() -> torch.Tensor:
        x = torch.randn(batch, seq, d, device=dev, dtype=torch.bfloat16, generator=g)
        with nvtx("infer"):
            return forward(x)
    step.model = blocks
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=30,
                                    steps_help="batches (the first ones are warm-up)",
                                    small_help="tiny layers and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_weight_streaming_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"last mean {ran[1][-1].float().mean().item():.4f}")


if __name__ == "__main__":
    main()
