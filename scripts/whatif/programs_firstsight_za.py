"""First-sight set ZA: MAML's second-order meta-training walked one task at a time
(``maml_inner_loop_train``), greedy decoding that runs the whole sequence again for every token
(``nocache_decode_infer``: no KV cache) and a layer stack whose weights are streamed from pageable
host memory at every forward (``weight_streaming_infer``: sequential CPU offload). Entries as in
set A (programs_firstsight_a.py): ``pays`` and ``expect`` written with the programs, before any
run on a GPU.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "maml_inner_loop_train", "family": "meta-learning, MAML: second-order inner SGD steps by "
                                                   "autograd.grad(create_graph=True), a Python loop over the tasks",
        "script": f"{W}/w_maml_inner_loop_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        # ~313 ms a step on an H100 (its capture's baseline): 15 rounds of 4 variants' blocks ran
        # past two timing processes' 95 and 120 s
        "rounds": 5,
        "fixes": {
            "vmap_tasks": fix("vmap_tasks", True, "torch.func.vmap over the tasks of inner steps taken by "
                                                  "torch.func.grad: the same second-order meta-gradient"),
            "first_order": fix("first_order", True, "first-order MAML: inner gradients without create_graph "
                                                    "(an approximation)"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward and its inner loops"),
        },
        "expect": {
            "baseline": "4 tasks x 5 inner steps on 25 images of 84 x 84 through a 32-filter Conv-4: each inner "
                        "step ~25 forward kernels, ~50 of a backward that builds its graph and 36 for the "
                        "weight update, and functional_call's swapping of 18 tensors; the meta-backward "
                        "differentiates all of it again (BatchNorm's and the convolutions' double backward): "
                        "~8,000-10,000 launches a step. The GPU's work is ~0.2 TFLOP of small convolutions "
                        "and ~0.5 GB of element-wise passes (~15-25 ms). Expected 50-90 ms a step on an H100, "
                        "host-bound",
            "vmap_tasks": "pays: a quarter of the inner steps, each over the 4 tasks' 100 images (per-task "
                          "weights as grouped convolutions, BatchNorm's batching rule reshaping around them), "
                          "the GPU's work unchanged but in 4x larger kernels; functorch's transforms add "
                          "Python of their own. Expected 1.5-3x",
            "first_order": "pays most: no graph of the inner backwards, so the meta-backward runs through the "
                           "4 query forwards alone and the inner steps build nothing to keep: ~2,700 launches. "
                           "Expected 2.5-4x",
            "bf16": "does not pay: host-bound, and autocast casts the adapted (non-leaf) weights again at every "
                    "inner forward, adding kernels; the convolutions are too small to gain from bf16. "
                    "Expected 0.8-1.0x",
        },
    },
    {
        "name": "nocache_decode_infer", "family": "greedy decoding without a KV cache: the whole sequence run "
                                                  "again for every new token",
        "script": f"{W}/w_nocache_decode_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "generate", "kind": "decode", "interleave": "all",
        "fixes": {
            "kv_cache": fix("kv_cache", True, "a preallocated KV cache: the prompt prefilled once, then one "
                                              "token a forward"),
            "last_logits": fix("last_logits", True, "the head on the last position alone (recomputation "
                                                    "kept)"),
            "bf16": fix("bf16", True, "the model's weights and activations in bf16"),
        },
        "expect": {
            "baseline": "64 forwards of a 6-layer, width-512 decoder (35 M parameters, half of them the "
                        "32,000-way head) over 4 x 192-255 tokens: ~65 GFLOP each, ~4.2 TFLOP of fp32 "
                        "GEMMs a generation at ~30-40 TFLOP/s on CUDA cores, and ~80 launches a forward "
                        "(~5,000 in all, ~30-50 ms of host time hidden behind the GPU). Expected 110-180 ms "
                        "a generation on an H100, GPU-bound",
            "kv_cache": "pays: a 768-token prefill (~54 GFLOP, ~2 ms) then 63 forwards of 4 tokens that "
                        "read 140 MB of weights each (~0.1 ms of the GPU's); the ~85 launches and module "
                        "calls of a forward (~0.6-0.8 ms of host time) then set the pace. Expected 35-60 ms, "
                        "2.5-4x",
            "last_logits": "pays: the head's GEMM over ~900 rows, 29 of each forward's ~65 GFLOP, goes; the "
                           "step stays GPU-bound. Expected 1.5-1.9x",
            "bf16": "pays about as much as kv_cache: the GEMMs on tensor cores (~10-15 ms for the 4.2 TFLOP) "
                    "and flash attention, leaving the same ~5,000 launches to set the pace. Expected "
                    "35-60 ms, 2.5-4x",
        },
    },
    {
        "name": "weight_streaming_infer", "family": "sequential CPU offload: every layer's weights copied from "
                                                    "pageable host memory at every forward",
        "script": f"{W}/w_weight_streaming_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "pinned": fix("pinned", True, "the host weights pinned, copied with non_blocking=True (one stream)"),
            "prefetch": fix("prefetch", True, "pinned weights, the next layer's copied on a side stream while "
                                              "this one computes"),
            "resident": fix("resident", True, "all the weights on the GPU (2.4 GB), no copies"),
        },
        "expect": {
            "baseline": "2.4 GB of bf16 weights copied from pageable memory each batch, 12 synchronous copies a "
                        "layer staged by the driver (~10-25 GB/s), then the layer's ~0.8 TFLOP of bf16 GEMMs "
                        "(~1.5 ms) with the copy engine idle: ~100-240 ms of copies and ~10 ms of compute in "
                        "turn. Expected 110-250 ms a batch on an H100, bound by the host-to-device copies",
            "pinned": "pays: the copies at the link's rate from pinned memory (~25-50 GB/s: 50-100 ms), the CPU "
                      "queueing ahead; compute still waits for each copy on the one stream. Expected 60-110 ms, "
                      "1.8-3x",
            "prefetch": "pays a little more than pinned: the ~10 ms of compute hidden under the next layer's "
                        "copy, the copies still the bound. Expected 50-100 ms, 2-3.5x",
            "resident": "pays most: no copies; ~5 TFLOP of bf16 GEMMs and flash attention over 2,048 tokens. "
                        "Expected 8-12 ms, 10-25x",
        },
    },
]
