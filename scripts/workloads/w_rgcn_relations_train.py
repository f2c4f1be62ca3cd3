"""A relational graph convolutional network (Schlichtkrull et al., 2018: "Modeling Relational Data
with Graph Convolutional Networks") written as its reference implementations write the layer: a
Python loop over the relation types, each selecting its edges with a boolean mask, transforming
their source nodes' features by its own weight, and adding the messages into the destination
nodes with ``index_add_`` (normalised by each node's in-degree of that relation). A synthetic
knowledge graph of 20,000 nodes and 400,000 edges over 40 relation types (their frequencies
Zipf-like, as real ones are), node classification into 16 classes; 2 layers of width 128, the
node embeddings learned, full-batch training, Adam (PyTorch's default foreach implementation),
fp32 (its matmuls in TF32 not enabled, PyTorch's default).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): each layer runs 40 relations of ~8 kernels forward (a boolean mask, a
``nonzero`` whose size the host must wait for, two gathers, a GEMM, a scale, an ``index_add_``),
twice as many backward: ~2,000 launches and 80 waits a step for ~1 GFLOP and ~0.5 GB of traffic.

    python w_rgcn_relations_train.py [--steps 30] [--fix batched_relations] [--fix bf16]
        [--fix compile] [--fix fused_adam]

Fixes:
  batched_relations  every node transformed by every relation's weight in one GEMM (N x din times
                     din x R*dout), each edge's message gathered from it by (source, relation),
                     one ``index_add_``: no mask, no ``nonzero``, no wait (R times the GEMM's
                     FLOPs, a few ms of TF32-less fp32 at this size).
  bf16        bf16 autocast over the forward and the loss.
  compile     ``torch.compile(model)`` (the relation loop unrolled; each ``nonzero`` a graph break).
  fused_adam  ``Adam(fused=True)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("batched_relations", "bf16", "compile", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()


def make_graph(nodes: int, edges: int, relations: int, classes: int, dev: torch.device, seed: int = 0):
    """Random edges (source, destination) over ``relations`` types drawn Zipf-like, each node's
    class, and each edge's normalisation 1 / (its destination's in-degree of its relation)."""
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, relations + 1, dtype=torch.float64)
    rel = torch.multinomial(weights, edges, replacement=True, generator=g)
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    key = rel * nodes + dst
    _, inv, counts = torch.unique(key, return_inverse=True, return_counts=True)
    norm = 1.0 / counts[inv].float()
    labels = torch.randint(0, classes, (nodes,), generator=g)
    return src.to(dev), dst.to(dev), rel.to(dev), norm.to(dev), labels.to(dev)


class RGCNLayer(nn.Module):
    """h'_i = W_0 h_i + sum_r sum_{j in N_r(i)} W_r h_j / |N_r(i)|."""

    def __init__(self, din: int, dout: int, relations: int) -> None:
        super().__init__()
        self.self_loop = nn.Linear(din, dout)
        self.weight = nn.Parameter(torch.randn(relations, din, dout) / din ** 0.5)

    def forward(self, h: torch.Tensor, src, dst, rel, norm) -> torch.Tensor:
        out = self.self_loop(h)
        for r in range(self.weight.shape[0]):
            mask = rel == r
            idx = mask.nonzero().squeeze(1)
            msg = (h[src[idx]] @ self.weight[r]) * norm[idx, None]
            out = out.index_add(0, dst[idx], msg.to(out.dtype))
        return out

    def forward_batched(self, h: torch.Tensor, src, dst, rel, norm) -> torch.Tensor:
        """The same sum: every node through every relation's weight at once, each edge's message
        gathered by (source, relation)."""
        r, din, dout = self.weight.shape
        hw = (h @ self.weight.permute(1, 0, 2).reshape(din, r * dout)).view(-1, r, dout)
        msg = hw[src, rel] * norm[:, None]
        out = self.self_loop(h)
        return out.index_add(0, dst, msg.to(out.dtype))


class RGCN(nn.Module):
    def __init__(self, nodes: int, width: int, relations: int, classes: int, layers: int) -> None:
        super().__init__()
        self.emb = nn.Parameter(torch.randn(nodes, width) * 0.1)
        dims = [width] * layers + [classes]
        self.layers = nn.ModuleList([RGCNLayer(a, b, relations) for a, b in zip(dims[:-1], dims[1:])])

    def forward(self, src, dst, rel, norm, batched: bool = False) -> torch.Tensor:
        h = self.emb
        for i, layer in enumerate(self.layers):
            h = layer.forward_batched(h, src, dst, rel, norm) if batched else layer(h, src, dst, rel, norm)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The graph, the model and Adam with ``fixes`` applied; returns one training step (its loss)."""
    nodes, edges, relations, classes, width, layers = 20_000, 400_000, 40, 16, 128, 2
    if args.small:
        nodes, edges, relations, classes, width, layers = 30, 120, 4, 3, 8, 2
    src, dst, rel, norm, labels = make_graph(nodes, edges, relations, classes, dev)
    torch.manual_seed(0)
    model = RGCN(nodes, width, relations, classes, layers).to(dev).train()
    fwd = torch.compile(model) if "compile" in fixes else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True if "fused_adam" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)
    batched = "batched_relations" in fixes

    def forward() -> torch.Tensor:
        return F.cross_entropy(fwd(src, dst, rel, norm, batched).float(), labels)

    def step() -> torch.Tensor:
        return train_step(forward, opt, amp)
    step.model, step.graph = model, (src, dst, rel, norm, labels)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny graph and model, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_rgcn_relations_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
