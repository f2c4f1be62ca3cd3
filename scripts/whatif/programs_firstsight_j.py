"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``knn_retrieval_infer``: nearest-neighbour retrieval whose chunks' similarities are
ranked by numpy on the host; ``gru_rollout_infer``: an autoregressive GRU forecaster stepped in
Python, each prediction fed back; ``ddpm_cpu_schedule_train``: a diffusion UNet's training step
whose noise schedule is looked up in host tensors and whose loss is logged each step), in the
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
        "name": "knn_retrieval_infer", "family": "retrieval: similarities ranked on the host",
        "script": f"{W}/w_knn_retrieval_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "search", "kind": "inference", "interleave": "all",
        "fixes": {
            "gpu_topk": fix("gpu_topk", True, "torch.topk on each chunk and the merge on the GPU, the 64 x 10 "
                                              "ids copied back once"),
            "pinned": fix("pinned", None, "each chunk's similarities copied into a pinned buffer, numpy kept"),
            "bf16": fix("bf16", False, "gallery and queries in bf16 for the similarity GEMMs"),
        },
        "expect": {
            "baseline": "4 chunks a batch: a 64 x 128 x 100k GEMM (~20 us), 25.6 MB copied to pageable memory "
                        "(~3-5 ms) and numpy's argpartition over 6.4M floats (~20-30 ms) each. Expected "
                        "80-140 ms a batch, the host's numpy most of it",
            "gpu_topk": "pays: a topk kernel per chunk and one copy of 640 ids; the GPU's ~1 ms and the "
                        "launches set the batch. Expected 30-100x",
            "pinned": "unsure, small: the copies at the pinned rate (~1 ms a chunk saved), numpy's scan "
                      "unchanged. Expected 1.02-1.12x",
            "bf16": "does not pay: a faster GEMM of microseconds on a step numpy paces. Expected 0.97-1.02x",
        },
    },
    {
        "name": "gru_rollout_infer", "family": "autoregressive GRU forecaster stepped in Python",
        "script": f"{W}/w_gru_rollout_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "forecast", "kind": "inference", "interleave": "all",
        "fixes": {
            "graph": fix("graph", True, "the whole forecast captured in one CUDA graph, replayed each batch"),
            "cudnn_encoder": fix("cudnn_encoder", True, "the encoder as nn.GRU over the history; the decoder's "
                                                        "feedback loop kept"),
            "bf16": fix("bf16", False, "cells and head under bf16 autocast"),
        },
        "expect": {
            "baseline": "96 encoder and 48 decoder steps of 3-4 small kernels (GEMMs of 64 x 256 x 768, the "
                        "cell update, the head): ~550 launches at ~6 us of host each, ~1.5 ms of GPU work. "
                        "Expected 3-4.5 ms a batch, host-bound",
            "graph": "pays: one replay; the GPU's ~1.5 ms of back-to-back kernels sets the batch. Expected "
                     "2.5-4x",
            "cudnn_encoder": "pays: the encoder's ~290 launches become a few; the decoder loop stays. "
                             "Expected 1.4-1.9x",
            "bf16": "does not pay: autocast adds casts to a host-bound loop. Expected 0.85-1.0x",
        },
    },
    {
        "name": "ddpm_cpu_schedule_train", "family": "diffusion training with the schedule on the host",
        "script": f"{W}/w_ddpm_cpu_schedule_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "gpu_schedule": fix("gpu_schedule", None, "the schedule on the GPU and the loss summed there: no "
                                                      "wait in the step"),
            "bf16": fix("bf16", True, "the UNet's forward and loss under bf16 autocast"),
            "channels_last": fix("channels_last", None, "UNet and input in torch.channels_last"),
        },
        "expect": {
            "baseline": "a 64-256 channel UNet on 64 images of 32 x 32: ~0.6 TFLOP forward and backward in "
                        "TF32 convolutions (~10-20 ms) and ~250 launches; two waits a step. Expected 15-25 ms "
                        "a step, GPU-bound",
            "gpu_schedule": "unsure, small: the two waits drain the queue twice a step, the host's ~3 ms of "
                            "launches then refill it. Expected 1.02-1.1x",
            "bf16": "pays: the convolutions at the bf16 tensor-core rate, GroupNorm and SiLU at half "
                    "the bytes. Expected 1.4-1.9x",
            "channels_last": "unsure: cuDNN's NHWC kernels without the layout transposes, GroupNorm on "
                             "channels_last maybe slower. Expected 0.95-1.2x",
        },
    },
]
