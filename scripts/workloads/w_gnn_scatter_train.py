"""Full-batch GraphSAGE training on a large random graph, the message passing hand-written with
``index_select`` and ``index_add_`` over the edge list: 1M nodes, 10M directed edges (uniform at
random), 128 input features, 2 SAGE layers (mean aggregation, hidden 128, ReLU, dropout), 47
classes (an ogbn-products-sized problem), fp32, Adam with PyTorch's default implementation
(foreach on CUDA), random features and labels, the loss over a 30% training split.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defect: the aggregation materialises one message row per edge (``x[src]``: 10M x 128 floats,
5 GB) and adds them into their destination rows with atomics; the backward of the second layer
does the same in the other direction. The step is a few passes of several GB each, bound by
memory traffic and atomics, while the weights are only 45K parameters.

    python w_gnn_scatter_train.py [--steps 30] [--fix csr_spmm] [--fix bf16] [--fix fused_adam]

Fixes:
  csr_spmm    the mean aggregation as a sparse matrix product: the normalised adjacency (and its
              transpose, for the backward) built once as CSR tensors, ``A @ x`` with cuSPARSE's
              SpMM: no per-edge messages written, no atomics.
  bf16        node features stored in bf16 and the forward under ``torch.autocast(bfloat16)``:
              the messages and sums are bf16, half the bytes (bf16 atomics may be slower).
  fused_adam  ``Adam(fused=True)``: the optimizer is a few tiny kernels over 45K parameters;
              no gain expected (a control).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("csr_spmm", "bf16", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()


class Graph:
    """A random directed graph as an edge list (``src`` -> ``dst``), with in-degrees; with
    ``csr``, the mean-aggregation matrix A (rows: destinations) and its transpose as CSR."""

    def __init__(self, nodes: int, edges: int, dev: torch.device, csr: bool, dtype: torch.dtype) -> None:
        self.n = nodes
        self.src = torch.randint(0, nodes, (edges,), device=dev)
        self.dst = torch.randint(0, nodes, (edges,), device=dev)
        self.deg = torch.bincount(self.dst, minlength=nodes).clamp(min=1)
        self.a = self.at = None
        if csr:
            inv = (1.0 / self.deg.float()).to(dtype)
            self.a = self._csr(self.dst, self.src, inv[self.dst])
            self.at = self._csr(self.src, self.dst, inv[self.dst])

    def _csr(self, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(rows)
        crow = torch.zeros(self.n + 1, dtype=torch.long, device=rows.device)
        crow[1:] = torch.cumsum(torch.bincount(rows, minlength=self.n), 0)
        return torch.sparse_csr_tensor(crow, cols[order], vals[order], (self.n, self.n))


class SpMM(torch.autograd.Function):
    """``A @ x`` for a CSR ``A`` whose transpose ``At`` is kept, so that the backward is one more
    SpMM rather than a transpose of A each step."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, at: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.at = at
        with torch.autocast(x.device.type, enabled=False):  # autocast would cast A to bf16
            return a @ x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, ctx.at @ grad.to(ctx.at.dtype)


def mean_aggregate(g: Graph, x: torch.Tensor) -> torch.Tensor:
    """Each node's mean over its in-neighbours' rows of ``x``."""
    if g.a is not None:
        return SpMM.apply(g.a, g.at, x.to(g.a.dtype))
    msg = x.index_select(0, g.src)                          # one row per edge
    out = x.new_zeros(g.n, x.shape[1]).index_add_(0, g.dst, msg)
    return out / g.deg.to(out.dtype)[:, None]


class SAGE(nn.Module):
    def __init__(self, cin: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.l1, self.r1 = nn.Linear(cin, hidden), nn.Linear(cin, hidden, bias=False)
        self.l2, self.r2 = nn.Linear(hidden, classes), nn.Linear(hidden, classes, bias=False)

    def forward(self, g: Graph, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.l1(mean_aggregate(g, x)) + self.r1(x))
        h = F.dropout(h, 0.5, self.training)
        return self.l2(mean_aggregate(g, h)) + self.r2(h)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The graph, features, model and optimizer with ``fixes`` applied; returns one full-batch
    training step (its loss)."""
    nodes, edges, feats, hidden, classes = 1_000_000, 10_000_000, 128, 128, 47
    if args.small:
        nodes, edges, feats, hidden, classes = 2_000, 20_000, 16, 16, 5
    dtype = torch.bfloat16 if "bf16" in fixes else torch.float32
    g = Graph(nodes, edges, dev, "csr_spmm" in fixes, torch.float32)
    x = torch.randn(nodes, feats, device=dev).to(dtype)
    y = torch.randint(0, classes, (nodes,), device=dev)
    train = torch.randperm(nodes, device=dev)[: int(0.3 * nodes)]
    model = SAGE(feats, hidden, classes).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True if "fused_adam" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)

    def step() -> torch.Tensor:
        return train_step(lambda: F.cross_entropy(model(g, x)[train].float(), y[train]), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_gnn_scatter_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][0].item():.3f} -> {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
