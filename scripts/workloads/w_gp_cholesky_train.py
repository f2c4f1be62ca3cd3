"""Fitting an exact Gaussian process's hyperparameters by its marginal likelihood, as a
hand-written GP (or a textbook) does it: 4,096 training points in 8 dimensions, an RBF kernel
with one lengthscale a dimension, an output scale and a noise level (softplus-parametrised),
the 4,096 x 4,096 kernel matrix in float64, ``torch.linalg.cholesky`` of it, the data fit from
``torch.cholesky_solve`` and the log-determinant from the factor's diagonal; Adam, full batch
(the same data every step, as a GP's fit is).

Each optimisation step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): cuSOLVER's Cholesky factorisation and the backward's triangular solves in
float64 on a GPU whose float64 rate is a fraction of its float32 rate with tensor cores, and
``linalg.cholesky`` checking the factorisation's status on the host each call (a wait for the
GPU before the solve is even launched).

    python w_gp_cholesky_train.py [--steps 30] [--fix fp32] [--fix cholesky_ex]

Fixes:
  fp32         the kernel matrix and the factorisation in float32, with a jitter of 1e-4 on the
               diagonal for stability (the usual float32 GP recipe).
  cholesky_ex  ``torch.linalg.cholesky_ex`` (the status returned on the GPU, not checked): no
               wait on the host inside the step.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import program_args, run, train_step  # noqa: E402

FIXES = ("fp32", "cholesky_ex")
CUDA_ONLY: tuple[str, ...] = ()


class ExactGP(nn.Module):
    def __init__(self, dims: int) -> None:
        super().__init__()
        self.raw_lengthscale = nn.Parameter(torch.zeros(dims))
        self.raw_outputscale = nn.Parameter(torch.zeros(()))
        self.raw_noise = nn.Parameter(torch.full((), -2.0))

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        z = x / F.softplus(self.raw_lengthscale)
        sq = (z * z).sum(1)
        d2 = (sq[:, None] + sq[None, :] - 2 * z @ z.T).clamp(min=0)
        return F.softplus(self.raw_outputscale) * torch.exp(-0.5 * d2)

    def forward(self, x: torch.Tensor, y: torch.Tensor, jitter: float, ex: bool) -> torch.Tensor:
        """Negative log marginal likelihood of ``y`` per point."""
        n = x.shape[0]
        k = self.kernel(x) + (F.softplus(self.raw_noise) + jitter) * torch.eye(n, device=x.device, dtype=x.dtype)
        chol = torch.linalg.cholesky_ex(k)[0] if ex else torch.linalg.cholesky(k)
        alpha = torch.cholesky_solve(y[:, None], chol)[:, 0]
        return (0.5 * (y * alpha).sum() + chol.diagonal().log().sum() + 0.5 * n * math.log(2 * math.pi)) / n


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The data and the model in the fix's precision; returns one optimisation step (the step's
    loss)."""
    n, dims = 4096, 8
    if args.small:
        n, dims = 64, 2
    dtype = torch.float32 if "fp32" in fixes else torch.float64
    jitter = 1e-4 if "fp32" in fixes else 0.0
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, dims, generator=gen, dtype=torch.float64) * 4
    y = torch.sin(x * torch.linspace(0.5, 2.0, dims, dtype=torch.float64)).sum(1) + 0.1 * torch.randn(n, generator=gen,
                                                                                                    dtype=torch.float64)
    x, y = x.to(dev, dtype), y.to(dev, dtype)
    torch.manual_seed(0)
    model = ExactGP(dims).to(dev, dtype)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)

    def step() -> torch.Tensor:
        return train_step(lambda: model(x, y, jitter, "cholesky_ex" in fixes), opt)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30, steps_help="optimisation steps (the "
                                    "first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_gp_cholesky_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
