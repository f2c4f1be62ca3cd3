"""Registry entries of what-if corpus programs of two kinds the corpus lacked, to be scored at first
sight (``rl_rollout_train``: reinforcement learning whose environment steps on the CPU, a host
round trip every environment step; ``padded_encoder_infer``: variable-length texts padded to the
model's maximum, most of every batch's work spent on padding), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix, tf32_fix


PROGRAMS: list[dict] = [
    {
        "name": "rl_rollout_train", "family": "reinforcement learning: CPU environment rollout",
        "script": f"{W}/w_rl_rollout_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "iteration", "kind": "training", "interleave": "all",
        "fixes": {
            "gpu_env": fix("gpu_env", None, "the same environment (dynamics, rewards, ends, resets) in torch "
                                            "on the GPU: no copy in, no read-back of the actions per step"),
            "more_envs": fix("more_envs", True, "256 environments and rollouts of 16 steps instead of 64 and 64: "
                                                "the same 4,096 samples an iteration, a quarter of the round trips"),
            "fused_adam": fix("fused_adam", None, "Adam(fused=True) instead of the default foreach"),
        },
        "expect": {
            "baseline": "CleanRL-style PPO: 64 numpy environments, rollouts of 64 steps, actor and critic MLPs "
                        "of 3 x 256 in fp32 (273K parameters). Per environment step ~45 launches of "
                        "microsecond kernels at batch 64 and six waits (the actions read back, three "
                        "pageable copies in, Categorical's two argument checks); then GAE's Python loop "
                        "(~500 launches) and 16 minibatches of 1,024 (~250 launches each with backward, "
                        "gradient clipping and foreach Adam). Host-bound throughout, the GPU mostly idle. "
                        "Expected 35-65 ms an iteration",
            "gpu_env": "unsure: the read-back and the three copies a step go, but Categorical's two checks "
                       "still wait every step, and the environment's ~30 elementwise operations become "
                       "launches that cost about what numpy's step and the copies did; the update is "
                       "unchanged. Expected 0.8-1.2x",
            "more_envs": "pays: a quarter of the rollout's steps, waits and launches and of GAE's loop, each "
                         "at 4x the batch (still microsecond kernels); the update, about half the iteration, "
                         "unchanged. Expected 1.4-2.0x",
            "fused_adam": "unsure, small: one kernel for the 16 tensors instead of the foreach passes saves "
                          "~0.1-0.2 ms of launching per minibatch, 16 minibatches an iteration. "
                          "Expected 1.02-1.08x",
        },
    },
    {
        "name": "padded_encoder_infer", "family": "padding waste: variable-length batches padded to the maximum",
        "script": f"{W}/w_padded_encoder_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "batch", "kind": "inference", "interleave": "all",
        "fixes": {
            "pad_to_longest": fix("pad_to_longest", True, "each batch padded to its longest text, rounded up "
                                                          "to a multiple of 8, instead of to 512"),
            "sort_by_length": fix("sort_by_length", True, "each pool of 8 batches' texts sorted by length before "
                                                          "batching, each batch padded to its longest (rounded "
                                                          "up to 8): the same texts"),
            "bf16": fix("bf16", True, "the forward under torch.autocast(bfloat16)"),
            "tf32": tf32_fix(),
        },
        "expect": {
            "baseline": "BERT-base shape in fp32 (TF32 off), 32 texts of ~90 tokens on average padded to 512: "
                        "~3.1 TFLOP a batch (2.8 of GEMMs on the CUDA cores, 0.3 of memory-efficient "
                        "attention with the additive mask), 82% of the positions padding; ~160 launches, "
                        "GPU-bound. Expected 55-90 ms a batch",
            "pad_to_longest": "pays: ~315 positions a text instead of 512 on this stream (the longest of 32 "
                              "long-tailed draws): 1.6x fewer GEMM FLOPs, 2.4x fewer in attention. "
                              "Expected 1.45-1.8x",
            "sort_by_length": "pays: ~130 positions a text, 3.9x fewer GEMM FLOPs and 7x fewer in attention; "
                              "at ~4,200 positions a batch the GEMMs still fill the GPU and the launches stay "
                              "hidden. Expected 3-4.2x",
            "bf16": "pays: GEMMs and attention on bf16 tensor cores, half the bytes in most elementwise "
                    "passes; the padding stays. Expected 4-7x",
            "tf32": "pays: the GEMMs as TF32 on the tensor cores; the fp32 attention and the elementwise "
                    "passes stay, a larger part of a shorter batch. Expected 2.5-4x",
        },
    },
]
