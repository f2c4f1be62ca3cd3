"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``beam_search_decode``: beam search whose candidates are read back and walked in
Python every token; ``mae_pretrain_train``: masked-autoencoder pre-training in fp32 whose
attention returns its weights; ``int8_dequant_infer``: an LM whose int8 weights are dequantized
in Python at every call), in the format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "beam_search_decode", "family": "beam search walked in Python every token",
        "script": f"{W}/w_beam_search_decode.py", "args": [], "capture_args": ["--steps", "200"],
        "step_range": "beam_step", "kind": "inference", "interleave": "all",
        "fixes": {
            "gpu_beams": fix("gpu_beams", True, "candidates selected on the GPU, beams' tokens in a GPU "
                                                "tensor: no read-back until a search ends"),
            "compile": fix("compile", None, "the LM under torch.compile", compiles=True),
        },
        "expect": {
            "baseline": "32 rows through 6 layers a token: ~90 small kernels (~0.1 ms of GPU), ~0.5 ms of "
                        "launches, a wait, 64 candidates walked in Python and three small copies. "
                        "Expected 0.8-1.3 ms a token, host-bound",
            "gpu_beams": "pays: the wait, the Python walk and the copies go; a few more kernels. Expected "
                         "1.1-1.4x",
            "compile": "unsure: fewer launches per layer, but the cache grows each token (dynamic "
                       "shapes, recompiles early). Expected 0.8-1.5x",
        },
    },
    {
        "name": "mae_pretrain_train", "family": "masked-autoencoder pre-training in fp32",
        "script": f"{W}/w_mae_pretrain_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "tf32": fix("tf32", True, "torch.set_float32_matmul_precision('high')"),
            "bf16": fix("bf16", True, "the forward and the loss under bf16 autocast"),
            "sdpa": fix("sdpa", None, "need_weights=False in the blocks' attention calls"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "ViT-S on 49 visible patches and a 4-block decoder on 196, batch 64: ~0.45 TFLOP "
                        "forward and backward in fp32 GEMMs (~10-14 ms) and ~900 launches. Expected "
                        "12-18 ms a step, GPU-bound",
            "tf32": "pays: the GEMMs 3-5x faster; the host's launches then close. Expected 1.6-2.5x",
            "bf16": "pays: faster GEMMs still, half the bytes elsewhere, but autocast's casts on the "
                    "host. Expected 1.6-2.6x",
            "sdpa": "unsure, small: the attention is a small part at 49 and 196 tokens. Expected "
                    "1.0-1.1x",
            "fused_adamw": "does not pay, or little: 26M parameters. Expected 1.0-1.05x",
        },
    },
    {
        "name": "int8_dequant_infer", "family": "weight-only int8 dequantized in Python per call",
        "script": f"{W}/w_int8_dequant_infer.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "bf16_weights": fix("bf16_weights", True, "weights dequantized once at load, kept in bf16"),
            "compile": fix("compile", True, "the model under torch.compile", compiles=True),
            "graph": fix("graph", None, "the call captured in a CUDA graph"),
        },
        "expect": {
            "baseline": "1,024 tokens through 8 blocks of 2048-wide int8 layers (0.4B parameters): ~0.9 "
                        "TFLOP of bf16 GEMMs (~1.5-2 ms), ~2.9 GB moved by the dequantization (~1 ms) and "
                        "~170 launches. Expected 2.5-3.5 ms a call, GPU-bound",
            "bf16_weights": "pays: the dequantization's passes and launches go. Expected 1.3-1.6x",
            "compile": "pays: the cast and the scaling fused into one pass (5 bytes a parameter, not 9). "
                       "Expected 1.15-1.35x",
            "graph": "unsure, small: ~170 launches behind ~3 ms of GPU work. Expected 1.0-1.1x",
        },
    },
]
