"""First-sight set X: sharpness-aware minimisation written as its common re-implementation, with
per-parameter Python loops around two forward-backward passes of a Wide ResNet
(``sam_wrn_train``), gradual global magnitude pruning whose threshold is a ``kthvalue`` over
every weight at every step (``global_prune_train``) and autoregressive PixelCNN sampling, the
whole network run for each pixel in turn (``pixelcnn_sample_infer``). Entries as in set A
(programs_firstsight_a.py): ``pays`` and ``expect`` written with the programs, before any run on
a GPU.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "sam_wrn_train", "family": "a two-pass optimizer written with per-parameter Python loops: "
                                           "SAM around SGD, a Wide ResNet 16-4",
        "script": f"{W}/w_sam_wrn_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "foreach_sam": fix("foreach_sam", False, "SAM's ascent and restore as torch._foreach_* ops over the "
                                                     "parameter list"),
            "channels_last_bf16": fix("channels_last_bf16", True, "channels_last model and images, bf16 "
                                                                  "autocast over both passes"),
            "fused_sgd": fix("fused_sgd", False, "SGD(fused=True) as the base optimizer"),
            "compile": fix("compile", True, "torch.compile(model): both passes compiled, the wrapper eager",
                           compiles=True),
        },
        "expect": {
            "baseline": "WRN-16-4 at batch 128, 32 x 32: ~0.79 GFLOP an image forward, ~600 GFLOP a step for "
                        "the two passes (TF32 convolutions, ~3-5 ms on an H100), and ~11 GB of batch-norm, "
                        "ReLU and residual traffic (~3.5 ms); ~360 launches for the two passes, ~180 for "
                        "SAM's loops over 44 tensors and ~10 for SGD's foreach: ~550 launches, ~6-8 ms of "
                        "host time. Expected 9-13 ms a step on an H100, GPU-bound with the host close behind",
            "foreach_sam": "does not pay: the ~170 launches it removes are host time the GPU does not wait "
                           "for. Expected 1.0-1.05x",
            "channels_last_bf16": "pays: bf16 convolutions about twice TF32's rate and half the elementwise "
                                  "bytes take the GPU to ~4-6 ms; the host (~7-8 ms with autocast's weight "
                                  "casts, two passes) then sets the pace. Expected 1.3-1.6x",
            "fused_sgd": "does not pay: foreach SGD is ~10 launches and ~0.1 ms over 11 MB. Expected 1.0-1.02x",
            "compile": "pays a little: the batch norms' and ReLUs' elementwise passes fused (the statistics "
                       "still their own kernels), fewer launches, two graph calls of each pass a step. "
                       "Expected 1.1-1.3x",
        },
    },
    {
        "name": "global_prune_train", "family": "gradual magnitude pruning: a global kthvalue threshold over every "
                                                "weight recomputed each step",
        "script": f"{W}/w_global_prune_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "sort_threshold": fix("sort_threshold", True, "the threshold from torch.sort of the magnitudes (a "
                                                          "device-wide radix sort) instead of kthvalue"),
            "every_100": fix("every_100", True, "the threshold recomputed every 100 steps, the mask applied in "
                                                "between"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True)"),
            "compile": fix("compile", False, "torch.compile(model) (the pruning eager)", compiles=True),
        },
        "expect": {
            "baseline": "a 6-layer GPT of width 512 over 16 x 256 tokens in bf16: ~600 GFLOP a step (~2-3 ms "
                        "on an H100) and ~550 launches (~6 ms of host time); then kthvalue over 23 M "
                        "magnitudes (92 MB): PyTorch's radix selection runs one block per slice, 16 passes "
                        "of 2 bits over the vector from one SM at a few tens of GB/s, ~30-100 ms. Expected "
                        "40-110 ms a step, one kernel most of it",
            "sort_threshold": "pays: CUB's radix sort of 23 M floats reads and writes them ~4 times over the "
                              "whole GPU (~1-2 ms), the rest as before. Expected 5-10x",
            "every_100": "pays most: the selection runs on 1 step of 100, the masks' multiplications stay "
                         "(~25 kernels over 92 MB). Expected 6-12x",
            "fused_adamw": "does not pay: AdamW is ~0.3 ms of a step the selection sets. Expected 1.0-1.01x",
            "compile": "does not pay: the model is a few ms of a step the selection sets. Expected 1.0-1.05x",
        },
    },
    {
        "name": "pixelcnn_sample_infer", "family": "autoregressive image sampling: a PixelCNN run over the whole "
                                                   "image for every pixel",
        "script": f"{W}/w_pixelcnn_sample_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "sample", "kind": "inference", "interleave": "all",
        "fixes": {
            "graph": fix("graph", True, "one pass (network, draw, write) captured once in a CUDA graph, the "
                                        "pixel's index in a device tensor"),
            "compile_graphs": fix("compile_graphs", True, "torch.compile(net, mode='reduce-overhead'), the draw "
                                                          "eager", compiles=True),
            "bf16": fix("bf16", False, "bf16 autocast around the network"),
        },
        "expect": {
            "baseline": "256 passes a batch of 16 images of 16 x 16, each ~70 kernels (14 convolutions with "
                        "their bias and ReLU kernels, 7 weight-times-mask products, 6 residual adds, the draw) "
                        "over 16 x 64 x 16 x 16 values, 2-4 us each on the GPU (~200 us a pass, ~50 ms a "
                        "batch); ~18,000 launches a batch at ~8-10 us each: ~150-180 ms, host-bound",
            "graph": "pays: each pass one graph launch and a fill; the GPU's ~70 kernels, back to back, set "
                     "the pace (~50-60 ms). Expected 2.5-3.5x",
            "compile_graphs": "pays most: Inductor folds the ReLUs, adds and mask products into fewer kernels "
                              "around cuDNN's convolutions (~35 a pass, ~30-40 ms of GPU), replayed as a "
                              "graph; the draw and the write stay eager (~6 launches a pass, ~15 ms of host). "
                              "Expected 3.5-5x",
            "bf16": "does not pay: autocast adds a cast of each convolution's weight and input (~28 more "
                    "launches a pass) to a host-bound loop. Expected 0.75-0.9x",
        },
    },
]
