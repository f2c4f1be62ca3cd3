"""First-sight set S: a Fourier neural operator (``fno_spectral_train``: cuFFT transforms and
complex64 contractions over the retained modes), a gated-MLP encoder served through
``torch.jit.script`` and its legacy fuser (``torchscript_mlp_infer``) and a CNN trained with eager
quantization-aware training (``qat_fakequant_train``: fake-quantize after every layer, observers
on). Entries as in set A
(programs_firstsight_a.py): ``pays`` and ``expect`` written with the programs, before any run.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "fno_spectral_train", "family": "an FFT-based neural operator (cuFFT, complex64 "
                                              "contractions)",
        "script": f"{W}/w_fno_spectral_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "tf32": fix("tf32", False, "TF32 for float32 matmuls (the convolutions are TF32 already)"),
            "bf16": fix("bf16", None, "bf16 autocast (the FFTs stay float32)"),
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
        },
        "expect": {
            "baseline": "four Fourier layers over 16 x 64 x 128 x 128 fp32 activations (67 MB a "
                        "tensor): rfft2 and irfft2, a zeroed spectrum written in two corners, 576 "
                        "complex 16 x 64 x 64 contractions a corner, a 1x1 convolution, GELU; about 12 "
                        "GB of HBM traffic a step forward and backward. Expected 6-10 ms a step, "
                        "memory-bound",
            "tf32": "does not pay: the 1x1 convolutions run in TF32 already (cuDNN's default) and the "
                    "complex contractions are small. Expected 1.0-1.05x",
            "bf16": "unsure: the convolutions and GELU in half the bytes, but the spectral path casts "
                    "back to float32 every layer. Expected 0.9-1.2x",
            "compile": "pays: the GELU, the residual adds, the zeroing and the corner copies fused "
                       "around cuFFT. Expected 1.2-1.6x",
        },
    },
    {
        "name": "torchscript_mlp_infer", "family": "a model served through TorchScript (the legacy JIT "
                                                 "and its fuser)",
        "script": f"{W}/w_torchscript_mlp_infer.py", "args": [], "capture_args": ["--steps", "60"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "graph": fix("graph", True, "the scripted call captured in a CUDA graph"),
            "compile": fix("compile", None, "torch.compile of the eager module instead", compiles=True),
            "eager": fix("eager", False, "not scripted (a control)"),
        },
        "expect": {
            "baseline": "eight blocks of three fp32 GEMMs of 1,024 rows (about 18 GFLOP a call without "
                        "TF32, ~0.4 ms) and ~70 launches from TorchScript's interpreter (~1.5-2 ms of "
                        "host). Expected 1.5-2.5 ms a call, host-bound",
            "graph": "pays most: one replay, the GPU's ~0.5 ms. Expected 2.5-4x",
            "compile": "unsure: Inductor's wrapper launches with less per-op overhead than the "
                       "interpreter, the fusion about NNC's. Expected 1.0-1.8x",
            "eager": "does not pay: eager dispatch costs about what the interpreter does, one kernel "
                     "more a block. Expected 0.9-1.05x",
        },
    },
    {
        "name": "qat_fakequant_train", "family": "quantization-aware training: fake-quantize after every "
                                               "layer (eager QAT, observers on)",
        "script": f"{W}/w_qat_fakequant_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "fused_modules": fix("fused_modules", None, "conv-BN-ReLU fused for QAT first"),
            "freeze_observers": fix("freeze_observers", None, "observers disabled: no min/max a step"),
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
        },
        "expect": {
            "baseline": "about 80 GFLOP of TF32 convolutions forward (~0.8 ms forward and backward) and "
                        "seven elementwise passes a layer over 300 MB of activations forward, twice that "
                        "backward (~6-7 GB a step). Expected 4-6 ms a step, memory-bound",
            "fused_modules": "unsure: one fake-quantize a layer fewer, but QAT's conv-BN folding adds "
                             "its own rescaling passes. Expected 0.9-1.2x",
            "freeze_observers": "unsure: the fused observe-and-fake-quantize kernel skips its min/max "
                                "reduction, a third of its reads. Expected 1.0-1.15x",
            "compile": "pays: BN, ReLU and the fake-quantize arithmetic fused where Inductor lowers them. "
                       "Expected 1.1-1.8x",
        },
    },
]
