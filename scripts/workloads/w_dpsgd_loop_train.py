"""Differentially private training (DP-SGD: Abadi et al., 2016) with its per-sample gradients taken
the simplest way: a Python loop over the batch, one forward and backward per sample, each
sample's gradient clipped to norm 1 (``clip_grad_norm_``-style, computed over all parameters)
and added into an accumulator, then Gaussian noise (sigma 1.0) added and the mean taken as the
gradient. The model: a small CNN for 32 x 32 images (conv 3-32, conv 32-64 with pooling,
conv 64-128 with pooling, a linear layer to 10 classes, GroupNorm rather than BatchNorm as DP
requires: 0.3 M parameters in 14 tensors), a batch of 64 (random images made on the GPU), SGD
(momentum 0.9, PyTorch's default foreach implementation), fp32.

Each training step is an NVTX range ``train_step`` (``per_sample``, holding each sample's
forward and backward, ``noise``, ``optimizer``).

Defect (if any): 64 forwards and backwards of one image each: ~60 small kernels a sample
forward and backward and ~45 for its clipping and accumulation (a norm per tensor, the total
norm, a scale, an add per tensor): ~6,700 launches a step of a few microseconds of GPU each.

    python w_dpsgd_loop_train.py [--steps 30] [--fix vmap_grads] [--fix graph] [--fix bf16]

Fixes:
  vmap_grads  the per-sample gradients of the whole batch in one pass: ``torch.func.vmap`` of
              ``torch.func.grad`` over the batch, then the per-sample norms, clipping and sum as
              batched ops (the same clipped, noised gradient).
  graph       the whole step (the loop, the noise, SGD's step) captured once in a CUDA graph and
              replayed.
  bf16        bf16 autocast over each sample's forward and loss (the loop kept).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, capture_training, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("vmap_grads", "graph", "bf16")
CUDA_ONLY = ("graph",)
CLIP, SIGMA = 1.0, 1.0


class Net(nn.Module):
    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        a, b, c = widths
        self.c1, self.c2, self.c3 = nn.Conv2d(3, a, 3, padding=1), nn.Conv2d(a, b, 3, padding=1), nn.Conv2d(b, c, 3, padding=1)
        self.g1, self.g2, self.g3 = nn.GroupNorm(8, a), nn.GroupNorm(8, b), nn.GroupNorm(8, c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.g1(self.c1(x)))
        x = F.max_pool2d(F.relu(self.g2(self.c2(x))), 2)
        x = F.max_pool2d(F.relu(self.g3(self.c3(x))), 2)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def loop_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp) -> list[torch.Tensor]:
    """The clipped per-sample gradients summed, one sample at a time."""
    params = [p for p in model.parameters()]
    acc = [torch.zeros_like(p) for p in params]
    for i in range(x.shape[0]):
        with amp():
            loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        grads = torch.autograd.grad(loss, params)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = torch.clamp(CLIP / (norm + 1e-6), max=1.0)
        for a, g in zip(acc, grads):
            a.add_(g * scale)
    return acc


def vmap_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp) -> list[torch.Tensor]:
    """The same sum from every sample's gradient at once (torch.func)."""
    from torch.func import functional_call, grad, vmap
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach() for n, p in model.named_parameters()}

    def one(p, xi, yi):
        with amp():
            out = functional_call(model, p, (xi[None],))
        return F.cross_entropy(out, yi[None])
    per = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    flat = [per[n].flatten(1) for n in names]
    norm = torch.linalg.vector_norm(torch.cat(flat, dim=1), dim=1)
    scale = torch.clamp(CLIP / (norm + 1e-6), max=1.0)
    return [torch.einsum("b,b...->...", scale, per[n]) for n in names]


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, the batch and SGD with ``fixes`` applied; returns one training step (the sum of
    the clipped gradients' first element, as a tensor)."""
    widths, classes, batch, size = (32, 64, 128), 10, 64, 32
    if args.small:
        widths, classes, batch, size = (8, 8, 8), 3, 4, 8
    torch.manual_seed(0)
    model = Net(widths, classes).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    amp = bf16_autocast(dev, "bf16" in fixes)
    g = torch.Generator(device=dev).manual_seed(9)
    x = torch.randn(batch, 3, size, size, device=dev, generator=g)
    y = torch.randint(0, classes, (batch,), device=dev, generator=g)
    per_sample = vmap_grads if "vmap_grads" in fixes else loop_grads
    params = list(model.parameters())

    def body() -> torch.Tensor:
        with nvtx("per_sample"):
            acc = per_sample(model, x, y, amp)
        with nvtx("noise"):
            for p, a in zip(params, acc):
                p.grad = (a + SIGMA * CLIP * torch.randn_like(a)) / batch
        with nvtx("optimizer"):
            opt.step()
        return acc[0].detach().sum()

    if "graph" in fixes:
        graph, out = capture_training(body, opt)

        def replay() -> torch.Tensor:
            with nvtx("train_step"):
                graph.replay()
            return out
        return replay

    def step() -> torch.Tensor:
        with nvtx("train_step"):
            out = body()
            opt.zero_grad(set_to_none=True)
        return out
    step.model, step.batch = model, (x, y)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_dpsgd_loop_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last sum {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
