"""An orthogonal RNN, as written for long sequences: the recurrent weight is kept orthogonal by
``torch.nn.utils.parametrizations.orthogonal`` (PyTorch's default map for a square matrix: the
matrix exponential of a skew-symmetric one), and the cell is stepped by a Python loop over time.
Hidden 256, 64 time steps of 32 features, a batch of 128 (random sequences made on the GPU),
10 classes read from the last state, Adam (lr 1e-3, PyTorch's default foreach implementation),
fp32.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): reading ``rec.weight`` runs the parametrization, so each of the 64 time steps
computes the 256 x 256 matrix exponential again (a dozen GEMMs and their element-wise work), and
the backward differentiates each of the 64 (a matrix exponential of twice the size each), though
the weight is the same all step.

    python w_orthogonal_rnn_train.py [--steps 30] [--fix cached] [--fix bf16] [--fix fused_adam]

Fixes:
  cached      the forward under ``torch.nn.utils.parametrize.cached()``: the weight computed once a
              step, its backward once.
  bf16        bf16 autocast over the forward (the loop and the parametrization kept).
  fused_adam  ``Adam(fused=True)``.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations, parametrize

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("cached", "bf16", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()


class OrthoRNN(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.rec = parametrizations.orthogonal(nn.Linear(hidden, hidden, bias=False))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.inp(x)                      # every time step's input projection at once
        h = torch.zeros(x.shape[0], self.rec.out_features, device=x.device, dtype=u.dtype)
        for t in range(x.shape[1]):
            h = torch.tanh(u[:, t] + self.rec(h))   # rec.weight: the parametrization runs here
        return self.head(h)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, a batch and Adam with ``fixes`` applied; returns one training step (its loss)."""
    features, hidden, steps_t, classes, batch = 32, 256, 64, 10, 128
    if args.small:
        features, hidden, steps_t, classes, batch = 4, 6, 5, 3, 4
    torch.manual_seed(0)
    model = OrthoRNN(features, hidden, classes).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True if "fused_adam" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)
    once = parametrize.cached if "cached" in fixes else contextlib.nullcontext
    g = torch.Generator(device=dev).manual_seed(4)
    x = torch.randn(batch, steps_t, features, device=dev, generator=g)
    y = torch.randint(0, classes, (batch,), device=dev, generator=g)

    def forward() -> torch.Tensor:
        with once():
            return F.cross_entropy(model(x), y)

    def step() -> torch.Tensor:
        return train_step(forward, opt, amp)
    step.model, step.opt, step.batch = model, opt, (x, y)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network and sequence, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_orthogonal_rnn_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
