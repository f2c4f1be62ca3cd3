"""Registry entries of what-if corpus programs written after a rule was first built on another
program of their kind, to judge that rule at first sight on a program it was not built on
(``accum_resnet_train``: gradient accumulation in a convolutional network, for PK205, which was
written for a GPT-2 step with 8 fp16 micro-batches), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "accum_resnet_train", "family": "gradient accumulation, bf16 channels_last CNN",
        "script": f"{W}/w_accum_resnet_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bigger_micro": fix("bigger_micro", None, "2 micro-batches of 64 images instead of 4 of 32"),
            "one_batch": fix("one_batch", None, "1 batch of 128 images, no accumulation"),
            "compile": fix("compile", None, "torch.compile(model), default mode; 4 micro-batches kept",
                           compiles=True),
            # added after the first sight: PK103's by-hand graph, which no fix timed there
            "graph": fix("graph", None, "the whole step (4 micro-batches, the optimizer) in one CUDA graph "
                                        "by hand"),
        },
        "expect": {
            "baseline": "a ResNet-50-shaped network in plain PyTorch, bf16 autocast, channels_last, fused "
                        "SGD; 4 micro-batches of 32 x 160 x 160 a step: ~1.3 TFLOP a step, GPU-bound with "
                        "some launch-bound stretches in the late stages. Expected 35-55 ms a step",
            "bigger_micro": "unsure: half the launches and fuller late-stage kernels, on a step that is "
                            "mostly GPU-bound. Expected 1.03-1.15x",
            "one_batch": "unsure: the same, once more. Expected 1.05-1.25x",
            "compile": "unsure: Inductor fuses BatchNorm's passes with ReLU and the residual adds, but "
                       "the statistics stay a reduction of their own. Expected 1.05-1.3x",
            "graph": "written after the first sight (the step measured host-bound, 91.5 ms against one "
                     "batch's 23.1 ms): the launches gone, every kernel kept. Expected 3-4x",
        },
    },
]
