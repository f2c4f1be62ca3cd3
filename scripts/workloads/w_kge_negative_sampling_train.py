"""Training knowledge-graph embeddings (DistMult: score = <e_head, r, e_tail>) with negative
sampling written in Python, as a research script does: 500,000 entities and 1,000 relations of
dimension 256 (fp32 ``nn.Embedding`` tables, dense gradients, Adam), a synthetic graph of 2
million triples, batches of 2,048 true triples each corrupted 32 times (head or tail replaced by
a random entity, a coin per negative), a softplus loss on true and corrupted scores.

Each training step is an NVTX range ``train_step`` (``sample``, then ``forward``, ``backward``,
``optimizer``).

Defect: the 65,536 negatives of a step are drawn one at a time with Python's ``random`` in a loop
over the batch's triples, turned into a tensor from a list of tuples and copied to the GPU: tens
of milliseconds of Python a step on the main thread, while the GPU's work (the gathers, and
Adam over the 0.5 GB tables) takes a few.

    python w_kge_negative_sampling_train.py [--steps 40] [--fix gpu_sampling|numpy_sampling] [--fix fused_adam]

Fixes:
  gpu_sampling    the corruption drawn on the GPU (``torch.randint`` for the entities, ``torch.rand``
                  for the coins) from the batch's tensor: no Python loop, no copy.
  numpy_sampling  the same corruption drawn with NumPy's vectorised generator on the host, one
                  ``torch.from_numpy(...).to(device)`` a step.
  fused_adam      ``Adam(fused=True)`` (the sampling kept): a control, the GPU's side is not the pace.
"""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run, train_step  # noqa: E402

FIXES = ("gpu_sampling", "numpy_sampling", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("gpu_sampling", "numpy_sampling"),)


class DistMult(nn.Module):
    def __init__(self, entities: int, relations: int, dim: int) -> None:
        super().__init__()
        self.ent, self.rel = nn.Embedding(entities, dim), nn.Embedding(relations, dim)
        nn.init.normal_(self.ent.weight, std=0.1)
        nn.init.normal_(self.rel.weight, std=0.1)

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        """Scores of ``triples`` (..., 3: head, relation, tail)."""
        return (self.ent(triples[..., 0]) * self.rel(triples[..., 1]) * self.ent(triples[..., 2])).sum(-1)


def corrupt_python(batch: list[tuple[int, int, int]], k: int, entities: int, rng: random.Random) -> torch.Tensor:
    """``k`` negatives per true triple, head or tail replaced by a random entity: (batch, k, 3)."""
    out = []
    for h, r, t in batch:
        row = []
        for _ in range(k):
            e = rng.randrange(entities)
            row.append((e, r, t) if rng.random() < 0.5 else (h, r, e))
        out.append(row)
    return torch.tensor(out)


def corrupt_tensor(pos: torch.Tensor, k: int, entities: int, ents: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """The same corruption from drawn ``ents`` and ``coins`` (each (batch, k)): (batch, k, 3)."""
    neg = pos.unsqueeze(1).expand(-1, k, -1).clone()
    head = coins < 0.5
    neg[..., 0] = torch.where(head, ents, neg[..., 0])
    neg[..., 2] = torch.where(head, neg[..., 2], ents)
    return neg


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The training step with ``fixes`` applied; returns the step's loss."""
    entities, relations, dim, n_triples, batch, k = 500_000, 1_000, 256, 2_000_000, 2048, 32
    if args.small:
        entities, relations, dim, n_triples, batch, k = 200, 10, 8, 1_000, 16, 4
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    triples = torch.stack([torch.randint(0, entities, (n_triples,), generator=g),
                           torch.randint(0, relations, (n_triples,), generator=g),
                           torch.randint(0, entities, (n_triples,), generator=g)], 1)
    model = DistMult(entities, relations, dim).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True if "fused_adam" in fixes else None)
    rng, nrng = random.Random(2), np.random.default_rng(2)
    gen = torch.Generator(device=dev).manual_seed(2)
    order = torch.randperm(n_triples, generator=g)
    state = {"i": 0}

    def sample() -> tuple[torch.Tensor, torch.Tensor]:
        i = state["i"]
        state["i"] = (i + batch) % (n_triples - batch)
        pos_host = triples[order[i:i + batch]]
        if "gpu_sampling" in fixes:
            pos = pos_host.to(dev)
            ents = torch.randint(0, entities, (batch, k), device=dev, generator=gen)
            coins = torch.rand(batch, k, device=dev, generator=gen)
            return pos, corrupt_tensor(pos, k, entities, ents, coins)
        if "numpy_sampling" in fixes:
            ents, coins = nrng.integers(0, entities, (batch, k)), nrng.random((batch, k))
            neg = corrupt_tensor(pos_host, k, entities, torch.from_numpy(ents), torch.from_numpy(coins))
            return pos_host.to(dev), neg.to(dev)
        neg = corrupt_python([tuple(t) for t in pos_host.tolist()], k, entities, rng)
        return pos_host.to(dev), neg.to(dev)

    drawn: dict[str, torch.Tensor] = {}

    def draw() -> None:
        with nvtx("sample"):
            drawn["pos"], drawn["neg"] = sample()

    def forward() -> torch.Tensor:
        return F.softplus(-model(drawn["pos"])).mean() + F.softplus(model(drawn["neg"])).mean()
    return lambda: train_step(forward, opt, before=draw)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_kge_negative_sampling_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
