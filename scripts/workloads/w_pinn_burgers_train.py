"""A physics-informed neural network for the viscous Burgers equation u_t + u u_x = nu u_xx on
x in [-1, 1], t in [0, 1], as PINN code is written: an MLP (x, t) -> u of 8 tanh layers of
width 64, fp32, whose loss is the equation's residual at 8,192 collocation points drawn afresh
each step plus the initial and boundary conditions at 1,024 points. The derivatives u_x, u_t and
u_xx come from ``torch.autograd.grad(..., create_graph=True)`` twice, and ``loss.backward()``
differentiates through both: a third-order autograd graph. Adam, lr 1e-3.

Each step is an NVTX range ``train_step`` holding ``forward`` (the network, its derivatives and
the loss), ``backward`` and ``optimizer``.

Defect: every kernel is small (8,192 x 64 GEMMs and elementwise passes of 2 MB) and there are
about a thousand of them a step, forward, the two derivative passes and the backward through
them: the host's issue of the launches sets the step, the GPU waits between them.

    python w_pinn_burgers_train.py [--steps 40] [--fix graph] [--fix fused_adam] [--fix tf32]

Fixes:
  graph       the whole step (points drawn, derivatives, loss, backward, ``Adam(capturable=True)``)
              captured in one CUDA graph and replayed each step.
  fused_adam  ``Adam(fused=True)``: one launch for the 18 parameters' update.
  tf32        ``torch.set_float32_matmul_precision("high")``: the GEMMs on TF32 tensor cores.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from _corpus import body_step, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("graph", "fused_adam", "tf32")
CUDA_ONLY = ("graph",)
NU = 0.01 / math.pi


def mlp(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(2, width), nn.Tanh()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def residual(net: nn.Module, xt: torch.Tensor) -> torch.Tensor:
    """Burgers' residual u_t + u u_x - nu u_xx at the points ``xt`` (N x 2: x, t), differentiable
    in the network's parameters (``create_graph``)."""
    xt = xt.requires_grad_(True)
    u = net(xt)
    du = torch.autograd.grad(u.sum(), xt, create_graph=True)[0]
    u_x, u_t = du[:, :1], du[:, 1:]
    u_xx = torch.autograd.grad(u_x.sum(), xt, create_graph=True)[0][:, :1]
    return u_t + u * u_x - NU * u_xx


def loss_fn(net: nn.Module, n_col: int, n_bc: int, span: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The PINN loss at fresh random points (the domain's corner ``lo`` and sides ``span``, on the
    device: no copy inside a CUDA graph's capture): the residual's mean square, and
    u(x, 0) = -sin(pi x), u(+-1, t) = 0."""
    dev = span.device
    col = torch.rand(n_col, 2, device=dev) * span + lo
    x0 = torch.rand(n_bc, 1, device=dev) * 2 - 1
    init = torch.cat([x0, torch.zeros_like(x0)], 1)
    tb = torch.rand(n_bc, 1, device=dev)
    side = torch.cat([torch.where(torch.rand(n_bc, 1, device=dev) < 0.5, -1.0, 1.0), tb], 1)
    r = residual(net, col)
    return (r.square().mean() + (net(init) + torch.sin(math.pi * x0)).square().mean()
            + net(side).square().mean())


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The network and optimizer with ``fixes`` applied; returns one training step (its loss)."""
    width, depth, n_col, n_bc = 64, 8, 8192, 1024
    if args.small:
        width, depth, n_col, n_bc = 16, 3, 256, 32
    torch.manual_seed(0)
    net = mlp(width, depth).to(dev)
    span, lo = torch.tensor([2.0, 1.0], device=dev), torch.tensor([-1.0, 0.0], device=dev)
    graph = "graph" in fixes
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True if "fused_adam" in fixes else None,
                           capturable=graph)

    return body_step(lambda: loss_fn(net, n_col, n_bc, span, lo), opt, graph)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_pinn_burgers_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
