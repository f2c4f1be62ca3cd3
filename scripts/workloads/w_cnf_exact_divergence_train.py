"""Training a continuous normalizing flow (FFJORD-style) whose log-density change is integrated
with the exact divergence of its dynamics: 32-dimensional data (a mixture of 8 Gaussians, fresh
samples each step, batch 1,024), dynamics ``f(z, t)`` a 3-layer tanh MLP of width 512, 8 fixed
Euler steps from the data to the base distribution, ``log p(x) = log N(z_1; 0, I) + sum of
div f dt``; fp32, Adam.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: the divergence (the trace of df/dz) is computed one dimension at a time, as the
textbook formula reads: ``autograd.grad(f[:, i].sum(), z, create_graph=True)[0][:, i]`` for
``i`` in 0..31, so each Euler step runs 32 backward passes through the MLP (kept in the graph
for the loss's own backward: double backward), each a few small kernels launched from Python,
and keeps one column of each.

    python w_cnf_exact_divergence_train.py [--steps 30] [--fix batched_grads|hutchinson] [--fix tf32]

Fixes:
  batched_grads  the same exact divergence from one call,
                 ``autograd.grad(f, z, grad_outputs=I, is_grads_batched=True)`` (the 32 backward
                 passes vmapped into one of batched kernels), its diagonal summed.
  hutchinson     FFJORD's estimator instead: one Gaussian probe ``e`` a step, ``e^T (df/dz) e``
                 from one backward pass (unbiased, not exact: the training's objective changes
                 by its variance).
  tf32           TF32 for the MLP's fp32 matmuls.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from _corpus import program_args, run, train_step  # noqa: E402

FIXES = ("batched_grads", "hutchinson", "tf32")
CUDA_ONLY: tuple[str, ...] = ()


class Dynamics(nn.Module):
    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                 nn.Linear(width, dim))

    def forward(self, z: torch.Tensor, t: float) -> torch.Tensor:
        return self.net(torch.cat([z, torch.full_like(z[:, :1], t)], 1))


def divergence_loop(f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Exact trace of df/dz per sample, one output dimension (one backward pass) at a time."""
    return sum(torch.autograd.grad(f[:, i].sum(), z, create_graph=True)[0][:, i] for i in range(z.shape[1]))


def divergence_batched(f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The same exact trace from one batched backward pass: the rows of the identity as the
    grad_outputs, vmapped (``is_grads_batched``)."""
    d = z.shape[1]
    eye = torch.eye(d, device=z.device, dtype=z.dtype)[:, None, :].expand(d, *z.shape)
    jac = torch.autograd.grad(f, z, grad_outputs=eye, create_graph=True, is_grads_batched=True)[0]  # [i, b, j]
    return jac.diagonal(dim1=0, dim2=2).sum(-1)


def divergence_hutchinson(f: torch.Tensor, z: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``e^T (df/dz) e`` per sample: an unbiased estimate of the trace for E[e e^T] = I."""
    return (torch.autograd.grad(f, z, grad_outputs=e, create_graph=True)[0] * e).sum(1)


def negative_log_likelihood(model: Dynamics, x: torch.Tensor, steps: int, div: str) -> torch.Tensor:
    """Mean -log p(x): x carried to the base distribution by ``steps`` Euler steps, the change of
    log-density accumulated from the divergence computed as ``div`` says."""
    z, dt, logdet = x.requires_grad_(True), 1.0 / steps, torch.zeros(x.shape[0], device=x.device)
    for k in range(steps):
        f = model(z, k * dt)
        if div == "loop":
            d = divergence_loop(f, z)
        elif div == "batched":
            d = divergence_batched(f, z)
        else:
            d = divergence_hutchinson(f, z, torch.randn_like(z))
        z, logdet = z + dt * f, logdet + dt * d
    base = -0.5 * (z ** 2).sum(1) - 0.5 * z.shape[1] * torch.log(torch.tensor(2 * torch.pi))
    return -(base + logdet).mean()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The flow and optimizer with ``fixes`` applied; returns one training step (fresh samples of
    the data; the step's loss)."""
    dim, width, batch, steps, modes = 32, 512, 1024, 8, 8
    if args.small:
        dim, width, batch, steps, modes = 4, 16, 8, 2, 2
    torch.manual_seed(0)
    model = Dynamics(dim, width).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    centres = 3.0 * torch.randn(modes, dim, device=dev)
    div = "batched" if "batched_grads" in fixes else "hutchinson" if "hutchinson" in fixes else "loop"

    def step() -> torch.Tensor:
        x = centres[torch.randint(0, modes, (batch,), device=dev)] + 0.5 * torch.randn(batch, dim, device=dev)
        return train_step(lambda: negative_log_likelihood(model, x, steps, div), opt)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("batched_grads", "hutchinson")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_cnf_exact_divergence_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
