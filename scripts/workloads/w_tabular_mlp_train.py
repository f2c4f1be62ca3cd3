"""Tabular training from an in-memory dataset: 1M rows of 64 fp32 features and a binary label
held in CPU tensors, wrapped in a ``TensorDataset`` and read by
``DataLoader(dataset, batch_size=4096, shuffle=True, drop_last=True)`` with its defaults
(``num_workers=0``, no pinned memory); an MLP 64 -> 1024 -> 1024 -> 512 -> 1 with BatchNorm and
ReLU in fp32, ``BCEWithLogitsLoss``, AdamW (PyTorch's default: foreach on CUDA). No read of the
loss inside the step.

Each step is an NVTX range ``train_step`` holding ``load`` (the next batch from the loader),
``copy_in`` (features and labels to the GPU), ``forward``, ``backward`` and ``optimizer``.

Defect: the loader fetches a batch one row at a time (4,096 ``dataset[i]`` calls, each indexing
both tensors) and ``default_collate`` stacks the 8,192 small tensors: milliseconds of Python for
a batch the GPU trains on in well under one.

    python w_tabular_mlp_train.py [--steps 40] [--fix batched_fetch | --fix gpu_resident]
                                  [--fix workers]

Fixes:
  batched_fetch  the same loader reading a whole batch per call: a ``BatchSampler`` (shuffled,
                 4,096, drop_last) as its sampler, ``batch_size=None`` and a dataset whose
                 ``__getitem__`` takes the batch's indices (one gather per tensor).
  gpu_resident   the table copied to the GPU once; each epoch a ``torch.randperm`` on the GPU and
                 each batch a gather there: no loader, no copy in the step.
  workers        the row-at-a-time loader with ``num_workers=4, pin_memory=True,
                 persistent_workers=True`` (the defaults' prefetch of 2 batches a worker).
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

from _corpus import nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("batched_fetch", "gpu_resident", "workers")
CUDA_ONLY: tuple[str, ...] = ()


class BatchedTable(Dataset):
    """The table read a batch of rows per call: ``dataset[indices]`` (what a BatchSampler passes)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx_t = torch.as_tensor(idx)
        return self.x[idx_t], self.y[idx_t]


def mlp(features: int, widths: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Linear(features, w), nn.BatchNorm1d(w), nn.ReLU()]
        features = w
    return nn.Sequential(*layers, nn.Linear(features, 1))


def batches(x: torch.Tensor, y: torch.Tensor, batch: int, fixes: set[str], dev: torch.device
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (features, labels) batches as the variant reads them (on the host, or on ``dev``
    for gpu_resident), epoch after epoch."""
    gen = torch.Generator().manual_seed(1)
    if "gpu_resident" in fixes:
        xg, yg = x.to(dev), y.to(dev)
        while True:
            order = torch.randperm(len(xg), device=dev)
            for i in range(len(xg) // batch):
                idx = order[i * batch:(i + 1) * batch]
                yield xg[idx], yg[idx]
    if "batched_fetch" in fixes:
        sampler = BatchSampler(RandomSampler(range(len(x)), generator=gen), batch, drop_last=True)
        loader = DataLoader(BatchedTable(x, y), sampler=sampler, batch_size=None)
    else:
        more = ({"num_workers": 4, "pin_memory": dev.type == "cuda", "persistent_workers": True}
                if "workers" in fixes else {})
        loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True,
                            generator=gen, **more)
    while True:
        yield from loader


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The table, the model, the optimizer and the batches with ``fixes`` applied; returns one
    training step (its loss, kept on the GPU)."""
    rows, features, widths, batch = 1_000_000, 64, (1024, 1024, 512), 4096
    if args.small:
        rows, features, widths, batch = 512, 8, (16,), 64
    torch.manual_seed(0)
    x = torch.randn(rows, features)
    y = (x[:, :4].sum(1, keepdim=True) + 0.5 * torch.randn(rows, 1) > 0).float()
    model = mlp(features, widths).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    stream = batches(x, y, batch, fixes, dev)
    on_host = "gpu_resident" not in fixes
    blocking = "workers" not in fixes      # pinned batches copy asynchronously

    def step() -> torch.Tensor:
        def load() -> None:
            with nvtx("load"):
                xb, yb = next(stream)
            if on_host:
                with nvtx("copy_in"):
                    xb, yb = xb.to(dev, non_blocking=not blocking), yb.to(dev, non_blocking=not blocking)
            step.batch = (xb, yb)
        return train_step(lambda: loss_fn(model(step.batch[0]), step.batch[1]), opt, before=load).detach()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("batched_fetch", "gpu_resident"), ("batched_fetch", "workers"),
                                                  ("gpu_resident", "workers")],
                                    small_help="a small table and model, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_tabular_mlp_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
