"""Sharpness-aware minimisation (Foret et al., 2021: "Sharpness-Aware Minimization for Efficiently
Improving Generalization") as its most used re-implementation writes it: a wrapper optimizer
whose first step walks the parameters in Python (each gradient's norm, stacked into the global
norm, then per parameter a copy of the weight and ``p.add_(p.grad * scale)``), a second forward
and backward at the perturbed weights, and a second step that restores each weight and runs the
base optimizer (SGD, momentum 0.9, Nesterov, weight decay 5e-4, PyTorch's default foreach
implementation). The model: a Wide ResNet 16-4 (three groups of two pre-activation blocks, 64,
128 and 256 channels, at 32, 16 and 8 pixels: 2.7 M parameters in 44 tensors), a batch of 128
CIFAR-sized 32 x 32 images of 10 classes (random, made on the GPU), fp32 NCHW (cuDNN's
convolutions in TF32, its default), label smoothing 0.1.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``sam_ascent``,
``forward``, ``backward``, ``optimizer``).

Defect (if any): two forward-backward passes a step is SAM's price, not a defect; the wrapper's
per-parameter loops add ~250 small kernels a step (a norm, a copy, a multiply and an add per
tensor, then a copy back), beside ~1,000 of the two passes.

    python w_sam_wrn_train.py [--steps 30] [--fix foreach_sam] [--fix channels_last_bf16]
        [--fix fused_sgd] [--fix compile]

Fixes:
  foreach_sam         the ascent and the restore with ``torch._foreach_*`` (one norm, one copy,
                      one scaled add over the list), as fused SAM implementations do.
  channels_last_bf16  model and images in ``torch.channels_last``, bf16 autocast over both
                      forwards and the losses.
  fused_sgd           ``SGD(fused=True)`` as the base optimizer.
  compile             ``torch.compile(model)`` (both passes; the wrapper's loops stay eager).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("foreach_sam", "channels_last_bf16", "fused_sgd", "compile")
CUDA_ONLY: tuple[str, ...] = ()


class SAM:
    """SAM around a base optimizer, its two steps as the common re-implementation writes them
    (``foreach``: the same arithmetic over the parameter list in multi-tensor ops)."""

    def __init__(self, params, base: torch.optim.Optimizer, rho: float = 0.05, foreach: bool = False) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.base, self.rho, self.foreach = base, rho, foreach
        self.old: list[torch.Tensor] = []

    @torch.no_grad()
    def first_step(self) -> None:
        ps = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in ps]
        if self.foreach:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            self.old = [p.clone() for p in ps] if not self.old else self.old
            torch._foreach_copy_(self.old, ps)
            torch._foreach_add_(ps, torch._foreach_mul(grads, self.rho / (norm + 1e-12)))
        else:
            norm = torch.norm(torch.stack([g.norm(p=2) for g in grads]), p=2)
            scale = self.rho / (norm + 1e-12)
            self.old = []
            for p in ps:
                self.old.append(p.data.clone())
                p.add_(p.grad * scale.to(p))
        self.base.zero_grad(set_to_none=True)

    @torch.no_grad()
    def second_step(self) -> None:
        ps = [p for p in self.params if p.grad is not None]
        if self.foreach:
            torch._foreach_copy_(ps, self.old)
        else:
            for p, old in zip(ps, self.old):
                p.data = old
        self.base.step()
        self.base.zero_grad(set_to_none=True)


class Block(nn.Module):
    """A pre-activation wide block: BN, ReLU, 3x3 conv, BN, ReLU, 3x3 conv, plus the shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(cin), nn.BatchNorm2d(cout)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.short = nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn1(x))
        y = self.conv2(F.relu(self.bn2(self.conv1(o))))
        return y + (self.short(o) if self.short is not None else x)


class WideResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], per_group: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        layers, cin = [], 16
        for i, w in enumerate(widths):
            for j in range(per_group):
                layers.append(Block(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
        self.body = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.body(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The network, SAM over SGD and a fixed batch with ``fixes`` applied; returns one training
    step (its first pass's loss)."""
    widths, per_group, batch, size, classes = (64, 128, 256), 2, 128, 32, 10
    if args.small:
        widths, per_group, batch, size, classes = (4, 8, 8), 1, 4, 8, 3
    fmt = torch.channels_last if "channels_last_bf16" in fixes else torch.contiguous_format
    torch.manual_seed(0)
    model = WideResNet(widths, per_group, classes).to(dev, memory_format=fmt).train()
    fwd = torch.compile(model) if "compile" in fixes else model
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4,
                           fused=True if "fused_sgd" in fixes else None)
    sam = SAM(model.parameters(), base, foreach="foreach_sam" in fixes)
    amp = bf16_autocast(dev, "channels_last_bf16" in fixes)
    g = torch.Generator(device=dev).manual_seed(7)
    x = torch.randn(batch, 3, size, size, device=dev, generator=g).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=dev, generator=g)

    def loss_at() -> torch.Tensor:
        with nvtx("forward"), amp():
            loss = F.cross_entropy(fwd(x), y, label_smoothing=0.1)
        with nvtx("backward"):
            loss.backward()
        return loss

    def step() -> torch.Tensor:
        with nvtx("train_step"):
            loss = loss_at()
            with nvtx("sam_ascent"):
                sam.first_step()
            loss_at()
            with nvtx("optimizer"):
                sam.second_step()
        return loss.detach()
    step.model, step.sam, step.batch = model, sam, (x, y)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_sam_wrn_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
