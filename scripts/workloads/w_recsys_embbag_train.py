"""DLRM-style click-through-rate model training step: 8 ``nn.EmbeddingBag`` tables (4M, 2M, 1M,
500k, 200k, 100k, 20k and 1k rows, 64 wide, sum pooling: 500M parameters, 2 GB), a bottom MLP
over 13 dense features (512-256-64), DLRM's dot-product feature interaction, a top MLP
(1024-1024-512-256-1) and binary cross-entropy on the click label. Batch 8192, multi-hot bags
of 1 to 40 ids a table (skewed towards popular rows), from a pool of 4 batches made at start-up
and kept on the GPU. ``torch.optim.Adam`` with PyTorch's default implementation (foreach on
CUDA) over every parameter, the tables' too.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defect: the tables' gradients are dense. A step looks up 1.3M ids, about 700k distinct rows of
7.8M, yet the backward writes a 2 GB gradient (zeros, then the rows looked up) and Adam's
foreach passes read and write every row's weight and moment estimates (about ten passes over
500M floats), so the step is the optimizer's memory traffic; the MLPs are a small part of it.

    python w_recsys_embbag_train.py [--steps 30] [--fix fused_adam] [--fix sparse] [--fix bf16]

Fixes:
  fused_adam  ``Adam(fused=True)``: one fused kernel, one pass over weights, gradients and moments
              instead of about ten foreach passes; the dense gradients stay.
  sparse      the tables built with ``sparse=True`` (their gradients hold only the looked-up
              rows) and updated by ``torch.optim.SparseAdam``; the MLPs keep ``Adam`` (fused
              too when ``fused_adam`` is given). SparseAdam updates only the rows looked up
              (lazy Adam), as production recommenders do.
  bf16        bottom MLP, interaction and top MLP under ``torch.autocast(bfloat16)``; the
              tables and the optimizer unchanged.
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import Optimizers, bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("fused_adam", "sparse", "bf16")
CUDA_ONLY: tuple[str, ...] = ()


def mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, rows: list[int], dim: int, dense_in: int, bottom: list[int], top: list[int],
                 sparse: bool, dev: torch.device) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse, device=dev) for n in rows)
        for t in self.tables:  # DLRM's init, on the device (a CPU init of 500M floats takes seconds)
            nn.init.uniform_(t.weight, -(1.0 / t.num_embeddings) ** 0.5, (1.0 / t.num_embeddings) ** 0.5)
        self.bottom = mlp([dense_in, *bottom, dim], last_relu=True).to(dev)
        n = len(rows) + 1
        self.register_buffer("li", torch.tril_indices(n, n, offset=-1, device=dev)[0], persistent=False)
        self.register_buffer("lj", torch.tril_indices(n, n, offset=-1, device=dev)[1], persistent=False)
        self.top = mlp([dim + n * (n - 1) // 2, *top, 1], last_relu=False).to(dev)

    def forward(self, dense: torch.Tensor, sparse: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        x = self.bottom(dense)
        embs = [t(idx, off) for t, (idx, off) in zip(self.tables, sparse)]
        feats = torch.stack([x, *embs], dim=1)                 # [B, 9, dim]
        inter = torch.bmm(feats, feats.transpose(1, 2))        # all pairwise dot products
        flat = inter[:, self.li, self.lj]                      # the 36 below the diagonal
        return self.top(torch.cat([x, flat], dim=1)).squeeze(1)


def make_batch(rows: list[int], batch: int, dense_in: int, max_bag: int, dev: torch.device,
               gen: torch.Generator) -> tuple:
    """Dense features, per table (ids, offsets) of bags of 1..max_bag ids, and click labels."""
    dense = torch.empty(batch, dense_in).exponential_(0.05, generator=gen).log1p_()  # log of counts
    sparse = []
    for n in rows:
        lengths = torch.randint(1, max_bag + 1, (batch,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        u = torch.rand(int(lengths.sum()), generator=gen)
        ids = (u.pow(3) * n).long().clamp_(max=n - 1)  # skewed: a few rows are looked up often
        sparse.append((ids.to(dev), offsets.to(dev)))
    labels = (torch.rand(batch, generator=gen) < 0.25).float()
    return dense.to(dev), sparse, labels.to(dev)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer(s) and batch pool with ``fixes`` applied; returns one training step
    (the next batch of the pool; the step's loss)."""
    rows = [4_000_000, 2_000_000, 1_000_000, 500_000, 200_000, 100_000, 20_000, 1_000]
    dim, batch, max_bag = 64, 8192, 40
    bottom, top, dense_in = [512, 256], [1024, 1024, 512, 256], 13
    if args.small:
        rows, dim, batch, max_bag, bottom, top = [1000, 800, 500, 200, 100, 50, 20, 10], 16, 64, 8, [32], [64, 32]
    sparse = "sparse" in fixes
    model = DLRM(rows, dim, dense_in, bottom, top, sparse, dev).train()
    fused = True if "fused_adam" in fixes else None
    if sparse:
        tables = list(model.tables.parameters())
        dense_params = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
        opt = Optimizers(torch.optim.SparseAdam(tables, lr=1e-3), torch.optim.Adam(dense_params, lr=1e-3, fused=fused))
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    amp = bf16_autocast(dev, "bf16" in fixes)
    gen = torch.Generator().manual_seed(1)
    pool = itertools.cycle([make_batch(rows, batch, dense_in, max_bag, dev, gen) for _ in range(4)])

    def step() -> torch.Tensor:
        dense, sparse_in, labels = next(pool)
        return train_step(lambda: F.binary_cross_entropy_with_logits(model(dense, sparse_in), labels), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_recsys_embbag_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
