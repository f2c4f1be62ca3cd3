"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``seq2seq_transformer_train``: an nn.Transformer translation model in fp32 whose
masks are built on the host each step; ``vae_distributions_train``: a VAE written with
torch.distributions, whose argument checks read values back; ``wgan_gp_train``: a WGAN-GP with
five critic updates a step, a gradient penalty by double backward and a logged estimate), in the
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
        "name": "seq2seq_transformer_train", "family": "nn.Transformer translation training in fp32",
        "script": f"{W}/w_seq2seq_transformer_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "tf32": fix("tf32", True, "torch.set_float32_matmul_precision('high')"),
            "bf16": fix("bf16", True, "the forward and the loss under bf16 autocast"),
            "gpu_masks": fix("gpu_masks", False, "the causal mask built once on the GPU, the padding masks "
                                                 "compared there: no copy in the step"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True)"),
        },
        "expect": {
            "baseline": "44M parameters, 2 x 2,048 tokens: ~0.35 TFLOP forward and backward in full fp32 "
                        "GEMMs (~8-11 ms) and ~1,000 launches (~6 ms of host). Expected 10-14 ms a step, "
                        "GPU-bound",
            "tf32": "pays: the GEMMs 3-4x faster; the host's launches then set the step. Expected 1.5-2x",
            "bf16": "pays: the GEMMs faster still, but autocast's casts add launches to a step that "
                    "becomes host-bound. Expected 1.3-1.7x",
            "gpu_masks": "does not pay: three 16 KB pageable copies a step. Expected 0.98-1.03x",
            "fused_adam": "does not pay: a foreach Adam of ~0.5 ms becomes ~0.4 ms. Expected 1.0-1.05x",
        },
    },
    {
        "name": "vae_distributions_train", "family": "VAE written with torch.distributions (validated)",
        "script": f"{W}/w_vae_distributions_train.py", "args": [], "capture_args": ["--steps", "60"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "no_validate": fix("no_validate", True, "validate_args=False for the three distributions"),
            "no_validate_graph": fix("no_validate_graph", True, "no validation, and the whole step captured "
                                                                "in one CUDA graph"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True)"),
        },
        "expect": {
            "baseline": "~5 GFLOP of small GEMMs (~0.2 ms of GPU) behind ~120 launches, the distributions' "
                        "Python and six waits for the argument checks. Expected 1-1.5 ms a step, "
                        "host-bound",
            "no_validate": "pays: ~15 check kernels, six waits and their Python gone. Expected 1.15-1.4x",
            "no_validate_graph": "pays: one replay; the GPU's ~0.2-0.3 ms sets the step. Expected 4-7x",
            "fused_adam": "does not pay, or little: a few launches fewer. Expected 1.0-1.08x",
        },
    },
    {
        "name": "wgan_gp_train", "family": "GAN: WGAN-GP with double backward and a logged estimate",
        "script": f"{W}/w_wgan_gp_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bf16": fix("bf16", True, "both networks' forwards (the penalty's too) under bf16 autocast"),
            "channels_last": fix("channels_last", None, "both networks and the images in channels_last"),
            "no_item": fix("no_item", None, "the estimates summed on the GPU, read once at the end"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True) for both optimizers"),
        },
        "expect": {
            "baseline": "five critic updates (three critic forwards, the penalty's double backward) and a "
                        "generator update on 64 images of 64 x 64: ~1.5 TFLOP of TF32 convolutions "
                        "(~8-12 ms) and ~1,200 launches (~7 ms of host), five waits. Expected 12-16 ms a "
                        "step, GPU and host close",
            "bf16": "pays: the convolutions at the bf16 rate; autocast's casts make the host the pace. "
                    "Expected 1.2-1.5x",
            "channels_last": "unsure: cuDNN's NHWC kernels, transposed convolutions maybe slower. "
                             "Expected 0.95-1.2x",
            "no_item": "unsure: five drains of the queue a step where host and GPU are close. Expected "
                       "1.05-1.3x",
            "fused_adam": "does not pay: 6M parameters. Expected 1.0-1.03x",
        },
    },
]
