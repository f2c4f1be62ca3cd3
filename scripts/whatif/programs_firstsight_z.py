"""First-sight set Z: an orthogonal RNN whose parametrized recurrent weight is recomputed at every
time step (``orthogonal_rnn_train``), a linear probe whose backbone still takes gradients
(``linear_probe_train``) and DINO's multi-crop run one crop at a time (``multicrop_dino_train``).
Entries as in set A (programs_firstsight_a.py): ``pays`` and ``expect`` written with the
programs, before any run on a GPU.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "orthogonal_rnn_train", "family": "a parametrization recomputed at every call: an orthogonal "
                                                  "recurrent weight (matrix exponential) in a Python time loop",
        "script": f"{W}/w_orthogonal_rnn_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "cached": fix("cached", True, "the forward under parametrize.cached(): the orthogonal weight "
                                          "computed once a step"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward (loop and parametrization kept)"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True)"),
        },
        "expect": {
            "baseline": "64 time steps, each recomputing a 256 x 256 matrix exponential (~10 GEMMs and ~30 "
                        "element-wise kernels) and its backward (a 512 x 512 exponential): ~7,000 launches "
                        "and ~0.2 TFLOP of fp32 GEMMs a step. Expected 60-150 ms a step on an H100, "
                        "host-bound with a large GPU share (sized down from 96 steps of 384 before any "
                        "capture: its first capture did not finish in its time, its calibration run 0.9 s "
                        "a step)",
            "cached": "pays most: one exponential and one backward of it a step, ~2,000 launches left (the "
                      "cell's own). Expected 5-10x",
            "bf16": "does not pay: the exponential stays fp32 under autocast and casts are added to every "
                    "step. Expected 0.9-1.0x",
            "fused_adam": "does not pay: 5 parameter tensors. Expected 1.0x",
        },
    },
    {
        "name": "linear_probe_train", "family": "a linear probe whose frozen-by-intent backbone still takes "
                                                "gradients (the optimizer holds the classifier alone)",
        "script": f"{W}/w_linear_probe_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "frozen": fix("frozen", True, "backbone.requires_grad_(False): the backward stops at the "
                                          "classifier"),
            "channels_last": fix("channels_last", None, "model and images in torch.channels_last"),
            "compile": fix("compile", None, "torch.compile(model)", compiles=True),
        },
        "expect": {
            "baseline": "a ResNet-18-shaped CNN at 128 x 128, batch 256, bf16 autocast: ~150 GFLOP forward, "
                        "~450 with the backward, and BatchNorm's element-wise passes: ~5-8 ms of GPU, ~250 "
                        "launches. Expected 6-9 ms a step on an H100, GPU-bound",
            "frozen": "pays most: the backward shrinks to the classifier's (the backbone's input and weight "
                      "gradients and 11 M gradient accumulations gone). Expected 2.2-3x",
            "channels_last": "may pay: cuDNN's NHWC kernels in bf16 without layout transposes. Expected "
                             "1.0-1.3x",
            "compile": "may pay: BatchNorm and ReLU fused into fewer passes. Expected 1.0-1.3x",
        },
    },
    {
        "name": "multicrop_dino_train", "family": "self-distillation with multi-crop (DINO) run one crop at a "
                                                  "time",
        "script": f"{W}/w_multicrop_dino_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "grouped": fix("grouped", True, "the crops of each resolution concatenated: two student forwards "
                                            "and one teacher forward"),
            "bf16": fix("bf16", None, "bf16 autocast over the forwards and the loss"),
            "channels_last": fix("channels_last", None, "networks and crops in torch.channels_last"),
            "compile_reduce_overhead": fix("compile_reduce_overhead", None,
                                           "student and teacher each torch.compile(net, mode='reduce-overhead')",
                                           compiles=True),
        },
        "expect": {
            "baseline": "8 student forwards and backwards and 2 teacher forwards of 64 images (96 or 48 "
                        "pixels) through 8 convolutions and a 3-layer head, 14 loss terms: ~1,300 launches "
                        "and ~15-20 ms of host time, ~8-12 ms of GPU. Expected 15-22 ms a step on an H100, "
                        "host-bound",
            "grouped": "pays most: 3 forwards and 2 backwards, ~500 launches, the GPU's kernels on 2-6 times "
                       "the images. Expected 1.8-2.8x",
            "bf16": "may pay a little: the convolutions are small; autocast adds casts to a host-bound step. "
                    "Expected 0.9-1.1x",
            "channels_last": "may pay a little on the GPU side of a host-bound step. Expected 0.95-1.1x",
            "compile_reduce_overhead": "added after its first sight, to time its top action (PK103's, priced "
                                       "3.08x): the forwards and the student's backward as CUDA graphs, one "
                                       "per crop size, the loss, the EMA and AdamW eager (~300 launches). "
                                       "Expected 1.8-3x",
        },
    },
]
