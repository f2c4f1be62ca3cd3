"""ResNet-18 inference (torchvision, random weights, fp32), batch 32 of 224 x 224 images that
arrive in ordinary (pageable) host memory and are copied in with a plain ``x.to("cuda")``.

The batches come from a pool of 8 preprocessed CPU tensors (random, made once), as a serving
loop's request buffers would be. Each batch is an NVTX range ``infer`` holding ``copy_in`` and
``forward``; predictions stay on the GPU until the end.

Defect: a copy from pageable memory goes through a staging buffer and is synchronous: the CPU
waits for the GPU to finish the previous batch, then for the 19 MB copy itself, and only then
launches the forward. Copy and compute never overlap.

    python w_resnet18_pageable.py [--steps 40] [--fix pinned] [--fix channels_last_bf16]

Fixes:
  pinned              the pool allocated in page-locked memory (``pin_memory()``, once) and
                      copied with ``non_blocking=True``: the copy is a DMA queued on the stream,
                      the CPU runs ahead, and the copy engine works at full speed.
  channels_last_bf16  model and input in bf16 and channels_last (the input is converted on the
                      GPU after the copy): faster convolutions, but the same pageable copy, which
                      stays the bottleneck; alone it does not pay (the conversion adds a pass).
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch
import torchvision

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("pinned", "channels_last_bf16")
CUDA_ONLY = ("pinned",)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and the host batches with ``fixes`` applied; returns one batch's step (the
    annotated copy in and forward; the predictions)."""
    batch, size = (2, 64) if args.small else (32, 224)
    model = torchvision.models.resnet18(num_classes=1000).to(dev).eval()
    dtype = torch.float32
    if "channels_last_bf16" in fixes:
        dtype = torch.bfloat16
        model = model.to(dtype, memory_format=torch.channels_last)
    pool = [torch.randn(batch, 3, size, size) for _ in range(8)]  # preprocessed batches on the host
    if "pinned" in fixes:
        pool = [t.pin_memory() for t in pool]  # pinned once; never written again, so no race
    count = itertools.count()

    @torch.no_grad()
    def step() -> torch.Tensor:
        with nvtx("infer"):
            with nvtx("copy_in"):
                x = pool[next(count) % len(pool)].to(dev, non_blocking="pinned" in fixes)
                if "channels_last_bf16" in fixes:
                    x = x.to(dtype, memory_format=torch.channels_last)
            with nvtx("forward"):
                return model(x).argmax(1)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    steps_help="batches (the first ones are warm-up)",
                                    small_help="tiny batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_resnet18_pageable: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"first preds {ran[1][-1][:4].tolist()}")


if __name__ == "__main__":
    main()
