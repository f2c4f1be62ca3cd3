"""An image-classifier training step already compiled with ``torch.compile(model)`` (default
mode): a plain-PyTorch ViT-B/16 (12 blocks, d=768, 12 heads, MLP 3072, SDPA attention, class
token, 1000 classes; random weights), batch 64 of 224 x 224 images, bf16 autocast, AdamW with
PyTorch's default implementation (foreach on CUDA), fresh random images and labels made on the
GPU each step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.
Compilation happens in the first steps, which are warm-up: allow tens of seconds the first time
on a machine (Inductor's caches make later runs faster).

About 6.8 TFLOP a step, nearly all of it cuBLAS GEMMs and flash attention; Inductor's fused
LayerNorm/GELU/residual kernels are a minority of the GPU time, and the CPU, launching compiled
code, stays ahead of the GPU.

    python w_compiled_step_train.py [--steps 40] [--fix reduce_overhead] [--fix fused_adamw]

Fixes:
  reduce_overhead  ``torch.compile(model, mode="reduce-overhead")``: forward and backward replayed
                   as CUDA graphs (``cudagraph_mark_step_begin()`` each step). Removes launch
                   overhead that the GPU-bound step already hides: expected ~1.0x.
  fused_adamw      ``AdamW(fused=True)``: one kernel over the 86M fp32 weights, grads and states
                   instead of about ten foreach passes: ~1 ms of a ~15 ms step.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("reduce_overhead", "fused_adamw")
CUDA_ONLY = ("reduce_overhead",)


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
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, size: int, patch: int, d: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), 1) + self.pos
        return self.head(self.ln(self.blocks(x))[:, 0])


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The compiled model and optimizer with ``fixes`` applied; returns one training step (fresh
    images and labels; its loss)."""
    size, patch, d, heads, layers, classes, batch = 224, 16, 768, 12, 12, 1000, 64
    if args.small:
        size, patch, d, heads, layers, classes, batch = 32, 8, 64, 4, 2, 10, 2
    model = ViT(size, patch, d, heads, layers, classes).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05,
                            fused=True if "fused_adamw" in fixes else None)
    graphs = "reduce_overhead" in fixes
    cmodel = torch.compile(model, mode="reduce-overhead" if graphs else None)
    amp = bf16_autocast(dev)

    def step() -> torch.Tensor:
        x = torch.randn(batch, 3, size, size, device=dev)
        y = torch.randint(0, classes, (batch,), device=dev)
        # with graphs, a new iteration: the graphs may overwrite the previous step's outputs
        return train_step(lambda: F.cross_entropy(cmodel(x), y), opt, amp,
                          before=torch.compiler.cudagraph_mark_step_begin if graphs else None)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_compiled_step_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
