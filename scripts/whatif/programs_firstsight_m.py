"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``vocoder_weightnorm_infer``: a vocoder's generator whose weight normalisation is
recomputed at every inference call; ``encoder_grad_on_infer``: an ``nn.TransformerEncoder`` run
for inference with autograd left on; ``nerf_chunks_infer``: rays rendered through an MLP in
small chunks from a Python loop), in the format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "vocoder_weightnorm_infer", "family": "a vocoder with weight normalisation left on at inference",
        "script": f"{W}/w_vocoder_weightnorm_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "fold_weight_norm": fix("fold_weight_norm", True, "the weight-norm parametrizations removed once "
                                                              "at load (plain convolutions)"),
            "tf32": fix("tf32", False, "torch.set_float32_matmul_precision('high') (the convolutions "
                                       "already allow TF32: a control)"),
            "compile": fix("compile", None, "the generator under torch.compile", compiles=True),
        },
        "expect": {
            "baseline": "4 x 128 mel frames to 131k samples: 42 1-D convolutions of 16-256 channels "
                        "(~0.1 TFLOP, ~1-2 ms), ~120 other kernels, and 42 weight-norm recomputations "
                        "with their Python (~1.5 ms of host). Expected 2-4 ms a call, host-bound",
            "fold_weight_norm": "pays: 42 kernels and the parametrizations' Python go. Expected 1.2-1.6x",
            "tf32": "does not pay: cuDNN already runs the convolutions in TF32. Expected 1.0x",
            "compile": "unsure: the elementwise ops fuse and the weight norm with them, but the "
                       "convolutions stay. Expected 1.0-1.8x",
        },
    },
    {
        "name": "encoder_grad_on_infer", "family": "inference with autograd left on",
        "script": f"{W}/w_encoder_grad_on_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "inference_mode": fix("inference_mode", True, "torch.inference_mode(): no autograd records, "
                                                          "the encoder's fast path with nested tensors"),
            "bf16": fix("bf16", True, "bf16 autocast, autograd still on"),
            "bf16_inference": fix("bf16_inference", True, "the model in bf16 under torch.inference_mode()"),
        },
        "expect": {
            "baseline": "32 x 128 tokens through 6 layers of width 512: ~0.2 TFLOP of fp32 GEMMs "
                        "(~5-8 ms) and ~150 kernels, autograd recording each op. Expected 6-10 ms a "
                        "call, GPU-bound",
            "inference_mode": "pays: the fast path skips the padding (~40% of the positions) and fuses "
                              "each layer's small ops. Expected 1.3-1.8x",
            "bf16": "pays: bf16 GEMMs, but every op recorded still and the padding kept. Expected "
                    "1.5-2.5x",
            "bf16_inference": "pays most: bf16 GEMMs on the fast path without the padding. Expected "
                              "2-4x",
        },
    },
    {
        "name": "nerf_chunks_infer", "family": "an MLP run over points in small chunks from a Python loop",
        "script": f"{W}/w_nerf_chunks_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "render", "kind": "inference", "interleave": "all",
        "fixes": {
            "big_chunks": fix("big_chunks", True, "chunks of 65,536 points (two a call)"),
            "tf32": fix("tf32", True, "torch.set_float32_matmul_precision('high')"),
            "compile": fix("compile", None, "the MLP under torch.compile (the chunk loop stays)",
                           compiles=True),
        },
        "expect": {
            "baseline": "131k points through a 0.6M-parameter MLP: ~0.16 TFLOP of fp32 GEMMs (~5-8 ms) "
                        "in 64 chunks of ~30 launches each (~2,000 launches, ~8-12 ms of host). "
                        "Expected 8-14 ms a call, host-bound",
            "big_chunks": "pays: 32x fewer launches; the fp32 GEMMs then set the pace. Expected 1.3-2x",
            "tf32": "unsure: the GEMMs 3-5x faster, but the host's launches set the pace. Expected "
                    "1.0-1.3x",
            "compile": "unsure: fewer launches a chunk, the loop kept. Expected 1.1-2x",
        },
    },
]
