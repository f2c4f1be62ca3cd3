"""K-means clustering on the GPU as a data script writes it: 262,144 points in 64 dimensions (a
mixture of 256 Gaussian blobs, fp32), 1,024 centroids, Lloyd's iterations: distances by
``torch.cdist``, each point's nearest centroid by ``argmin``, the centroids' sums by
``index_add_`` and their counts by ``bincount``, then a convergence test on the centroids' shift,
read on the host every iteration (``shift.item() < tol``). Converged, the centroids are drawn
again from the points and the loop goes on (a restart, as a search over seeds does).

Each Lloyd iteration is an NVTX range ``lloyd_iter``.

Defect: the distances are an fp32 GEMM without TF32 (262,144 x 1,024 x 64 each iteration), and
each iteration ends in a host read of the shift: the GPU drains and waits for the next
iteration's launches.

    python w_kmeans_lloyd_loop.py [--steps 40] [--fix tf32] [--fix check_every_10] [--fix matmul_update]

Fixes:
  tf32            TF32 for the distance GEMM (``set_float32_matmul_precision("high")``).
  check_every_10  the shift read on the host every 10th iteration only (the loop may run up to 9
                  iterations past convergence).
  matmul_update   the centroids' sums as one GEMM of the assignment's one-hot matrix with the
                  points, instead of ``index_add_``'s atomic adds.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402

FIXES = ("tf32", "check_every_10", "matmul_update")
CUDA_ONLY: tuple[str, ...] = ()


def lloyd(points: torch.Tensor, centroids: torch.Tensor, matmul_update: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One Lloyd iteration: (the new centroids, each point's cluster). An empty cluster keeps its
    centroid."""
    k = centroids.shape[0]
    assign = torch.cdist(points, centroids).argmin(1)
    if matmul_update:
        sums = F.one_hot(assign, k).to(points.dtype).T @ points
    else:
        sums = torch.zeros_like(centroids).index_add_(0, assign, points)
    counts = torch.bincount(assign, minlength=k).to(points.dtype)[:, None]
    return torch.where(counts > 0, sums / counts.clamp(min=1), centroids), assign


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], float]:
    """The points and the loop's state with ``fixes`` applied; returns one Lloyd iteration (the
    iterations so far since the last restart, an int on the host)."""
    n, d, k, blobs, tol = 262_144, 64, 1024, 256, 1e-4
    if args.small:
        n, d, k, blobs = 512, 4, 8, 4
    gen = torch.Generator(device=dev).manual_seed(0)
    centres = 4.0 * torch.randn(blobs, d, device=dev, generator=gen)
    points = centres[torch.randint(0, blobs, (n,), device=dev, generator=gen)] + torch.randn(n, d, device=dev,
                                                                                            generator=gen)
    every = 10 if "check_every_10" in fixes else 1
    state = {"centroids": points[torch.randperm(n, device=dev, generator=gen)[:k]].clone(), "it": 0}

    def step() -> int:
        with nvtx("lloyd_iter"):
            new, _ = lloyd(points, state["centroids"], "matmul_update" in fixes)
            shift = (new - state["centroids"]).norm()
            state["centroids"], state["it"] = new, state["it"] + 1
            if state["it"] % every == 0 and shift.item() < tol:  # converged: restart from new seeds
                state["centroids"] = points[torch.randperm(n, device=dev, generator=gen)[:k]].clone()
                state["it"] = 0
            return state["it"]
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40, steps_help="Lloyd iterations (the "
                                    "first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_kmeans_lloyd_loop: {args.steps} iterations, fixes {sorted(fixes) or 'none'}, "
              f"{ran[1][-1]} since the last restart")


if __name__ == "__main__":
    main()
