"""A neural ODE classifier (Chen et al., 2018; the ODE-Net of torchdiffeq's examples, on feature
vectors) trained through a hand-written adaptive Dormand-Prince solver, discretise-then-optimise:
a linear encoder from 64 features to a 256-wide state, its dynamics ``dz/dt = f(z)`` a 3-layer
tanh MLP of width 512 (256 -> 512 -> 512 -> 256, autonomous; Glorot-normal weights with tanh's
gain, zero biases) integrated from t = 0 to 3 by RK45 (Dormand-Prince 5(4), first same as last:
six new evaluations an attempt, the first step 0.05) with error control at rtol = atol = 1e-5
(FFJORD's training tolerances), a linear head to 10 classes and a cross entropy; the loss
backpropagates through every accepted step's stages. The solver is written as such code usually
is: each attempt's error (its RMS against the mixed tolerance) is read with ``.item()``, and
the host decides whether to accept the step and how long the next one is (safety 0.9, the
factor clamped to 0.2-10). Batch 512 of a fresh draw from a 10-Gaussian mixture a step (the
classes overlap: the loss stays near 2), Adam (lr 1e-3, PyTorch's default foreach
implementation), fp32.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): every attempt of the solver waits for the GPU (``.item()``) before the host
can decide on the next one, and each attempt is ~100 small launches over a 512 x 256 state: six
MLP evaluations (three GEMMs of 512 rows each, ~0.54 GFLOP an evaluation), the stages'
combinations written term by term (a scalar product and an add a term: ~46 elementwise kernels)
and the error norm's ~20 more. At the full size the solver takes 12-13 attempts a solve (~75
evaluations, none rejected; measured on the CPU before any GPU run, over the first 30 steps),
so a step launches ~1,200 kernels forward with 12 waits and ~1,750 backward, each over a few
hundred KB. The work follows the weights: the attempts grow slowly as training goes on.

    python w_neural_ode_adaptive_train.py [--steps 30] [--fix fixed_rk4 | --fix gpu_control]
        [--fix compile] [--fix bf16]

Fixes:
  fixed_rk4    a fixed-step classical RK4 with as many evaluations as the adaptive solver takes
               on average (19 steps, 76 evaluations): no error estimate, no control, no waits;
               the solution is no longer held to the tolerance (a change of the method).
  gpu_control  the same adaptive solver with its control on the GPU: the error ratio, the
               accept/reject decision (``torch.where`` on the state, the reused last stage and
               the time) and the next step are tensors, over a fixed 20 attempts (the baseline's
               12-13 with room for their growth in training); the attempts after t = 3 have a
               zero step and change nothing, but are computed all the same, forward and
               backward. No wait in the step (the time reached is kept on the GPU, unread).
  compile      ``torch.compile`` of the ODE function (the MLP), default mode: one compiled graph
               called at every evaluation, its backward compiled too; the solver's arithmetic
               and its waits stay eager.
  bf16         bf16 autocast over the forward and the loss: the MLP's GEMMs in bf16, the state
               float32 (each combination promotes the bf16 stages). The error estimate, a
               difference of two combinations of the stages, then carries their bf16 rounding
               (~4e-3 of each) against a tolerance of 1e-5: on the CPU the solver took ~110
               attempts a solve instead of 12.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("fixed_rk4", "gpu_control", "compile", "bf16")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("fixed_rk4", "gpu_control"),)
RTOL = ATOL = 1e-5
SAFETY, MIN_FACTOR, MAX_FACTOR = 0.9, 0.2, 10.0
FIRST_STEP = 0.05
RK4_STEPS = 19          # 76 evaluations: the adaptive solver's average at the full size
MAX_ATTEMPTS = 20       # gpu_control's fixed number of attempts
MAX_HOST_ATTEMPTS = 1000

# Dormand-Prince 5(4): the stages' coefficients (row i: stage i + 2 from stages 1..i + 1), the
# 5th-order weights (the last row: stage 7 is f at the new state, the next step's first) and the
# error weights (5th order minus 4th)
A = ((1 / 5,),
     (3 / 40, 9 / 40),
     (44 / 45, -56 / 15, 32 / 9),
     (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
     (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656))
B = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84)
E = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)


def combine(y: torch.Tensor, h, coeffs, ks) -> torch.Tensor:
    """``y + h * sum(c_i k_i)``, term by term as such code writes it (zero terms skipped)."""
    acc = None
    for c, k in zip(coeffs, ks):
        if c == 0.0:
            continue
        term = c * k
        acc = term if acc is None else acc + term
    return y + h * acc


def dopri5_step(f: Callable[[torch.Tensor], torch.Tensor], y: torch.Tensor, k1: torch.Tensor, h
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Dormand-Prince attempt of length ``h`` (a float or a 0-d tensor) from ``y``, ``k1 =
    f(y)`` given: the 5th-order state, its local error estimate (5th order minus 4th) and
    ``f`` at the new state (the next attempt's ``k1`` if this one is accepted)."""
    ks = [k1]
    for row in A:
        ks.append(f(combine(y, h, row, ks)))
    y_new = combine(y, h, B, ks)
    ks.append(f(y_new))
    err = h * _weighted(E, ks)
    return y_new, err, ks[-1]


def _weighted(coeffs, ks) -> torch.Tensor:
    acc = None
    for c, k in zip(coeffs, ks):
        if c != 0.0:
            acc = c * k if acc is None else acc + c * k
    return acc


def error_ratio(err: torch.Tensor, y: torch.Tensor, y_new: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """The error's RMS against the mixed tolerance ``atol + rtol * max(|y|, |y_new|)``: an
    attempt is accepted at 1 or below."""
    tol = atol + rtol * torch.maximum(y.abs(), y_new.abs())
    return (err / tol).pow(2).mean().sqrt()


def next_factor(ratio: float) -> float:
    """The step's change after an attempt of error ratio ``ratio``: 0.9 * ratio^(-1/5), clamped."""
    if ratio == 0.0:
        return MAX_FACTOR
    return min(MAX_FACTOR, max(MIN_FACTOR, SAFETY * ratio ** -0.2))


class Stats:
    """What the solver did: attempts, accepted steps and function evaluations, summed."""

    def __init__(self) -> None:
        self.solves = self.attempts = self.accepted = self.nfe = 0

    def per_solve(self) -> tuple[float, float, float]:
        n = max(self.solves, 1)
        return self.attempts / n, self.accepted / n, self.nfe / n


def odeint_host(f, y0: torch.Tensor, t1: float, rtol: float = RTOL, atol: float = ATOL,
                h0: float = FIRST_STEP, stats: Optional[Stats] = None) -> torch.Tensor:
    """Adaptive RK45 from t = 0 to ``t1``, its control on the host: ``.item()`` of each
    attempt's error ratio (a wait for the GPU), accept or reject, the next step's length."""
    t, y, h = 0.0, y0, h0
    k1 = f(y0)
    attempts = accepted = 0
    while t < t1:
        last = h >= t1 - t
        if last:
            h = t1 - t
        y_new, err, k7 = dopri5_step(f, y, k1, h)
        ratio = error_ratio(err, y, y_new, rtol, atol).item()     # waits for the GPU
        attempts += 1
        if ratio <= 1.0:
            t, y, k1 = (t1 if last else t + h), y_new, k7
            accepted += 1
        h *= next_factor(ratio)
        if attempts > MAX_HOST_ATTEMPTS:
            raise RuntimeError(f"odeint_host: more than {MAX_HOST_ATTEMPTS} attempts (t = {t:.4g})")
    if stats is not None:
        stats.solves += 1
        stats.attempts += attempts
        stats.accepted += accepted
        stats.nfe += 1 + 6 * attempts
    return y


def odeint_gpu(f, y0: torch.Tensor, t1: float, rtol: float = RTOL, atol: float = ATOL,
               h0: float = FIRST_STEP, attempts: int = MAX_ATTEMPTS, stats: Optional[Stats] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same solver with its control on the GPU: ``attempts`` attempts whatever happens, each
    accepted or not by ``torch.where``, the step a 0-d tensor (zero once t reaches ``t1``: such
    an attempt changes nothing). No gradient goes through the control. Returns the state and
    the time reached (a 0-d tensor, t1 when the attempts sufficed), read by no one in the step."""
    dev = y0.device
    t = torch.zeros((), device=dev, dtype=torch.float64)
    h = torch.full((), h0, device=dev, dtype=torch.float64)
    end = torch.full((), t1, device=dev, dtype=torch.float64)
    y, k1 = y0, f(y0)
    for _ in range(attempts):
        h = torch.minimum(h, end - t)
        hs = h.to(y0.dtype)
        y_new, err, k7 = dopri5_step(f, y, k1, hs)
        with torch.no_grad():
            ratio = error_ratio(err, y, y_new, rtol, atol).double()
            accept = ratio <= 1.0
            factor = (SAFETY * ratio.pow(-0.2)).nan_to_num(MAX_FACTOR).clamp(MIN_FACTOR, MAX_FACTOR)
        y = torch.where(accept, y_new, y)
        k1 = torch.where(accept, k7, k1)
        t = torch.where(accept, torch.where(h >= end - t, end, t + h), t)
        h = h * factor
    if stats is not None:
        stats.solves += 1
        stats.attempts += attempts
        stats.nfe += 1 + 6 * attempts
    return y, t


def odeint_rk4(f, y0: torch.Tensor, t1: float, steps: int = RK4_STEPS, stats: Optional[Stats] = None) -> torch.Tensor:
    """Classical RK4, ``steps`` equal steps from 0 to ``t1``: four evaluations a step, no control."""
    h = t1 / steps
    y = y0
    for _ in range(steps):
        k1 = f(y)
        k2 = f(y + (h / 2) * k1)
        k3 = f(y + (h / 2) * k2)
        k4 = f(y + h * k3)
        y = y + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
    if stats is not None:
        stats.solves += 1
        stats.attempts += steps
        stats.accepted += steps
        stats.nfe += 4 * steps
    return y


class ODEFunc(nn.Module):
    """The dynamics: an autonomous 3-layer tanh MLP, ``dim`` -> ``width`` -> ``width`` -> ``dim``."""

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                 nn.Linear(width, dim))
        for layer in self.net:
            if isinstance(layer, nn.Linear):     # Glorot's init with tanh's gain, biases zero
                nn.init.xavier_normal_(layer.weight, gain=nn.init.calculate_gain("tanh"))
                nn.init.zeros_(layer.bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class ODEBlock(nn.Module):
    """The state at t = ``t1`` of ``dz/dt = func(z)`` from ``z``, by the solver ``method``: "host"
    (adaptive, its control on the host), "gpu" (adaptive, its control on the GPU) or "rk4"
    (fixed steps)."""

    def __init__(self, func: nn.Module, method: str = "host", t1: float = 3.0) -> None:
        super().__init__()
        self.func, self.method, self.t1 = func, method, t1
        self.stats = Stats()
        self.reached: Optional[torch.Tensor] = None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.method == "rk4":
            return odeint_rk4(self.func, z, self.t1, stats=self.stats)
        if self.method == "gpu":
            z, self.reached = odeint_gpu(self.func, z, self.t1, stats=self.stats)
            return z
        return odeint_host(self.func, z, self.t1, stats=self.stats)


def mixture(n_classes: int, features: int, dev: torch.device) -> torch.Tensor:
    """The class means of the data: a fixed draw (N(0, 0.15^2) a feature: with unit noise the
    classes overlap)."""
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(n_classes, features, generator=g) * 0.15).to(dev)


def batch_of(means: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh batch of the mixture: labels, and each sample its class mean plus unit noise."""
    y = torch.randint(0, means.shape[0], (batch,), device=means.device)
    return means[y] + torch.randn(batch, means.shape[1], device=means.device), y


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The classifier, its solver and Adam with ``fixes`` applied; returns one training step
    (a fresh batch; its loss)."""
    features, dim, width, classes, batch = 64, 256, 512, 10, 512
    if args.small:
        features, dim, width, classes, batch = 8, 16, 32, 4, 32
    method = "rk4" if "fixed_rk4" in fixes else "gpu" if "gpu_control" in fixes else "host"
    torch.manual_seed(0)
    func = ODEFunc(dim, width)
    block = ODEBlock(func, method)
    model = nn.Sequential(nn.Linear(features, dim), block, nn.Linear(dim, classes)).to(dev)
    if "compile" in fixes:
        block.func = torch.compile(func)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    amp = bf16_autocast(dev, "bf16" in fixes)
    means = mixture(classes, features, dev)

    def step() -> torch.Tensor:
        x, y = batch_of(means, batch)
        return train_step(lambda: F.cross_entropy(model(x), y), opt, amp)
    step.model, step.block, step.opt, step.means = model, block, opt, means
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=30,
                                    small_help="tiny model and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        step, losses = ran
        attempts, accepted, nfe = step.block.stats.per_solve()
        print(f"w_neural_ode_adaptive_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {losses[-1].item():.3f}; per solve {attempts:.1f} attempts, {accepted:.1f} accepted, "
              f"{nfe:.1f} evaluations")


if __name__ == "__main__":
    main()
