"""How fast DataLoader workers produce the corpus's batches, against the main process alone.

PK102 prices ``num_workers=N`` as the main process's loading time per batch shared by N
workers. This measures what that assumes, on the machine it runs on, for the two data programs
of the what-if corpus (``dataloader_cnn``: per-sample numpy decode stand-in, 64 x 3 x 160 x 160
float32 batches; ``numpy_aug_train``: crop/flip/normalise, 128 x 3 x 128 x 128), with no
training step, so nothing but loading sets the pace:

* ``main``: the batch built in the main process (``num_workers=0``), after CUDA is initialised
  as in the programs; median seconds a batch.
* ``workers=N`` (pin or not): a persistent DataLoader with N workers and prefetch 4, each batch
  copied to the GPU with ``non_blocking`` as the programs do; the steady rate (seconds a batch)
  after the first 2N batches.
* ``pin``: ``Tensor.pin_memory()`` of one batch in the main process (what the pin thread does).

    python scripts/bench/loader_throughput.py [--batches 64] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workloads"))
from dataloader_cnn import Synthetic  # noqa: E402
from w_numpy_aug_train import Augmented  # noqa: E402


def datasets(n_batches: int) -> dict:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (512, 144, 144, 3), dtype=np.uint8)
    labels = rng.integers(0, 100, 512)
    return {"dataloader_cnn": (Synthetic(64 * n_batches, 160), 64),
            "numpy_aug_train": (Augmented(images, labels, 128, 128 * n_batches), 128)}


def main_process(ds, batch: int, n: int) -> float:
    collate = torch.utils.data.default_collate
    times = []
    for b in range(n):
        t = time.perf_counter()
        collate([ds[b * batch + j] for j in range(batch)])
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def workers(ds, batch: int, n: int, w: int, pin: bool, dev) -> float:
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=w, pin_memory=pin,
                                         persistent_workers=True, prefetch_factor=4)
    it = iter(loader)
    stamps = []
    for _ in range(n):
        x, _y = next(it)
        x.to(dev, non_blocking=pin)
        stamps.append(time.perf_counter())
    torch.cuda.synchronize()
    skip = min(2 * w, n // 2)
    rate = (stamps[-1] - stamps[skip]) / max(n - 1 - skip, 1)
    del it, loader
    return rate


def pin_cost(ds, batch: int) -> float:
    x = torch.utils.data.default_collate([ds[j] for j in range(batch)])[0]
    times = []
    for _ in range(8):
        t = time.perf_counter()
        x.pin_memory()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    out = {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads()}
    for name, (ds, batch) in datasets(args.batches + 8).items():
        row = {"main_s": main_process(ds, batch, 12), "pin_s": pin_cost(ds, batch)}
        for w in (1, 4, 8):
            row[f"workers{w}_pin_s"] = workers(ds, batch, args.batches, w, True, dev)
        row["workers8_nopin_s"] = workers(ds, batch, args.batches, 8, False, dev)
        out[name] = row
        print(name, {k: round(v * 1e3, 2) for k, v in row.items()}, flush=True)
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
