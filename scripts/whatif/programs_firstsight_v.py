"""First-sight set V: greedy speculative decoding written by hand (``speculative_decode_infer``: a
2-layer draft proposing 4 tokens a round to a 12-layer target, the proposals compared on the host
one by one, KV caches grown by ``torch.cat``), optical flow trained in RAFT's style
(``raft_flow_train``: an all-pairs correlation pyramid looked up with ``grid_sample`` in 12
ConvGRU refinement iterations) and MoCo v2's contrastive pre-training (``moco_queue_train``: a
momentum encoder moved by a Python loop over its parameters, a queue of 65,536 negatives whose
write position is read from the GPU every step). Entries as in set A (programs_firstsight_a.py):
``pays`` and ``expect`` written with the programs, before any run.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "speculative_decode_infer", "family": "greedy speculative decoding written by hand: a draft's "
                                                    "proposals checked on the host token by token",
        "script": f"{W}/w_speculative_decode_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "generate", "kind": "decode", "interleave": "all",
        "fixes": {
            "accept_on_gpu": fix("accept_on_gpu", False, "the accepted count computed on the GPU (cumulative "
                                                         "product of the matches) and read once a round"),
            "static_cache": fix("static_cache", False, "preallocated KV caches written in place, no cat"),
            "draft_k8": fix("draft_k8", False, "8 draft tokens a round instead of 4"),
            "compile": fix("compile", None, "torch.compile of the target and the draft", compiles=True),
        },
        "expect": {
            "baseline": "a generation of 16 tokens after a 128-token prefill; with random weights the draft agrees "
                        "at about one position in five, so ~12 rounds, each 4 draft forwards of ~40 kernels "
                        "and a target forward of ~200 over 5 tokens (its ~220 MB of bf16 weights read once, "
                        "under 0.1 ms of bandwidth), 1-2 proposals compared with a wait each: ~370 launches "
                        "and ~4 ms of Python a round against ~1.3 ms of GPU. Expected 45-75 ms a generation "
                        "on an H100, host-bound",
            "accept_on_gpu": "does not pay: the host must know the accepted count before the next round, so one "
                             "wait a round stays; only the ~0.25 extra comparisons a round go (the draft seldom "
                             "agrees twice), and the cumulative product adds kernels. Expected 0.97-1.03x",
            "static_cache": "does not pay: each cat becomes a slice assignment, a launch for a launch, and the "
                            "copies it saves are a few hundred KB at these lengths; the crop's views go. "
                            "Expected 0.95-1.05x",
            "draft_k8": "does not pay: four more draft forwards a round (~1.6 ms of launches) for almost no "
                        "more tokens (at one agreement in five a round keeps 1.25 tokens either way). Expected "
                        "0.7-0.85x",
            "compile": "unsure: Inductor's fused blocks launch far fewer kernels from generated code, but the "
                       "cache lengths and token counts change every call (dynamic shapes after the first "
                       "recompiles) and Dynamo's guards check the caches' Python lists at every call of "
                       "either model. Expected 0.9-2.0x",
        },
    },
    {
        "name": "raft_flow_train", "family": "optical flow in RAFT's style: a correlation pyramid looked up in "
                                           "12 ConvGRU refinement iterations",
        "script": f"{W}/w_raft_flow_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "fewer_iters": fix("fewer_iters", True, "8 refinement iterations instead of 12"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward and the loss (correlation and lookup "
                                       "in float32)"),
            "channels_last_bf16": fix("channels_last_bf16", None, "model and frames in torch.channels_last, "
                                                                  "bf16 autocast"),
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
        },
        "expect": {
            "baseline": "batch 4 of 256 x 320 pairs: the encoders ~67 GMAC forward, the update block ~13 GMAC "
                        "an iteration at 4 x 32 x 40 positions (~150 over 12), ~1.3 TFLOP a step with the "
                        "backward in TF32 convolutions (~8-10 ms); each iteration ~95 kernels forward (the "
                        "lookup's grid arithmetic and grid_sample per level, the GRU's gates, the 8x "
                        "upsampling and its loss term) and ~190 backward, ~4,000 launches a step whose host "
                        "time (~20-25 ms) is about the GPU's. Expected 25-40 ms a step on an H100, host and "
                        "GPU close",
            "fewer_iters": "pays: a third of the iterations go, which are ~85% of both the launches and the "
                           "convolutions; the encoders and the correlation stay. Expected 1.25-1.45x",
            "bf16": "does not pay: the convolutions at 32 x 40 gain on bf16 tensor cores, but autocast adds a "
                    "cast at every boundary of the float32 lookup and flow (the motion encoder's cat with the "
                    "flow promotes back to float32 each iteration) to a step already short of launches. "
                    "Expected 0.9-1.1x",
            "channels_last_bf16": "unsure: cuDNN's NHWC bf16 kernels without transposes, and the lookup's "
                                  "permuted output is channels_last already; the casts and launches of bf16 "
                                  "stay. Expected 0.95-1.3x",
            "compile": "pays: Inductor fuses each iteration's grid arithmetic, the GRU's gates and the loss "
                       "terms, forward and backward, and launches from generated code; the convolutions stay "
                       "cuDNN's (a long compile: 12 iterations unrolled). Expected 1.5-2.5x",
        },
    },
    {
        "name": "moco_queue_train", "family": "MoCo v2 contrastive pre-training: a momentum encoder moved by a "
                                            "Python loop, a queue of negatives with its pointer on the GPU",
        "script": f"{W}/w_moco_queue_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "foreach_momentum": fix("foreach_momentum", False, "the key encoder's moving average as "
                                                               "torch._foreach_mul_ and _foreach_add_"),
            "host_pointer": fix("host_pointer", False, "the queue's write position kept as a Python int"),
            "channels_last_bf16": fix("channels_last_bf16", True, "both encoders and the images in "
                                                                  "torch.channels_last, bf16 autocast"),
            "fused_sgd": fix("fused_sgd", False, "SGD(fused=True)"),
        },
        "expect": {
            "baseline": "a ResNet-18 at 64 x 64 (32 x 32 after the stem's pool) ~0.56 GMAC an image: ~140 GMAC "
                        "a forward at batch 256, the query encoder forward and backward and the key encoder "
                        "forward ~1.15 TFLOP of TF32 convolutions (~6-8 ms), BatchNorm and ReLU passes over "
                        "~1.2 GB of fp32 NCHW activations an encoder forward (~5-7 ms with the backward's), "
                        "the logits' 4 GFLOP GEMMs and 16.8M-logit cross entropy under 0.5 ms; ~4 ms of host "
                        "time (two encoders' modules, the backward, 128 launches of the moving average). "
                        "Expected 13-20 ms a step on an H100, GPU-paced",
            "foreach_momentum": "does not pay: the loop's 128 launches are ~1 ms of host time hidden behind "
                                "the GPU's work; its GPU side, 11M parameters read and written twice, is ~0.2 "
                                "ms either way. Expected 1.0-1.04x",
            "host_pointer": "does not pay: the wait at the enqueue leaves the GPU idle only while the first "
                            "backward kernels are launched; the backward's convolutions then keep it ahead. "
                            "Expected 0.99-1.02x",
            "channels_last_bf16": "pays most: NHWC bf16 convolutions without transposes and half the bytes in "
                                  "BatchNorm and ReLU, the logits' GEMM in bf16; the queue, the moving average "
                                  "and the cross entropy stay float32. Expected 1.5-2.1x",
            "fused_sgd": "does not pay: SGD's foreach passes over 11M parameters are ~0.1 ms; one fused kernel "
                         "saves a part of that. Expected 1.0-1.02x",
        },
    },
]
