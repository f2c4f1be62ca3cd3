"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``kmeans_lloyd_loop``: k-means clustering whose convergence is read on the host every
iteration; ``multitask_heads_train``: 40 attribute heads, each its own tiny linear layer and loss
in a Python loop; ``gp_cholesky_train``: an exact Gaussian process fitted through a float64
Cholesky factorisation), in the format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "kmeans_lloyd_loop", "family": "iterative clustering (k-means) with a convergence test "
                                             "read every iteration",
        "script": f"{W}/w_kmeans_lloyd_loop.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "lloyd_iter", "kind": "inference", "interleave": "all",
        "fixes": {
            "tf32": fix("tf32", True, "TF32 for the distance GEMM"),
            "check_every_10": fix("check_every_10", False, "the shift read every 10th iteration"),
            "matmul_update": fix("matmul_update", False, "centroid sums as a one-hot GEMM instead of "
                                                         "index_add_"),
        },
        "expect": {
            "baseline": "a 34 GFLOP fp32 GEMM without TF32 (~0.7 ms), the 1 GB distance matrix written, "
                        "rooted and read by argmin (~1.5 ms), index_add_ of 262k rows (~0.2 ms); one host "
                        "read a step. Expected 2.5-3.5 ms an iteration, GPU-bound",
            "tf32": "pays: the GEMM ~4x faster. Expected 1.15-1.3x",
            "check_every_10": "does not pay: the GPU drains for a few tens of microseconds a step. "
                              "Expected 1.0-1.05x",
            "matmul_update": "does not pay: a 1 GB one-hot matrix and another fp32 GEMM instead of "
                             "atomic adds. Expected 0.6-0.9x",
        },
    },
    {
        "name": "multitask_heads_train", "family": "many tiny task heads in a Python loop (multi-label "
                                                  "attributes)",
        "script": f"{W}/w_multitask_heads_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "stacked_heads": fix("stacked_heads", True, "one Linear(512, 40) and one loss"),
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) (a control)"),
        },
        "expect": {
            "baseline": "a small bf16 CNN (~60 GFLOP forward and backward, ~1.5 ms of GPU) and ~800 "
                        "launches a step, half of them the 40 heads' GEMMs, losses and their backward "
                        "(~12-18 ms of host). Expected 12-18 ms a step, host-bound",
            "stacked_heads": "pays most: ~500 fewer launches. Expected 2.5-3.5x",
            "compile": "pays: the loop traced and fused. Expected 2-4x",
            "fused_adamw": "does not pay: the optimizer is foreach already. Expected 1.0-1.05x",
        },
    },
    {
        "name": "gp_cholesky_train", "family": "linear algebra in the loop: an exact GP's float64 "
                                             "Cholesky (cuSOLVER)",
        "script": f"{W}/w_gp_cholesky_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "fp32": fix("fp32", None, "float32 with a 1e-4 jitter"),
            "cholesky_ex": fix("cholesky_ex", False, "linalg.cholesky_ex: no status check on the host"),
        },
        "expect": {
            "baseline": "a 4096 x 4096 float64 Cholesky (~23 GFLOP) and the backward's triangular "
                        "solves with matrix right-hand sides (~140 GFLOP float64), ~7 elementwise passes "
                        "over a 134 MB matrix; one host check a step. Expected 6-10 ms a step, GPU-bound",
            "fp32": "unsure: half the bytes, but float32 without tensor cores runs no faster than "
                    "float64 with them on this GPU. Expected 1.0-1.5x",
            "cholesky_ex": "does not pay much: one wait, the GPU busy around it. Expected 1.0-1.08x",
        },
    },
]
