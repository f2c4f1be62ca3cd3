"""Self-distillation with multi-crop (DINO's recipe), written the direct way: the student runs once
per crop and the teacher once per global crop, each crop its own forward. Two global crops of
96 x 96 and six local crops of 48 x 48 per image, 64 images a step (random crops made on the
GPU), a CNN backbone (eight 3 x 3 convolutions with BatchNorm, 64-512 channels) and DINO's
projection head (a 3-layer MLP to 256, L2-normalised, 4,096 prototypes); the teacher an EMA of
the student (multi-tensor updates), its outputs centred and sharpened; the cross-entropy of
every (global teacher crop, other student crop) pair; AdamW (PyTorch's default foreach
implementation), fp32.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``,
``teacher_update``).

Defect (if any): ten small forwards a step (eight of the student, two of the teacher) and eight
backwards, each a batch of 64, where the crops of one resolution could go through together:
several times the launches, each kernel on a quarter or less of the GPU's work.

    python w_multicrop_dino_train.py [--steps 30] [--fix grouped] [--fix bf16]
        [--fix channels_last] [--fix compile_reduce_overhead]

Fixes:
  grouped        the crops of each resolution concatenated, as DINO's code does: two student
                 forwards (128 global, 384 local images) and one teacher forward; the same loss
                 but for BatchNorm's batch statistics (over 128 and 384 images, not 64).
  bf16           bf16 autocast over the forwards and the loss.
  channels_last  both networks and the crops in ``torch.channels_last``.
  compile_reduce_overhead
                 student and teacher each ``torch.compile(net, mode="reduce-overhead")``: their
                 forwards (and the student's backward) fused and replayed as CUDA graphs, one per
                 crop size; the loss, the teacher's EMA and AdamW stay eager.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("grouped", "bf16", "channels_last", "compile_reduce_overhead")
CUDA_ONLY: tuple[str, ...] = ()
MOMENTUM, T_STUDENT, T_TEACHER, CENTER_M = 0.996, 0.1, 0.04, 0.9


def conv_bn(cin: int, cout: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class Net(nn.Module):
    """Backbone and DINO head: an image to its scores over the prototypes."""

    def __init__(self, widths: tuple[int, ...], hidden: int, bottleneck: int, prototypes: int) -> None:
        super().__init__()
        layers, cin = [], 3
        for w in widths:
            layers += conv_bn(cin, w, 2) + conv_bn(w, w, 1)
            cin = w
        self.backbone = nn.Sequential(*layers)
        self.mlp = nn.Sequential(nn.Linear(cin, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, bottleneck))
        self.last = nn.Linear(bottleneck, prototypes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(F.normalize(self.mlp(self.backbone(x).mean((2, 3))), dim=-1))


def dino_loss(student: list[torch.Tensor], teacher: list[torch.Tensor], center: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of every (teacher global crop i, student crop v != i) pair."""
    q = [F.softmax((t - center) / T_TEACHER, dim=-1) for t in teacher]
    logp = [F.log_softmax(s / T_STUDENT, dim=-1) for s in student]
    terms = [-(qi * lp).sum(-1).mean() for i, qi in enumerate(q) for v, lp in enumerate(logp) if v != i]
    return sum(terms) / len(terms)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """Student, teacher, the crops and AdamW with ``fixes`` applied; returns one training step."""
    widths, hidden, bottleneck, prototypes, n, big, small = (64, 128, 256, 512), 1024, 256, 4096, 64, 96, 48
    if args.small:
        widths, hidden, bottleneck, prototypes, n, big, small = (4, 8), 8, 4, 16, 3, 16, 8
    torch.manual_seed(0)
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    student = Net(widths, hidden, bottleneck, prototypes).to(dev).to(memory_format=fmt).train()
    teacher = Net(widths, hidden, bottleneck, prototypes).to(dev).to(memory_format=fmt).train()
    teacher.load_state_dict(student.state_dict())
    teacher.requires_grad_(False)
    s_params, t_params = list(student.parameters()), list(teacher.parameters())
    s_net, t_net = student, teacher
    if "compile_reduce_overhead" in fixes:
        s_net = torch.compile(student, mode="reduce-overhead")
        t_net = torch.compile(teacher, mode="reduce-overhead")
    opt = torch.optim.AdamW(s_params, lr=5e-4, weight_decay=0.04)
    amp = bf16_autocast(dev, "bf16" in fixes)
    center = torch.zeros(prototypes, device=dev)
    grouped = "grouped" in fixes
    g = torch.Generator(device=dev).manual_seed(4)

    def crops() -> tuple[torch.Tensor, torch.Tensor]:
        glob = torch.randn(2 * n, 3, big, big, device=dev, generator=g).contiguous(memory_format=fmt)
        loc = torch.randn(6 * n, 3, small, small, device=dev, generator=g).contiguous(memory_format=fmt)
        return glob, loc

    def forward() -> torch.Tensor:
        glob, loc = crops()
        if grouped:
            s_out = list(s_net(glob).chunk(2)) + list(s_net(loc).chunk(6))
            with torch.no_grad():
                t_out = list(t_net(glob).chunk(2))
        else:
            s_out = [s_net(c) for c in (*glob.chunk(2), *loc.chunk(6))]
            with torch.no_grad():
                t_out = [t_net(c) for c in glob.chunk(2)]
        loss = dino_loss(s_out, t_out, center)
        with torch.no_grad():
            center.mul_(CENTER_M).add_(torch.cat(t_out).float().mean(0), alpha=1 - CENTER_M)
        return loss

    def update_teacher(_loss: torch.Tensor) -> None:
        with nvtx("teacher_update"), torch.no_grad():
            torch._foreach_mul_(t_params, MOMENTUM)
            torch._foreach_add_(t_params, s_params, alpha=1 - MOMENTUM)

    def step() -> torch.Tensor:
        return train_step(forward, opt, amp, after=update_teacher)
    step.model, step.opt = student, opt
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny networks and crops, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_multicrop_dino_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
