"""Training a deep ensemble one member at a time: 8 MLP classifiers (512 -> 1024 -> 1024 -> 10,
ReLU; 1.6M parameters each), each with its own AdamW (PyTorch's default: foreach on CUDA),
trained on the same batch of 512 fresh random inputs and labels, fp32. Uncertainty estimation
and RL critics train ensembles this way: a Python loop over the members, each stepped as if it
were the only model.

Each step is an NVTX range ``train_step``; inside it each member's ``forward``, ``backward`` and
``optimizer`` (or, fused, one of each for all the members).

Defect: the eight members' work is the same short sequence of small kernels issued eight times a
step: about 40 launches and an optimizer's Python per member, each GEMM a few microseconds of
a GPU that waits for the host, where the eight could run as one model of batched matrix
products.

    python w_ensemble_loop_train.py [--steps 40] [--fix vmapped | --fix one_backward] [--fix fused_adamw]

Fixes:
  vmapped       the members' parameters stacked (``torch.func.stack_module_state``) and run as
                one model with ``torch.func.vmap`` over ``functional_call``: one forward of
                batched GEMMs, one backward, one AdamW over the stacked parameters.
  one_backward  the members' losses summed: the forwards in the loop, then one backward and one
                AdamW over every member's parameters (foreach launches over all of them).
  fused_adamw   ``AdamW(fused=True)`` (per member, or for the stacked or joined parameters).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("vmapped", "one_backward", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


def mlp(din: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(din, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


def adamw(params, fixes: set[str]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True if "fused_adamw" in fixes else None)


def stacked(members: list[nn.Module]) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[torch.Tensor]]:
    """The members as one vmapped model: a function of the batch giving every member's logits
    ([members, batch, classes]), and its stacked parameters (leaves that need gradients)."""
    params, buffers = torch.func.stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")

    def one(p, b, x):
        return torch.func.functional_call(base, (p, b), (x,))

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.func.vmap(one, in_dims=(0, 0, None))(params, buffers, x)
    return forward, list(params.values())


def ensemble_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The members' mean cross-entropies summed (each member's gradient its own loss's)."""
    e, b, c = logits.shape
    return F.cross_entropy(logits.reshape(e * b, c), labels.repeat(e), reduction="sum") / b


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The ensemble and its optimizers with ``fixes`` applied; returns one training step (fresh
    inputs and labels; the members' summed loss, kept on the GPU)."""
    n, din, hidden, classes, batch = 8, 512, 1024, 10, 512
    if args.small:
        n, din, hidden, classes, batch = 3, 16, 32, 4, 8
    torch.manual_seed(0)
    members = [mlp(din, hidden, classes).to(dev) for _ in range(n)]
    if "vmapped" in fixes:
        forward, params = stacked(members)
        opt = adamw(params, fixes)
    elif "one_backward" in fixes:
        opt = adamw([p for m in members for p in m.parameters()], fixes)
    else:
        opts = [adamw(m.parameters(), fixes) for m in members]

    def step() -> torch.Tensor:
        x = torch.randn(batch, din, device=dev)
        y = torch.randint(0, classes, (batch,), device=dev)
        with nvtx("train_step"):
            if fixes & {"vmapped", "one_backward"}:   # one loss, one backward, one optimizer
                with nvtx("forward"):
                    loss = (ensemble_loss(forward(x), y) if "vmapped" in fixes
                            else sum(F.cross_entropy(m(x), y) for m in members))
                with nvtx("backward"):
                    loss.backward()
                with nvtx("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                return loss.detach()
            total = torch.zeros((), device=dev)
            for m, o in zip(members, opts):
                with nvtx("forward"):
                    loss = F.cross_entropy(m(x), y)
                with nvtx("backward"):
                    loss.backward()
                with nvtx("optimizer"):
                    o.step()
                    o.zero_grad(set_to_none=True)
                total += loss.detach()
            return total
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, alternatives=[("vmapped", "one_backward")],
                                    small_help="three tiny members and a small batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_ensemble_loop_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
