"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``cfg_two_pass_sample``: a diffusion transformer sampled with classifier-free
guidance from two calls of the model a step; ``fp64_surrogate_train``: an MLP trained in
float64; ``ssm_scan_infer``: a Mamba-style model whose selective scan is a Python loop over the
tokens), in the format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "cfg_two_pass_sample", "family": "classifier-free guidance from two calls of the denoiser",
        "script": f"{W}/w_cfg_two_pass_sample.py", "args": [], "capture_args": ["--steps", "60"],
        "step_range": "denoise", "kind": "inference", "interleave": "all",
        "fixes": {
            "batched_cfg": fix("batched_cfg", True, "one call on the conditional and unconditional halves "
                                                    "concatenated (batch 8)"),
            "graph": fix("graph", True, "the two calls and the mix captured in a CUDA graph, replayed "
                                        "each step"),
            "bf16": fix("bf16", False, "bf16 autocast around the denoiser's calls"),
        },
        "expect": {
            "baseline": "2 calls of a 33M-parameter DiT on 4 x 256 tokens: ~90 GFLOP of fp32 GEMMs "
                        "(~2 ms) and ~600 kernels with their Python (~5-7 ms of host). Expected 5-8 ms "
                        "a step, host-bound",
            "batched_cfg": "pays: half the launches, the same arithmetic. Expected 1.5-2x",
            "graph": "pays: the launches and their Python go, the kernels stay. Expected 2-3.5x",
            "bf16": "does not pay: the host sets the pace and autocast adds casts. Expected 0.9-1.05x",
        },
    },
    {
        "name": "fp64_surrogate_train", "family": "a model trained in float64",
        "script": f"{W}/w_fp64_surrogate_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "fp32": fix("fp32", None, "model and data in float32, full-precision GEMMs"),
            "fp32_tf32": fix("fp32_tf32", True, "model and data in float32, TF32 GEMMs"),
            "fp32_bf16": fix("fp32_bf16", True, "model and data in float32, bf16 autocast"),
            "tf32": fix("tf32", False, "torch.set_float32_matmul_precision('high') on the float64 "
                                       "model (a control: it does not reach float64 GEMMs)"),
        },
        "expect": {
            "baseline": "~0.5 TFLOP of float64 GEMMs a step (~8-10 ms on FP64 tensor cores) and "
                        "~4 GB of float64 activations and their gradients (~1-2 ms). Expected 10-13 ms "
                        "a step, GPU-bound",
            "fp32": "unsure: float32 GEMMs without TF32 run at about the FP64 tensor-core rate; "
                    "the elementwise half the bytes. Expected 1.0-1.3x",
            "fp32_tf32": "pays: TF32 GEMMs ~7x the FP64 rate. Expected 3-5x",
            "fp32_bf16": "pays most: bf16 GEMMs. Expected 4-7x",
            "tf32": "does not pay: TF32 is for float32 GEMMs. Expected 1.0x",
        },
    },
    {
        "name": "ssm_scan_infer", "family": "a selective scan run token by token from a Python loop",
        "script": f"{W}/w_ssm_scan_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "chunked_scan": fix("chunked_scan", True, "the scan in chunks of 16 tokens, each in closed "
                                                      "form (16 iterations a block, not 256)"),
            "graph": fix("graph", True, "the whole forward captured in a CUDA graph and replayed"),
            "bf16": fix("bf16", False, "bf16 autocast around the forward (the loop kept)"),
        },
        "expect": {
            "baseline": "2 blocks x 256 tokens x 3 kernels of 0.2M elements (~1,500 launches, "
                        "~12-20 ms of host, ~4-6 ms of GPU) around ~0.05 TFLOP of GEMMs. Expected "
                        "12-20 ms a call, host-bound",
            "chunked_scan": "pays: 16x fewer iterations, each on 16 tokens at once. Expected 4-10x",
            "graph": "pays: the launches go, ~1,500 small kernels stay one after another. Expected "
                     "2-4x",
            "bf16": "does not pay: the loop's launches set the pace. Expected 0.9-1.05x",
        },
    },
]
