"""First-sight set Y: a relational GCN whose layer loops over 40 relation types with a ``nonzero``
each (``rgcn_relations_train``), DP-SGD with its per-sample gradients taken by a Python loop over
the batch (``dpsgd_loop_train``) and an L2 penalty summed over a ViT's 151 parameter tensors in the
loss (``explicit_l2_train``). Entries as in set A (programs_firstsight_a.py): ``pays`` and
``expect`` written with the programs, before any run on a GPU.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "rgcn_relations_train", "family": "a heterogeneous graph network: an R-GCN layer looping over 40 "
                                                  "relation types, a nonzero in each",
        "script": f"{W}/w_rgcn_relations_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "batched_relations": fix("batched_relations", True, "every node through every relation's weight in "
                                                                "one GEMM, each edge's message gathered: no "
                                                                "loop, no nonzero"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward and the loss"),
            "compile": fix("compile", False, "torch.compile(model): the relation loop unrolled, a graph break at "
                                             "each nonzero", compiles=True),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True)"),
        },
        "expect": {
            "baseline": "20,000 nodes, 400,000 edges, 2 layers of 128: per layer and relation ~10 kernels "
                        "forward (a mask, a nonzero and its wait, three gathers, a GEMM, a scale, a copy and "
                        "an index_add) and ~7 backward: ~1,400 launches and 80 waits a step, ~17-20 ms of "
                        "host time; ~4-5 GB of gathers and scatters and ~40 GFLOP of fp32 GEMMs, ~4-5 ms of "
                        "GPU. Expected 18-25 ms a step on an H100, host-bound",
            "batched_relations": "pays most: ~60 launches and no wait a step; one 26 GFLOP fp32 GEMM a layer "
                                 "forward (~0.5 ms, 3 with the backward), the same gathers and one index_add: "
                                 "GPU-bound at ~4-6 ms. Expected 3.5-5x",
            "bf16": "does not pay: the GEMMs are a small share of a host-bound step, and autocast adds casts to "
                    "every relation's GEMM. Expected 0.85-0.95x",
            "compile": "does not pay: 80 graph breaks a step (each nonzero), each compiled graph's call ~450 "
                       "us in training (analyses/compile_breaks.md), with recompilations for the relations' "
                       "edge counts. Expected 0.4-0.8x",
            "fused_adam": "does not pay: Adam's few multi-tensor launches. Expected 1.0-1.02x",
        },
    },
    {
        "name": "dpsgd_loop_train", "family": "differentially private training: per-sample gradients by a Python "
                                              "loop over the batch",
        "script": f"{W}/w_dpsgd_loop_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "vmap_grads": fix("vmap_grads", True, "the batch's per-sample gradients at once: torch.func.vmap of "
                                                  "grad, clipped and summed as batched ops"),
            "graph": fix("graph", True, "the whole step captured once in a CUDA graph and replayed"),
            "bf16": fix("bf16", False, "bf16 autocast over each sample's forward (the loop kept)"),
        },
        "expect": {
            "baseline": "64 samples a step, each a forward and backward of a 0.3 M-parameter CNN on one 32 x 32 "
                        "image (~60 kernels) and its clipping and accumulation (~46): ~7,000 launches a step of "
                        "2-3 us of GPU each (~20 ms), ~70-85 ms of host time. Expected 75-90 ms a step on an "
                        "H100, host-bound",
            "vmap_grads": "pays most: the 64 forwards and backwards become one batched pass (per-sample weight "
                          "gradients as batched convolutions) and the clipping a few batched ops: a few hundred "
                          "launches, ~3-8 ms. Expected 10-25x",
            "graph": "pays: the ~7,000 kernels replayed back to back, the GPU's ~20-25 ms setting the pace. "
                     "Expected 3-4x",
            "bf16": "does not pay: autocast adds casts to a host-bound loop. Expected 0.8-0.9x",
        },
    },
    {
        "name": "explicit_l2_train", "family": "an L2 penalty summed over every parameter tensor in the loss, "
                                               "the optimizer without weight decay",
        "script": f"{W}/w_explicit_l2_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "adam_weight_decay": fix("adam_weight_decay", True, "the penalty dropped, Adam(weight_decay=2 * lam): "
                                                                "the same gradient"),
            "compile": fix("compile", True, "torch.compile(model) (the penalty eager)", compiles=True),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True)"),
        },
        "expect": {
            "baseline": "a ViT-Tiny (12 blocks of 192, 64 tokens) at batch 128 in bf16: ~260 GFLOP a step "
                        "(~1-2 ms of GEMMs), ~3-4 ms of GPU; ~630 launches for the model and Adam and ~920 "
                        "for the penalty over 151 tensors, ~18-20 ms of host time. Expected 18-22 ms a step "
                        "on an H100, host-bound",
            "adam_weight_decay": "pays most: the penalty's ~920 launches gone, Adam's multi-tensor kernels "
                                 "doing its arithmetic: ~8 ms of host time. Expected 1.9-2.4x",
            "compile": "pays: the model's ~600 launches fused to ~150 (one graph call a step), the penalty's "
                       "stay. Expected 1.3-1.5x",
            "fused_adam": "does not pay much: Adam's foreach launches (a few dozen) become a few. Expected "
                          "1.02-1.05x",
        },
    },
]
