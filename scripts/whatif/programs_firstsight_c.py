"""Registry entries of the what-if corpus's data-parallel programs, written to be scored at first
sight: DistributedDataParallel on two GPUs, one process a GPU (gradient accumulation that
all-reduces every micro-batch; DDP buckets of 1 MB), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py, with two more fields:

- ``ranks``: the processes (one GPU each) the program runs as: 2
- ``timeout_s``: an interleaved job of all the variants (imports, NCCL's set-up, five models,
  15 rounds) takes longer than one process of a one-GPU program
- ``launcher``: how they are started: ``torchrun`` (``python3 -m torch.distributed.run
  --standalone --nproc-per-node RANKS SCRIPT ARGS``; ``registry.launch``)

Such a program is captured one Nsight Systems report per rank (``whatif_accuracy.py
capture-ranks``, scripts/gpu/firstsight_ddp.sh) and timed by ``interleave`` through its
launcher; the single-GPU paths (``list --capture``, scripts/gpu/corpus_capture.sh, ``measure``,
``interleave`` without ``--programs``) leave it out. Its committed trace is rank 0's,
``traces/corpus/NAME/rank0.sqlite.xz`` (rank 1's beside it): profkit prices a fix per rank.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: no h200 first look.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "ddp_accum_train", "family": "data parallel: gradient accumulation",
        "script": f"{W}/w_ddp_accum_train.py", "args": [], "capture_args": ["--steps", "15"],
        "ranks": 2, "launcher": "torchrun", "timeout_s": 240,
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "no_sync": fix("no_sync", None, "the first 3 of 4 micro-batches inside model.no_sync(): one "
                            "all-reduce round per optimizer step instead of 4"),
            "bucket_100mb": fix("bucket_100mb", False, "DDP(bucket_cap_mb=100): 5-6 buckets a round instead "
                                 "of about 20"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
            "bf16_compress": fix("bf16_compress", None, "DDP's bf16_compress_hook: gradients all-reduced in "
                                  "bf16, half the bytes"),
        },
        "expect": {
            "baseline": "GPT-2 small (124M params) from torch.nn, bf16 autocast, 4 micro-batches of 4 x 1,024 "
                        "tokens per rank and optimizer step, each backward all-reducing 498 MB of fp32 "
                        "gradients in ~20 buckets over NVLink, mostly overlapped with the backward: "
                        "GPU-bound. Expected 45-65 ms a step",
            "no_sync": "unsure: three of four all-reduce rounds go, but over NVLink most of each hides under "
                       "the backward; what goes is each round's exposed tail, DDP's copy-back and the "
                       "SMs NCCL takes from the backward. Expected 1.03-1.12x",
            "bucket_100mb": "no: fewer launches of a round that was not launch-bound, and a larger last "
                            "bucket exposed after the backward. Expected 0.97-1.02x",
            "fused_adamw": "small: 124M params, about 1-2 ms of foreach passes once a step of ~55 ms. "
                           "Expected 1.01-1.04x",
            "bf16_compress": "unsure: half the bytes of mostly hidden all-reduces, two casts a bucket. "
                             "Expected 0.98-1.05x",
        },
    },
    {
        "name": "ddp_small_buckets_train", "family": "data parallel: many small all-reduces",
        "script": f"{W}/w_ddp_small_buckets_train.py", "args": [], "capture_args": ["--steps", "30"],
        "ranks": 2, "launcher": "torchrun", "timeout_s": 240,
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "default_buckets": fix("default_buckets", None, "bucket_cap_mb left at DDP's default (25 MB): "
                                    "about 20 all-reduces a step instead of about 90"),
            "gradient_as_bucket_view": fix("gradient_as_bucket_view", False, "DDP(gradient_as_bucket_view="
                                            "True): no copy of the gradients into and out of the buckets"),
            "static_graph": fix("static_graph", False, "DDP(static_graph=True)"),
            "fused_adamw": fix("fused_adamw", None, "AdamW(fused=True) instead of the default foreach"),
        },
        "expect": {
            "baseline": "BERT-base MLM (110M params) from torch.nn, bf16 autocast, 16 x 128 tokens per rank, "
                        "bucket_cap_mb=1: ~90 all-reduces of 1-94 MB a backward, one after another on NCCL's "
                        "stream, beside a short backward of ~1,000 launches: near the host/GPU balance, "
                        "the last all-reduces exposed. Expected 12-25 ms a step",
            "default_buckets": "unsure: ~70 fewer NCCL launches and latencies, the same bytes; pays as far as "
                               "the all-reduces outlast the backward. Expected 1.0-1.2x",
            "gradient_as_bucket_view": "small: two 440 MB copies a step (~0.3 ms) and their launches. "
                                       "Expected 1.0-1.04x",
            "static_graph": "small: DDP's per-step bookkeeping on the CPU. Expected 1.0-1.03x",
            "fused_adamw": "unsure: 110M params, 1-2 ms of foreach passes a step of ~15 ms, as far as the "
                           "GPU sets the pace. Expected 1.0-1.1x",
        },
    },
]
