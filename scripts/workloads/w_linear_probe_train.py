"""A linear probe, as transfer-learning scripts write it: a pretrained backbone is meant to stay
fixed and only a new classifier is trained, so the optimizer is given the classifier's
parameters alone; the backbone is left as loaded (``requires_grad`` on, train mode). The
backbone: a ResNet-18-shaped CNN (written out here: four stages of two basic blocks, 64-512
channels, 11 M parameters) on 128 x 128 images, a batch of 256 (random images made on the GPU),
100 classes, bf16 autocast, SGD with momentum on the classifier.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): ``loss.backward()`` goes through the whole backbone: every convolution's input
and weight gradients (about twice the forward's work) and the accumulation of 11 M gradients that
no optimizer steps nor zeroes, for a step that trains 51 K parameters.

    python w_linear_probe_train.py [--steps 30] [--fix frozen] [--fix channels_last]
        [--fix compile]

Fixes:
  frozen         ``backbone.requires_grad_(False)``: the backward stops at the classifier (the
                 backbone kept in train mode, its BatchNorm statistics still updated).
  channels_last  model and images in ``torch.channels_last``.
  compile        ``torch.compile(model)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("frozen", "channels_last", "compile")
CUDA_ONLY: tuple[str, ...] = ()


class Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.short(x))


class Backbone(nn.Module):
    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x)).mean((2, 3))


class Probe(nn.Module):
    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.backbone, self.head = Backbone(widths), nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model (its backbone as loaded), a batch and SGD over the classifier with ``fixes``
    applied; returns one training step (its loss)."""
    widths, size, classes, batch = (64, 128, 256, 512), 128, 100, 256
    if args.small:
        widths, size, classes, batch = (4, 8), 16, 3, 4
    torch.manual_seed(0)
    model = Probe(widths, classes).to(dev).train()
    if "frozen" in fixes:
        model.backbone.requires_grad_(False)
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    model = model.to(memory_format=fmt)
    fwd = torch.compile(model) if "compile" in fixes else model
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    amp = bf16_autocast(dev, True)
    g = torch.Generator(device=dev).manual_seed(4)
    x = torch.randn(batch, 3, size, size, device=dev, generator=g).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=dev, generator=g)

    def step() -> torch.Tensor:
        return train_step(lambda: F.cross_entropy(fwd(x), y), opt, amp)
    step.model, step.opt, step.batch = model, opt, (x, y)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_linear_probe_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
