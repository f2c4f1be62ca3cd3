"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``activation_offload_train``: a decoder trained with its saved activations offloaded
to pageable host memory; ``kge_negative_sampling_train``: knowledge-graph embeddings whose
negatives are drawn in Python each step; ``lbfgs_style_transfer``: an image optimised with
LBFGS through VGG features, PyTorch's style-transfer tutorial), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "activation_offload_train", "family": "saved activations offloaded to pageable host memory",
        "script": f"{W}/w_activation_offload_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "pinned": fix("pinned", True, "save_on_cpu(pin_memory=True): the offload through pinned buffers"),
            "checkpoint": fix("checkpoint", True, "no offload; each block under torch.utils.checkpoint"),
            "no_offload": fix("no_offload", True, "no offload: the saved tensors stay on the GPU"),
            "bf16": fix("bf16", True, "bf16 autocast around the forward, the offload kept"),
        },
        "expect": {
            "baseline": "~0.5 GB of saved tensors copied to fresh pageable host memory in the forward and "
                        "back in the backward (~100-200 ms at 3-8 GB/s), ~0.08 TFLOP of fp32 GEMMs "
                        "(~2-3 ms). Expected 100-200 ms a step, copy-bound",
            "pinned": "pays: the same bytes at pinned rates (~20-50 GB/s, still synchronous). Expected 3-6x",
            "checkpoint": "pays most with no_offload: no copies, a forward again (~1-2 ms). Expected 20-50x",
            "no_offload": "pays most: no copies. Expected 25-60x",
            "bf16": "pays a little: most saved tensors half the bytes, the weights' fp32 copies and the "
                    "bf16 casts of each weight added. Expected 1.2-1.7x",
        },
    },
    {
        "name": "kge_negative_sampling_train", "family": "negative sampling in Python each step",
        "script": f"{W}/w_kge_negative_sampling_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "gpu_sampling": fix("gpu_sampling", True, "the corruption drawn on the GPU (torch.randint, "
                                                      "torch.rand)"),
            "numpy_sampling": fix("numpy_sampling", True, "the corruption drawn with NumPy's vectorised "
                                                          "generator, one copy a step"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True), the Python sampling kept (a control)"),
        },
        "expect": {
            "baseline": "65,536 negatives drawn one at a time in Python and a tensor built from nested "
                        "lists (~60-90 ms of host), then ~3 ms of GPU (gathers, dense gradients and Adam "
                        "over 0.5 GB of tables). Expected 60-90 ms a step, host-bound",
            "gpu_sampling": "pays most: the host work goes; Adam over the tables sets the pace. "
                            "Expected 15-30x",
            "numpy_sampling": "pays: a few ms of vectorised NumPy and a copy instead. Expected 8-20x",
            "fused_adam": "does not pay: the GPU is not the pace. Expected 1.0x",
        },
    },
    {
        "name": "lbfgs_style_transfer", "family": "an input optimised with LBFGS (host reads in its recursion)",
        "script": f"{W}/w_lbfgs_style_transfer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "lbfgs_step", "kind": "training", "interleave": "all",
        # a step of ~0.2 s and five variants: 7 rounds keep the timing under 100 s
        "rounds": 7,
        "fixes": {
            "gpu_two_loop": fix("gpu_two_loop", True, "the same LBFGS with the two-loop recursion's "
                                                      "coefficients kept on the GPU"),
            "history10": fix("history10", True, "LBFGS(history_size=10): a different optimiser, "
                                                "10x fewer history entries"),
            "bf16": fix("bf16", None, "bf16 autocast around the VGG features"),
            "channels_last": fix("channels_last", False, "the VGG layers in channels_last, the image "
                                                        "copied to it at each evaluation"),
        },
        "expect": {
            "baseline": "20 evaluations a step, each ~0.12 TFLOP of TF32 convolutions (~1-2 ms) and, "
                        "once the history is full, ~200 host reads of GPU scalars around tiny kernels "
                        "(~6-8 ms). Expected 150-200 ms a step, bound by the waits",
            "gpu_two_loop": "pays: the waits go, ~600 tiny kernels a evaluation stay. Expected 1.8-3x",
            "history10": "pays most: a tenth of the recursion. Expected 2.5-4x",
            "bf16": "unsure: the convolutions are a small share. Expected 1.0-1.15x",
            "channels_last": "does not pay: the waits set the pace. Expected 0.95-1.05x",
        },
    },
]
