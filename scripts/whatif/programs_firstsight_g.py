"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``anomaly_debug_train``: autograd's anomaly detection left on in a training loop;
``request_loop_infer``: a service that runs its waiting requests through the model one at a time;
``cpu_embedding_train``: an embedding table kept in host memory and updated on the CPU), in the
format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "anomaly_debug_train", "family": "a debugging mode left on: autograd anomaly detection",
        "script": f"{W}/w_anomaly_debug_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "anomaly_off": fix("anomaly_off", True, "no anomaly detection (the debugging block taken out)"),
            "check_nan_off": fix("check_nan_off", True, "detect_anomaly(check_nan=False): the stacks kept, "
                                                        "the backward's NaN checks and their waits gone"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "6-layer encoder of hidden 512, bf16 autocast, 32 x 128 tokens: ~0.5 TFLOP forward and "
                        "backward, ~1,000 launches, 5-7 ms a step without the debugging mode. With it: a "
                        "Python stack taken for each of ~150 autograd nodes of the forward (~40 us each) and "
                        "~250 NaN checks in the backward, each two launches and a wait for the GPU. Expected "
                        "20-35 ms a step, host-bound with the GPU drained at every check",
            "anomaly_off": "pays: the stacks and the checks go; the step is the eager model's launches. "
                           "Expected 3-5x",
            "check_nan_off": "pays: the waits and the checks' launches go, the stacks stay. Expected 1.4-1.8x",
            "fused_adamw": "does not pay: ~100 tensors, 35M parameters, a few foreach launches on a "
                           "host-bound step. Expected 1.00-1.03x",
        },
    },
    {
        "name": "request_loop_infer", "family": "serving: waiting requests run one at a time",
        "script": f"{W}/w_request_loop_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "serve", "kind": "inference", "interleave": "all",
        "fixes": {
            "batched": fix("batched", True, "the 32 waiting requests as one batch padded to the longest "
                                            "(rounded up to 8), one forward, the answers read back at once"),
            "no_item": fix("no_item", None, "each answer kept on the GPU, the 32 read back at the iteration's end"),
            "compile": fix("compile", True, "torch.compile(model, dynamic=True) (default mode)", compiles=True),
        },
        "expect": {
            "baseline": "DistilBERT shape in bf16, 32 requests of ~60 tokens (8-256) an iteration, each at batch "
                        "1: ~85 launches of microsecond kernels and one wait per request, ~0.6 ms of host "
                        "issue each. Expected 15-25 ms an iteration, host-bound",
            "batched": "pays: one forward over ~32 x 200 padded positions, ~0.55 TFLOP of bf16 GEMMs "
                       "(~1.5 ms with the rest), ~90 launches and one wait. Expected 8-15x",
            "no_item": "unsure, small: the GPU keeps up with the host at batch 1, so each wait is its "
                       "queue's tail and the sync's latency. Expected 1.03-1.15x",
            "compile": "pays: norms, GELU, residual adds and the embeddings' sums fused, ~45 launches a "
                       "request instead of ~85, Dynamo's guards checked per call. Expected 1.2-1.5x",
        },
    },
    {
        "name": "cpu_embedding_train", "family": "an embedding table kept in host memory, updated on the CPU",
        "script": f"{W}/w_cpu_embedding_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "gpu_table": fix("gpu_table", True, "the table, its ids and SparseAdam on the GPU"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True) for the MLP"),
            "compile": fix("compile", False, "torch.compile of the MLP and loss (default mode)", compiles=True),
        },
        "expect": {
            "baseline": "1M x 128 EmbeddingBag on the CPU: 82k lookups a step, a sparse gradient of 82k rows "
                        "(42 MB), SparseAdam coalescing it and updating ~60k rows and their moments, all on "
                        "the host; a 2 MB copy each way; the fp32 MLP (~20 GFLOP forward and backward) well "
                        "under 1 ms on the GPU. Expected 30-60 ms a step, the GPU idle most of it",
            "gpu_table": "pays: lookup, sparse gradient and SparseAdam on the GPU (a sort and a few dozen "
                         "kernels), no copies of the pooled vectors. Expected 10-20x",
            "fused_adam": "does not pay: 8 tensors, 0.8M parameters. Expected 1.00-1.01x",
            "compile": "does not pay: the MLP's few launches on a step the host's table work sets. "
                       "Expected 1.00-1.02x",
        },
    },
]
