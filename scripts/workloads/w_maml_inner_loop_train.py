"""Meta-learning with MAML (Finn et al., 2017) as its reimplementations write it: 5-way 5-shot
image classification with the Conv-4 network of MAML's mini-ImageNet experiments (four blocks of
a 3 x 3 convolution with 32 filters, BatchNorm on the batch's statistics, ReLU and 2 x 2 max
pooling on 84 x 84 images, then a linear layer to the 5 classes). A meta-batch of 4 tasks (random
images made on the GPU: 25 support and 75 query images a task), walked by a Python loop over the
tasks; for each, 5 inner SGD steps (lr 0.01) on the support set, each its forward through
``torch.func.functional_call`` with the adapted weights and its gradients from
``torch.autograd.grad(..., create_graph=True)``; then the query loss at the adapted weights. The
meta-loss, the query losses' mean, goes back through every inner step (second order) into Adam
(lr 1e-3, PyTorch's default foreach implementation), fp32.

Each training step is an NVTX range ``train_step`` (``forward``, holding the inner loops,
``backward``, ``optimizer``).

Defect (if any): 20 inner steps a meta-step, one task at a time: each a forward of ~25 small
kernels over 25 images, a backward that builds its own graph (~50 more) and 18 weight updates
(two kernels each), then a meta-backward through all of it (the convolutions' and BatchNorm's
double backward, several times as long): ~8,000-10,000 launches of a few microseconds of GPU
each, and autograd's bookkeeping for the graph of graphs, for work the four tasks could share.

    python w_maml_inner_loop_train.py [--steps 30] [--fix vmap_tasks] [--fix first_order]
        [--fix bf16]

Fixes:
  vmap_tasks   the tasks batched: ``torch.func.vmap`` over the tasks of a function whose inner
               steps take ``torch.func.grad`` of the support loss (the same second-order
               meta-gradient, as functorch's MAML example computes it): 5 inner steps a meta-step,
               each on the 4 tasks' 100 images (per-task weights as grouped convolutions).
               BatchNorm's affine is applied after ``F.batch_norm`` instead of inside it (the same
               function and parameters): vmap's batching rule for the backward of a batch_norm
               with a weight gives a wrong second-order meta-gradient (pytorch/functorch#534: off
               by 0.1-0.3% of its norm in a float64 check), without one the right one.
  first_order  first-order MAML: the inner gradients taken without ``create_graph`` (constants to
               the meta-gradient), so the backward runs through the query forwards alone (an
               approximation of MAML's meta-gradient, not the same one).
  bf16         bf16 autocast over the forward (the inner loops and their gradients included).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("vmap_tasks", "first_order", "bf16")
CUDA_ONLY: tuple[str, ...] = ()
INNER_LR = 0.01


class AffineAfterBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm on the batch's statistics with its affine applied after ``F.batch_norm``: the
    same function and parameters as ``nn.BatchNorm2d(track_running_stats=False)``, whose second
    derivative vmap batches correctly (see the vmap_tasks fix)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(x, None, None, None, None, True, 0.0, self.eps)
        return y * self.weight[:, None, None] + self.bias[:, None, None]


class Conv4(nn.Module):
    """MAML's Conv-4: BatchNorm always on the batch's statistics (no running statistics), as in
    MAML, so that the network is a pure function of its weights and its batch (functional_call,
    vmap). ``affine_after``: its BatchNorms as ``AffineAfterBatchNorm2d`` (the same network)."""

    def __init__(self, width: int, blocks: int, size: int, ways: int, affine_after: bool = False) -> None:
        super().__init__()
        norm = AffineAfterBatchNorm2d if affine_after else nn.BatchNorm2d
        layers, cin = [], 3
        for _ in range(blocks):
            layers += [nn.Conv2d(cin, width, 3, padding=1), norm(width, track_running_stats=False),
                       nn.ReLU(), nn.MaxPool2d(2)]
            cin = width
            size //= 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width * size * size, ways)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def loss_with(net: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The network's cross-entropy on ``x`` with the weights ``params`` (a task's adapted ones)."""
    return F.cross_entropy(functional_call(net, params, (x,)), y)


def adapt_loop(net: nn.Module, params: dict[str, torch.Tensor], xs: torch.Tensor, ys: torch.Tensor,
               inner: int, second_order: bool) -> dict[str, torch.Tensor]:
    """One task's inner SGD steps by autograd.grad (create_graph for the second-order meta-gradient)."""
    for _ in range(inner):
        grads = torch.autograd.grad(loss_with(net, params, xs, ys), list(params.values()),
                                    create_graph=second_order)
        params = {k: p - INNER_LR * g for (k, p), g in zip(params.items(), grads)}
    return params


def meta_loss_loop(net: nn.Module, xs: torch.Tensor, ys: torch.Tensor, xq: torch.Tensor, yq: torch.Tensor,
                   inner: int, second_order: bool) -> torch.Tensor:
    """The meta-loss with a Python loop over the tasks (``xs``, ``xq``: tasks first)."""
    params = dict(net.named_parameters())
    losses = []
    for t in range(xs.shape[0]):
        fast = adapt_loop(net, params, xs[t], ys, inner, second_order)
        losses.append(loss_with(net, fast, xq[t], yq))
    return torch.stack(losses).mean()


def meta_loss_vmap(net: nn.Module, xs: torch.Tensor, ys: torch.Tensor, xq: torch.Tensor, yq: torch.Tensor,
                   inner: int, second_order: bool) -> torch.Tensor:
    """The same meta-loss with the tasks batched: vmap over the tasks of the inner steps, each by
    torch.func.grad (differentiable by the outer backward unless detached: first order)."""
    def task(params: dict[str, torch.Tensor], x_s: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
        for _ in range(inner):
            g = grad(lambda p: loss_with(net, p, x_s, ys))(params)
            if not second_order:
                g = {k: v.detach() for k, v in g.items()}
            params = {k: p - INNER_LR * g[k] for k, p in params.items()}
        return loss_with(net, params, x_q, yq)
    return vmap(task, in_dims=(None, 0, 0))(dict(net.named_parameters()), xs, xq).mean()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The network, Adam and the task sampler with ``fixes`` applied; returns one meta-training
    step (its meta-loss)."""
    width, blocks, size, ways, shots, queries, tasks, inner = 32, 4, 84, 5, 5, 15, 4, 5
    if args.small:
        width, blocks, size, ways, shots, queries, tasks, inner = 4, 2, 8, 3, 2, 2, 2, 2
    torch.manual_seed(0)
    net = Conv4(width, blocks, size, ways, affine_after="vmap_tasks" in fixes).to(dev).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    amp = bf16_autocast(dev, "bf16" in fixes)
    meta_loss = meta_loss_vmap if "vmap_tasks" in fixes else meta_loss_loop
    second_order = "first_order" not in fixes
    # each task's images come class by class: labels 0..ways-1, shots (queries) of each
    ys = torch.arange(ways, device=dev).repeat_interleave(shots)
    yq = torch.arange(ways, device=dev).repeat_interleave(queries)
    g = torch.Generator(device=dev).manual_seed(4)

    def forward() -> torch.Tensor:
        xs = torch.randn(tasks, ways * shots, 3, size, size, device=dev, generator=g)
        xq = torch.randn(tasks, ways * queries, 3, size, size, device=dev, generator=g)
        return meta_loss(net, xs, ys, xq, yq, inner, second_order)

    def step() -> torch.Tensor:
        return train_step(forward, opt, amp)
    step.model, step.opt, step.batch = net, opt, (ys, yq)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network, tasks and inner loop, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_maml_inner_loop_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last meta-loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
