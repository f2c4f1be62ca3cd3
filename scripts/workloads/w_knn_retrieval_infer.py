"""Nearest-neighbour retrieval over an embedding gallery, as a first retrieval service is often
written: a batch of 64 queries encoded by a small MLP (256 -> 512 -> 128, L2-normalised, fp32),
their cosine similarities to a gallery of 400,000 normalised 128-d embeddings held on the GPU
computed chunk by chunk (4 chunks of 100,000), each chunk's similarity matrix copied to the host
and its top 10 per query found with numpy (``argpartition`` then a sort), the chunks' candidates
merged on the host into each query's 10 nearest ids.

Each iteration answers one batch of queries (fresh random inputs) in an NVTX range ``search``
holding one ``chunk`` range per chunk.

Defect: each chunk's 25.6 MB of similarities crosses to pageable host memory and numpy scans
them on one CPU thread, where the GPU could keep them, take the top 10 in a kernel and send back
640 ids a chunk.

    python w_knn_retrieval_infer.py [--steps 40] [--fix gpu_topk] [--fix pinned] [--fix bf16]

Fixes:
  gpu_topk  ``torch.topk`` on each chunk's similarities on the GPU, the chunks' candidates merged
            there (one more topk), the 64 x 10 ids and scores copied back once.
  pinned    each chunk's similarities copied into a pinned host buffer (numpy's work kept).
  bf16      the gallery and the queries in bf16 for the similarity GEMMs (numpy gets fp32).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("gpu_topk", "pinned", "bf16")
CUDA_ONLY = ("pinned",)
K = 10


def host_topk(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest values and their columns, largest first (numpy)."""
    part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(sims, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(vals, order, axis=1), np.take_along_axis(part, order, axis=1)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], np.ndarray]:
    """The encoder and the gallery with ``fixes`` applied; returns one batch's search (each
    query's K nearest gallery ids, on the host)."""
    n_gallery, chunk, batch, d_in, dim = 400_000, 100_000, 64, 256, 128
    if args.small:
        n_gallery, chunk, batch, d_in, dim = 4_000, 1_000, 8, 32, 16
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(d_in, 512), nn.ReLU(), nn.Linear(512, dim)).to(dev).eval()
    gallery = F.normalize(torch.randn(n_gallery, dim, device=dev), dim=1)
    dt = torch.bfloat16 if "bf16" in fixes else torch.float32
    gallery = gallery.to(dt)
    pinned = torch.empty(batch, chunk, pin_memory=True) if "pinned" in fixes else None

    def chunk_sims(q: torch.Tensor, lo: int) -> torch.Tensor:
        return (q.to(dt) @ gallery[lo:lo + chunk].T).float()

    def search_host(q: torch.Tensor) -> np.ndarray:
        best_v, best_i = [], []
        for lo in range(0, n_gallery, chunk):
            with nvtx("chunk"):
                s = chunk_sims(q, lo)
                if pinned is not None:
                    pinned.copy_(s)
                    host = pinned.numpy()
                else:
                    host = s.cpu().numpy()
                v, i = host_topk(host, K)
                best_v.append(v)
                best_i.append(i + lo)
        v, i = np.concatenate(best_v, 1), np.concatenate(best_i, 1)
        return np.take_along_axis(i, host_topk(v, K)[1], axis=1)

    def search_gpu(q: torch.Tensor) -> np.ndarray:
        best_v, best_i = [], []
        for lo in range(0, n_gallery, chunk):
            with nvtx("chunk"):
                v, i = torch.topk(chunk_sims(q, lo), K, dim=1)
                best_v.append(v)
                best_i.append(i + lo)
        v, i = torch.cat(best_v, 1), torch.cat(best_i, 1)
        return torch.gather(i, 1, torch.topk(v, K, dim=1).indices).cpu().numpy()

    search = search_gpu if "gpu_topk" in fixes else search_host

    def step() -> np.ndarray:
        x = torch.randn(batch, d_in, device=dev)
        with nvtx("search"), torch.inference_mode():
            return search(F.normalize(enc(x), dim=1))
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40,
                                    steps_help="query batches (the first ones are warm-up)",
                                    small_help="tiny gallery and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_knn_retrieval_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"last first ids {ran[1][-1][:2, 0].tolist()}")


if __name__ == "__main__":
    main()
