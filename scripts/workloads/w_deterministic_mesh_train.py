"""Training a MeshGraphNets-style simulator (encode, message passing, decode) with the
reproducibility settings of a research script left on: ``torch.use_deterministic_algorithms(True)``,
``cudnn.deterministic = True``, ``cudnn.benchmark = False`` and ``CUBLAS_WORKSPACE_CONFIG``. A
synthetic triangulated 200 x 300 grid mesh (60,000 nodes, ~357,000 directed edges), node and edge
encoders, 8 message-passing steps of latent 128 (edge update from [edge, sender, receiver], node
update from [node, sum of incoming edges], residual, 2-layer MLPs with LayerNorm), a decoder to
3 outputs; fp32, Adam, fresh noisy node features and targets each step, MSE loss.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: under ``use_deterministic_algorithms(True)`` every ``index_add_`` (the aggregation over
receivers, and the backward of each gather of senders and receivers) runs PyTorch's deterministic
implementation, which sorts the 357,000 indices and accumulates in their order, instead of one
pass of atomic adds: three sorts a message-passing step, forward and backward, for bit-exact
reruns that a training run does not need.

    python w_deterministic_mesh_train.py [--steps 30] [--fix nondeterministic|sorted_segments] [--fix tf32]

Fixes:
  nondeterministic  the reproducibility settings off (``use_deterministic_algorithms(False)``,
                    ``cudnn.deterministic = False``): the atomic ``index_add_``.
  sorted_segments   determinism kept: each index's sort order computed once for the fixed mesh,
                    sums over receivers (and the gathers' backward) as ``torch.segment_reduce``
                    over those sorted segments.
  tf32              TF32 for the fp32 MLPs' matmuls, determinism kept.
"""
from __future__ import annotations

import os
from typing import Callable

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace

import torch  # noqa: E402 (after the cuBLAS setting, as the research scripts do)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _corpus import program_args, run, train_step  # noqa: E402

FIXES = ("nondeterministic", "sorted_segments", "tf32")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("nondeterministic", "sorted_segments"),)


def reproducible(on: bool) -> None:
    """The research script's reproducibility settings, on or off (process-wide: set before each
    step, so that variants timed side by side each run with their own)."""
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False


def grid_mesh(rows: int, cols: int) -> torch.Tensor:
    """The directed edges (2, E: senders, receivers) of a ``rows`` x ``cols`` grid cut into
    triangles (right, down and one diagonal neighbour, both ways)."""
    ids = torch.arange(rows * cols).view(rows, cols)
    pairs = [(ids[:, :-1], ids[:, 1:]), (ids[:-1, :], ids[1:, :]), (ids[:-1, :-1], ids[1:, 1:])]
    a = torch.cat([p[0].reshape(-1) for p in pairs])
    b = torch.cat([p[1].reshape(-1) for p in pairs])
    return torch.stack([torch.cat([a, b]), torch.cat([b, a])])


class Segments:
    """An index vector's sort order, computed once: sums of rows into its targets as segment
    sums over the sorted rows, deterministic with no sort per call."""

    def __init__(self, index: torch.Tensor, n: int) -> None:
        self.index = index
        self.perm = torch.argsort(index.cpu(), stable=True).to(index.device)
        self.lengths = torch.bincount(index.cpu(), minlength=n).to(index.device)

    def sum(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(rows.index_select(0, self.perm), "sum", lengths=self.lengths, axis=0)


class _Gather(torch.autograd.Function):
    """``x[seg.index]``, its backward summed by ``seg``'s segments (not ``index_add_``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seg: Segments) -> torch.Tensor:
        ctx.seg = seg
        return x.index_select(0, seg.index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.seg.sum(grad), None


class _Scatter(torch.autograd.Function):
    """The rows summed into ``seg.index``'s targets, its backward a gather."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, seg: Segments) -> torch.Tensor:
        ctx.seg = seg
        return seg.sum(rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.index_select(0, ctx.seg.index), None


def mlp(i: int, h: int, o: int, norm: bool = True) -> nn.Sequential:
    layers = [nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o)]
    return nn.Sequential(*layers, nn.LayerNorm(o)) if norm else nn.Sequential(*layers)


class MeshGraphNet(nn.Module):
    def __init__(self, node_in: int, edge_in: int, latent: int, steps: int, out: int) -> None:
        super().__init__()
        self.node_enc, self.edge_enc = mlp(node_in, latent, latent), mlp(edge_in, latent, latent)
        self.edge_mlps = nn.ModuleList(mlp(3 * latent, latent, latent) for _ in range(steps))
        self.node_mlps = nn.ModuleList(mlp(2 * latent, latent, latent) for _ in range(steps))
        self.dec = mlp(latent, latent, out, norm=False)

    def forward(self, nodes: torch.Tensor, edges: torch.Tensor, senders: torch.Tensor, receivers: torch.Tensor,
                segs: tuple[Segments, Segments] | None = None) -> torch.Tensor:
        x, e = self.node_enc(nodes), self.edge_enc(edges)
        for edge_mlp, node_mlp in zip(self.edge_mlps, self.node_mlps):
            if segs is None:
                xs, xr = x[senders], x[receivers]
            else:
                xs, xr = _Gather.apply(x, segs[0]), _Gather.apply(x, segs[1])
            e = e + edge_mlp(torch.cat([e, xs, xr], dim=-1))
            if segs is None:
                agg = torch.zeros_like(x).index_add_(0, receivers, e)
            else:
                agg = _Scatter.apply(e, segs[1])
            x = x + node_mlp(torch.cat([x, agg], dim=-1))
        return self.dec(x)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh noisy
    node features and targets on the fixed mesh; the step's loss)."""
    rows, cols, latent, mp_steps = 200, 300, 128, 8
    if args.small:
        rows, cols, latent, mp_steps = 6, 7, 16, 2
    deterministic = "nondeterministic" not in fixes
    reproducible(deterministic)
    torch.manual_seed(0)
    senders, receivers = grid_mesh(rows, cols).to(dev)
    n = rows * cols
    pos = torch.stack(torch.meshgrid(torch.arange(rows) / rows, torch.arange(cols) / cols, indexing="ij"),
                      -1).reshape(n, 2).to(dev)
    rel = pos[senders] - pos[receivers]
    edges = torch.cat([rel, rel.norm(dim=-1, keepdim=True), torch.randn(rel.shape[0], 4, device=dev)], -1)
    segs = (Segments(senders, n), Segments(receivers, n)) if "sorted_segments" in fixes else None
    model = MeshGraphNet(12, 7, latent, mp_steps, 3).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    tf32 = "tf32" in fixes

    def forward() -> torch.Tensor:
        nodes = torch.randn(n, 12, device=dev)
        target = torch.randn(n, 3, device=dev)
        return F.mse_loss(model(nodes, edges, senders, receivers, segs), target)

    def step() -> torch.Tensor:
        reproducible(deterministic)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        return train_step(forward, opt)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_deterministic_mesh_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
