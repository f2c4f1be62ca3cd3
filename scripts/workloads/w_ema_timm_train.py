"""Image-classifier training with an exponential moving average of the weights: timm's
ConvNeXt-Atto (``timm.create_model("convnext_atto", pretrained=False)``, 3.7M parameters in 128
tensors; its MLPs are 1 x 1 convolutions), batch 128 of 224 x 224 images, fp32, AdamW with
PyTorch's default implementation (foreach on CUDA), fresh random images and labels made on the
GPU each step, and an EMA copy of the model updated after every optimizer step the way many
training scripts write it: a Python loop over the parameters,
``ema_p.mul_(decay).add_(p, alpha=1 - decay)`` for each tensor.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward``, ``optimizer`` and
``ema``.

Defects: the EMA issues two tiny kernels per parameter tensor (256 launches a step, each moving
a few KB to a few hundred KB); everything runs in fp32 (cuDNN's convolutions as TF32, but the
depthwise convolutions, LayerNorm2d and GELU passes over fp32 activations are memory-bound);
AdamW's foreach passes.

    python w_ema_timm_train.py [--steps 40] [--fix foreach_ema] [--fix fused_adamw] [--fix bf16]

Fixes:
  foreach_ema  the EMA as one ``torch._foreach_lerp_(ema_params, params, 1 - decay)``: a handful of
               multi-tensor kernels instead of 256 launches.
  fused_adamw  ``AdamW(fused=True)``.
  bf16         forward and loss under ``torch.autocast(bfloat16)``.
"""
from __future__ import annotations

import copy
from typing import Callable

import timm
import torch
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("foreach_ema", "fused_adamw", "bf16")
CUDA_ONLY: tuple[str, ...] = ()
DECAY = 0.9998


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, its EMA copy and the optimizer with ``fixes`` applied; returns one training step
    (fresh images and labels; its loss)."""
    name, batch, size, classes = "convnext_atto", 128, 224, 1000
    if args.small:
        batch, size, classes = 2, 64, 10
    model = timm.create_model(name, pretrained=False, num_classes=classes).to(dev).train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    params, ema_params = list(model.parameters()), list(ema.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05,
                            fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)

    @torch.no_grad()
    def update_ema() -> None:
        with nvtx("ema"):
            if "foreach_ema" in fixes:
                torch._foreach_lerp_(ema_params, params, 1 - DECAY)
            else:
                for ema_p, p in zip(ema_params, params):
                    ema_p.mul_(DECAY).add_(p, alpha=1 - DECAY)

    def step() -> torch.Tensor:
        x = torch.randn(batch, 3, size, size, device=dev)
        y = torch.randint(0, classes, (batch,), device=dev)
        return train_step(lambda: F.cross_entropy(model(x), y), opt, amp, after=lambda _: update_ema())
    # how far the average has fallen behind the weights: read once, after the loop
    step.ema_distance = lambda: sum((e - p).abs().sum() for e, p in zip(ema_params, params)).item()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    small_help="tiny images and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_ema_timm_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, loss {ran[1][-1].item():.3f}, "
              f"EMA distance {ran[0].ema_distance():.4g}")


if __name__ == "__main__":
    main()
