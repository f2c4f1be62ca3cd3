"""Click-through-rate training with the embedding table left in host memory: an
``nn.EmbeddingBag`` of 1M rows x 128 (sum pooling, ``sparse=True``: 512 MB of fp32) kept on the
CPU, as a table once thought too large for the GPU is, updated by ``torch.optim.SparseAdam`` on
the CPU; its pooled vectors copied to the GPU, joined with 16 dense features and fed to an MLP
144 -> 1024 -> 512 -> 256 -> 1 in fp32 with binary cross-entropy, the MLP updated by Adam
(PyTorch's default: foreach on CUDA). Batch 4,096 bags of 20 ids, skewed towards popular rows,
drawn on the host each step.

Each step is an NVTX range ``train_step`` holding ``forward`` (the CPU lookup, its copy to the
GPU, the MLP and the loss), ``backward`` (the MLP's on the GPU, the pooled gradient's copy back,
the table's sparse gradient on the CPU) and ``optimizer``.

Defect: the step's CPU work - the lookup of 82k rows, the backward's sparse gradient, SparseAdam
coalescing it and updating ~60k rows with their two moments - runs on the host, the GPU idle
meanwhile, and the gradient's copy back waits for the GPU's backward every step. The table (and
Adam's two moments, 1.5 GB in all) fit in the GPU's memory a hundred times over.

    python w_cpu_embedding_train.py [--steps 40] [--fix gpu_table] [--fix fused_adam] [--fix compile]

Fixes:
  gpu_table   the table, its ids and SparseAdam on the GPU: no host work but drawing the batch,
              no copies of the pooled vectors either way.
  fused_adam  ``Adam(fused=True)`` for the MLP.
  compile     ``torch.compile`` of the MLP and loss (default mode).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import Optimizers, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("gpu_table", "fused_adam", "compile")
CUDA_ONLY: tuple[str, ...] = ()


def head(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """Table, MLP and optimizers with ``fixes`` applied; returns one training step (a fresh batch
    drawn on the host; the step's loss, kept on the GPU)."""
    rows, dim, dense_in, batch, bag, hidden = 1_000_000, 128, 16, 4096, 20, [1024, 512, 256]
    if args.small:
        rows, dim, dense_in, batch, bag, hidden = 1000, 8, 4, 16, 4, [32, 16]
    torch.manual_seed(0)
    table_dev = dev if "gpu_table" in fixes else torch.device("cpu")
    table = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True, device=table_dev)
    nn.init.uniform_(table.weight, -(1.0 / rows) ** 0.5, (1.0 / rows) ** 0.5)
    mlp = head([dim + dense_in, *hidden, 1]).to(dev)
    opt = Optimizers(torch.optim.SparseAdam(list(table.parameters()), lr=1e-3),
                     torch.optim.Adam(mlp.parameters(), lr=1e-3, fused=True if "fused_adam" in fixes else None))

    def top(pooled: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(mlp(torch.cat([pooled, dense], 1)).squeeze(1), labels)
    loss_of = torch.compile(top) if "compile" in fixes else top
    gen = torch.Generator().manual_seed(1)
    offsets = torch.arange(0, batch * bag, bag)

    def forward(ids: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pooled = table(ids.to(table_dev), offsets.to(table_dev))
        return loss_of(pooled.to(dev), dense.to(dev), labels.to(dev))

    def step() -> torch.Tensor:
        u = torch.rand(batch * bag, generator=gen)
        ids = (u.pow(3) * rows).long().clamp_(max=rows - 1)      # skewed: a few rows are looked up often
        dense = torch.empty(batch, dense_in).exponential_(0.05, generator=gen).log1p_()
        labels = (torch.rand(batch, generator=gen) < 0.25).float()
        return train_step(lambda: forward(ids, dense, labels), opt).detach()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_cpu_embedding_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
