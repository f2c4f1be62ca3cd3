"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``ensemble_loop_train``: a deep ensemble trained one member at a time in a Python
loop; ``masked_sdpa_train``: fused attention given its causal mask as a tensor, which keeps it off
the flash kernels; ``gpu_augment_loop_train``: data augmentation on the GPU one image at a time),
in the format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "ensemble_loop_train", "family": "a deep ensemble trained one member at a time",
        "script": f"{W}/w_ensemble_loop_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "vmapped": fix("vmapped", True, "the members stacked and run as one model under torch.func.vmap: "
                                            "one forward, one backward, one AdamW"),
            "one_backward": fix("one_backward", True, "the members' losses summed: one backward and one AdamW "
                                                      "over every member's parameters"),
            "fused_adamw": fix("fused_adamw", None, "AdamW(fused=True) for each member"),
        },
        "expect": {
            "baseline": "8 MLPs of 1.6M parameters, batch 512, fp32: ~5 GFLOP a member forward and backward "
                        "(~0.1 ms of GEMMs each), ~30 launches and an optimizer's Python a member. Expected "
                        "2.5-4 ms a step, host-bound, the GPU idle between small GEMMs",
            "vmapped": "pays: ~40 launches of batched GEMMs and one optimizer step for the eight; the GPU's "
                       "~1 ms of work then sets the step. Expected 2.5-4x",
            "one_backward": "pays: the backward's and the optimizer's Python once instead of eight times, the "
                            "forwards still a loop. Expected 1.3-1.8x",
            "fused_adamw": "unsure, small: one launch instead of ~8 per member, the optimizer's Python kept. "
                           "Expected 1.05-1.2x",
        },
    },
    {
        "name": "masked_sdpa_train", "family": "fused attention given its causal mask as a tensor",
        "script": f"{W}/w_masked_sdpa_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "is_causal": fix("is_causal", True, "scaled_dot_product_attention(is_causal=True), no mask tensor"),
            "compile": fix("compile", None, "torch.compile(model) (default mode), the mask kept", compiles=True),
            "fused_adamw": fix("fused_adamw", None, "AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "GPT-2 small, 4 x 2048 tokens, bf16 autocast: ~6 TFLOP of GEMMs (~14 ms) and ~2.2 "
                        "TFLOP of attention computed over the full score matrix by the memory-efficient "
                        "kernels (~10 ms). Expected 25-30 ms a step, GPU-bound",
            "is_causal": "pays: the flash kernels skip the masked half (~1.1 TFLOP, ~3 ms). Expected 1.3-1.6x",
            "compile": "unsure: norms, GELU and residual adds fused, the attention kernels kept. "
                       "Expected 1.05-1.15x",
            "fused_adamw": "unsure, small: ~1.5 ms of foreach passes over 124M parameters become ~0.7 ms. "
                           "Expected 1.02-1.06x",
        },
    },
    {
        "name": "gpu_augment_loop_train", "family": "data augmentation on the GPU one image at a time",
        "script": f"{W}/w_gpu_augment_loop_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "batched_augment": fix("batched_augment", True, "crop, resize and flip of the whole batch as one affine "
                                                            "grid sample, brightness and normalisation batched"),
            "compile": fix("compile", False, "torch.compile(model) (default mode), the augmentation loop kept",
                           compiles=True),
            "channels_last": fix("channels_last", False, "model and batch in channels-last memory format"),
        },
        "expect": {
            "baseline": "~7 launches per image, 128 images: ~900 launches of tiny kernels a step (~5-7 ms of "
                        "host issue) before a small ResNet's ~180 launches over 128 x 128 x 128 images (~2-3 ms "
                        "of GPU work). Expected 7-10 ms a step, host-bound",
            "batched_augment": "pays: ~10 launches for the batch; the network's GPU time and launches then set "
                               "the step. Expected 2.5-4x",
            "compile": "does not pay: the model's BatchNorm/ReLU passes fused on a step the augmentation loop "
                       "paces. Expected 0.98-1.05x",
            "channels_last": "does not pay: faster convolutions on a host-bound step. Expected 0.98-1.03x",
        },
    },
]
