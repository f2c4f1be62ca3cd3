"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``varlen_conv_benchmark_train``: cuDNN's benchmark mode on input lengths that change
every batch; ``cnf_exact_divergence_train``: a continuous normalizing flow whose exact divergence
is one backward pass per dimension; ``dgcnn_knn_train``: a point-cloud network that rebuilds a
k-nearest-neighbour graph in every layer), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "varlen_conv_benchmark_train", "family": "cudnn.benchmark on input lengths that change "
                                                       "every batch",
        "script": f"{W}/w_varlen_conv_benchmark_train.py", "args": [], "capture_args": ["--steps", "30"],
        # not interleaved (the program refuses: cuDNN's benchmark cache is the process's)
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "no_benchmark": fix("no_benchmark", True, "cudnn.benchmark = False: heuristics"),
            "bucketed": fix("bucketed", True, "batches padded to whole seconds: five lengths, each "
                                              "benchmarked once"),
            "bf16": fix("bf16", False, "bf16 autocast, benchmark kept"),
        },
        "expect": {
            "baseline": "~0.7 TFLOP of TF32 convolutions and ~2 GB of elementwise traffic (~6-10 ms "
                        "of GPU); a new padded length almost every step, so cuDNN times every "
                        "algorithm of 7 layers x 3 directions again (~100-400 ms). Expected 100-400 ms "
                        "a step, set by the benchmarking",
            "no_benchmark": "pays most: no timing of algorithms. Expected 10-40x",
            "bucketed": "pays about as much: five lengths benchmarked before the loop, 9% more "
                        "samples on average. Expected 10-40x",
            "bf16": "does not pay: the benchmarking stays. Expected 1.0-1.1x",
        },
    },
    {
        "name": "cnf_exact_divergence_train", "family": "exact divergence as one backward pass per "
                                                      "dimension (a normalizing flow)",
        "script": f"{W}/w_cnf_exact_divergence_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "batched_grads": fix("batched_grads", True, "the same trace from one is_grads_batched "
                                                        "backward"),
            "hutchinson": fix("hutchinson", True, "one probe a step: e^T J e (an estimate)"),
            "tf32": fix("tf32", None, "TF32 for the MLP's matmuls"),
        },
        "expect": {
            "baseline": "8 Euler steps x 32 backward passes, kept for a double backward: ~7,000 small "
                        "kernels (~50-70 ms of launches and autograd from Python), ~3,000 fp32 GEMMs "
                        "of 1024 x 512 x 512 (~30 ms). Expected 60-90 ms a step, host-bound",
            "batched_grads": "pays: 8 batched passes of 32x the rows, the GPU then sets the pace in "
                             "fp32 GEMMs. Expected 2-3x",
            "hutchinson": "pays most: one backward pass an Euler step. Expected 10-25x",
            "tf32": "unsure: host-bound, but the GEMMs are a third of the step. Expected 1.0-1.3x",
        },
    },
    {
        "name": "dgcnn_knn_train", "family": "point clouds: a kNN graph rebuilt in every layer (DGCNN)",
        "script": f"{W}/w_dgcnn_knn_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
            "bf16": fix("bf16", True, "bf16 autocast"),
            "tf32": fix("tf32", False, "TF32 for the fp32 matmuls (a control)"),
        },
        "expect": {
            "baseline": "edge tensors of up to 335 MB a layer written and read by ~8 separate kernels "
                        "forward and ~12 backward (~20 GB a step, ~7-10 ms); ~0.15 TFLOP of TF32 1x1 "
                        "convolutions (~1 ms); four topk over 16 x 1024 x 1024. Expected 10-15 ms a "
                        "step, memory-bound",
            "compile": "pays most: the gather, subtraction, concatenation and activations fused. "
                       "Expected 1.5-2.5x",
            "bf16": "pays: the edge tensors in half the bytes. Expected 1.4-1.8x",
            "tf32": "does not pay: the convolutions are TF32 already, the distance matmuls small. "
                    "Expected 1.0-1.05x",
        },
    },
]
