"""Training an MLP with a hand-written Shampoo preconditioner, as second-order optimizers are
written in research code: four Linear layers of 1024 x 1024 (ReLU between), batch 512 of random
inputs and targets, mean squared error, float32. The optimizer (``Shampoo`` below): for each
weight matrix W (out x in) and its gradient G, the statistics L = b L + G G^T and
R = b R + G^T G every step; their inverse fourth roots from ``torch.linalg.eigh`` of L + eps I
and R + eps I; the step L^-1/4 G R^-1/4 scaled to the gradient's norm (grafting), with momentum;
the biases by SGD with momentum.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): eight eigendecompositions of 1024 x 1024 every step (cuSOLVER's syevd: several
milliseconds each, much of it serial, each reading its convergence flags back to the host) beside
about 80 GFLOP of float32 GEMMs (forward, backward, statistics, roots and preconditioning).

    python w_shampoo_precond_train.py [--steps 30] [--fix every_10] [--fix batched_eigh] [--fix tf32]

Fixes:
  every_10      the roots recomputed every 10th step from the statistics (which are updated every
                step), the rest reuse the last roots: Shampoo's own practice (its "preconditioner
                update frequency").
  batched_eigh  the eight factors (all 1024 x 1024) stacked and decomposed in one
                ``torch.linalg.eigh`` call.
  tf32          TF32 for the float32 matmuls (the model's and the preconditioner's).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("every_10", "batched_eigh", "tf32")
CUDA_ONLY: tuple[str, ...] = ()
EPS = 1e-4        # added to each factor's diagonal before its root
BETA = 0.95       # the statistics' moving average


def inverse_roots(factors: list[torch.Tensor], batched: bool, eps: float = EPS) -> list[torch.Tensor]:
    """Each symmetric factor's (A + eps I)^-1/4, from its eigendecomposition: one
    ``torch.linalg.eigh`` per factor, or (``batched``) one per size over the factors of that size
    stacked (the program's are all of one size: one call)."""
    def root(a: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        w, v = torch.linalg.eigh(a + eps * eye)
        return (v * w.clamp_min(eps).pow(-0.25).unsqueeze(-2)) @ v.transpose(-2, -1)
    if not batched:
        return [root(a) for a in factors]
    out: list[torch.Tensor] = [factors[0]] * len(factors)
    for size in {a.shape for a in factors}:
        idx = [i for i, a in enumerate(factors) if a.shape == size]
        for i, r in zip(idx, root(torch.stack([factors[i] for i in idx])).unbind(0), strict=True):
            out[i] = r
    return out


class Shampoo(torch.optim.Optimizer):
    """Shampoo with grafting for 2-D parameters, SGD with momentum for the others (see the module
    docstring); ``every``: the steps between two computations of the roots; ``batched``: the
    roots of all factors from one eigh call (every factor of one size)."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.9, every: int = 1,
                 batched: bool = False) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})
        self.every, self.batched, self.steps = every, batched, 0

    @torch.no_grad()
    def step(self, closure=None) -> None:  # noqa: ARG002 (torch.optim's signature)
        mats = [p for g in self.param_groups for p in g["params"] if p.grad is not None and p.dim() == 2]
        for p in mats:
            st = self.state[p]
            if not st:
                st["L"] = torch.zeros(p.shape[0], p.shape[0], dtype=p.dtype, device=p.device)
                st["R"] = torch.zeros(p.shape[1], p.shape[1], dtype=p.dtype, device=p.device)
            g = p.grad
            st["L"].mul_(BETA).add_(g @ g.T)
            st["R"].mul_(BETA).add_(g.T @ g)
        if self.steps % self.every == 0:
            factors = [self.state[p][k] for p in mats for k in ("L", "R")]
            roots = inverse_roots(factors, self.batched)
            for i, p in enumerate(mats):
                self.state[p]["Li"], self.state[p]["Ri"] = roots[2 * i], roots[2 * i + 1]
        self.steps += 1
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st, g = self.state[p], p.grad
                if p.dim() == 2:
                    pre = st["Li"] @ g @ st["Ri"]
                    g = pre * (g.norm() / pre.norm().clamp_min(1e-30))   # grafted to the gradient's norm
                buf = st.get("momentum")
                if buf is None:
                    buf = st["momentum"] = g.clone()
                else:
                    buf.mul_(group["momentum"]).add_(g)
                p.add_(buf, alpha=-group["lr"])


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and its optimizer with ``fixes`` applied (``tf32`` is set by program_args);
    returns one training step (fresh random data; its loss)."""
    width, layers, batch = (32, 4, 16) if args.small else (1024, 4, 512)
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for i in range(layers):
        mods += [nn.Linear(width, width)] + ([nn.ReLU()] if i < layers - 1 else [])
    model = nn.Sequential(*mods).to(dev)
    opt = Shampoo(model.parameters(), every=10 if "every_10" in fixes else 1, batched="batched_eigh" in fixes)

    def step() -> torch.Tensor:
        x = torch.randn(batch, width, device=dev)
        y = torch.randn(batch, width, device=dev)
        return train_step(lambda: F.mse_loss(model(x), y), opt)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_shampoo_precond_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
