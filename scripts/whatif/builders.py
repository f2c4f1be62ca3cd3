"""The pieces several programs of the registry share: the fixes of one workload script that more
than one program runs (the CNN scripts under their --arch, HF generate, the fine-tuning
programs) and the entries built from them.

Each builder returns a fresh dict: the entries are plain dicts, and a fix shared by reference
would be shared by every program that holds it.
"""
from __future__ import annotations

from typing import Optional

W = "scripts/workloads"


def fix(name: str, pays: Optional[bool], what: str, compiles: bool = False) -> dict:
    """A fix run as the workload's ``--fix NAME``; ``compiles``: it compiles (Inductor's caches
    primed before it is timed)."""
    entry = {"args": ["--fix", name], "pays": pays, "what": what}
    if compiles:
        entry["compiles"] = True
    return entry


def cnn_inference_fixes(channels_last_pays: Optional[bool]) -> dict:
    """The fixes of w_resnet50_fp32_infer.py (any --arch): PK305's two and TF32, which only
    reaches the classifier (cuDNN already runs the convolutions as TF32)."""
    return {
        "channels_last": {"args": ["--fix", "channels_last"], "pays": channels_last_pays,
                          "what": "model and input in torch.channels_last, fp32"},
        "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                               "what": "model and input in bf16 and torch.channels_last"},
        "tf32": {"args": ["--fix", "tf32"], "pays": False,
                 "what": "torch.set_float32_matmul_precision('high'): the final Linear only"},
    }


def cnn_inference(name: str, arch: str, expect: dict, channels_last_pays: Optional[bool],
                   steps: int = 10, fixes: Optional[dict] = None, more: tuple = (),
                   timed_steps: Optional[int] = None) -> dict:
    """A torchvision classifier's fp32 inference through w_resnet50_fp32_infer.py --arch ARCH
    (``more``: further arguments, such as --batch), with PK305's fixes and TF32 (``fixes``
    replaces or adds to them)."""
    timed = ["--steps", str(timed_steps)] if timed_steps else []
    return {"name": name, "script": f"{W}/w_resnet50_fp32_infer.py", "args": ["--arch", arch, *more, *timed],
            "capture_args": ["--arch", arch, *more, "--steps", str(steps)], "step_range": "infer",
            "kind": "inference", "fixes": {**cnn_inference_fixes(channels_last_pays), **(fixes or {})},
            "interleave": "all", "expect": expect}


def small_batch_inference(name: str, arch: str, expect: dict) -> dict:
    """A torchvision classifier's fp32 inference at batch 4, where the CPU sets the pace: captured
    for 60 batches, timed for 200; PK305's fixes are not expected to pay, nor bf16, and the
    forward captured in a CUDA graph is."""
    return cnn_inference(name, arch, expect, channels_last_pays=False, steps=60, more=("--batch", "4"),
                          timed_steps=200, fixes={
                              "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": False,
                                                     "what": "model and input in bf16 and torch.channels_last"},
                              "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": True,
                                             "what": "the forward captured in a CUDA graph on a static input, "
                                                     "replayed each batch"}})


def generate_fixes() -> dict:
    """The fixes of w_generate_llama_nvtx.py (any --arch): HF's static KV cache, which compiles
    the decode forward, alone and with CUDA graphs."""
    return {
        "static": {"args": ["--fix", "static"], "pays": True, "compiles": True,
                   "what": "static KV cache: transformers compiles the decode forward (default mode)"},
        "graphs": {"args": ["--fix", "graphs"], "pays": True, "compiles": True,
                   "what": "static cache + compile mode='reduce-overhead' (CUDA graphs), fullgraph"},
    }


# TF32 for the fp32 GEMMs, as the transformer programs spell it (a fresh copy each: entries are dicts)
def tf32_fix() -> dict:
    return {"args": ["--fix", "tf32"], "pays": True, "what": "torch.set_float32_matmul_precision('high')"}


def finetune_fixes(no_item_pays: Optional[bool]) -> dict:
    """The fixes of the HF fine-tuning programs (w_distilbert_finetune.py, w_t5_finetune.py):
    TF32, bf16 autocast, fused AdamW and the loss kept on the GPU (whether that pays)."""
    return {
        "tf32": tf32_fix(),
        "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                          "what": "forward and loss under torch.autocast(bfloat16)"},
        "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": None,
                        "what": "AdamW(fused=True) instead of the default foreach"},
        "no_item": {"args": ["--fix", "no_item"], "pays": no_item_pays,
                    "what": "the loss summed on the GPU, read once after the loop"},
    }


def cnn_training(name: str, arch: str, baseline: str, channels_last: str, bf16: str,
                  pays: tuple[Optional[bool], Optional[bool]] = (True, True),
                  more: Optional[dict] = None) -> dict:
    """A torchvision CNN trained in fp32 NCHW by w_resnet18_fp32_train.py --arch ARCH, with
    PK305's two fixes (what each was expected or measured to do in the three texts, and whether
    each pays); ``more``: further fixes, each with its "expect" text."""
    more = more or {}
    return {
        "name": name, "script": f"{W}/w_resnet18_fp32_train.py", "args": ["--arch", arch],
        "capture_args": ["--arch", arch, "--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "channels_last": {"args": ["--fix", "channels_last"], "pays": pays[0],
                              "what": "model and input in torch.channels_last, fp32"},
            "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": pays[1],
                                   "what": "channels_last, forward and loss under torch.autocast(bfloat16)"},
            **{k: {kk: vv for kk, vv in v.items() if kk != "expect"} for k, v in more.items()},
        },
        "expect": {"baseline": baseline, "channels_last": channels_last, "bf16_channels_last": bf16,
                   **{k: v["expect"] for k, v in more.items()}},
    }
