#!/usr/bin/env python3
"""The what-if corpus: real PyTorch programs, each with the fixes an expert would try, and the
harness that times every (program, fix) pair without a profiler.

    python3 scripts/whatif_accuracy.py list [--variants | --capture]
    python3 scripts/whatif_accuracy.py measure OUTDIR [--programs a,b] [--fixes f,g] [--reps 3] [--budget SECONDS]
    python3 scripts/whatif_accuracy.py interleave OUTDIR [--programs a,b] [--reps 3] [--rounds 15] [--budget SECONDS]
    python3 scripts/whatif_accuracy.py table OUTDIR/measured.json
    python3 scripts/whatif_accuracy.py merge OUTDIR/measured.json --folder LABEL
    python3 scripts/whatif_accuracy.py page [--check]

``PROGRAMS`` is the registry: per program its script (relative to the repository root), the
baseline arguments, the NVTX range that marks one iteration (``step_range``), the fixes (extra
arguments each, and whether the fix is expected to pay: ``pays`` True / False / None for not
sure), the kind of program, and notes on what to expect (for people reading results).

``measure`` runs on a GPU machine, from the repository root. For each program, ``reps`` times,
it runs the baseline and then every fix, each as

    python3 -m profkit.capture.bootstrap --calibrate OUTDIR/calib/NAME__VARIANT__REP.json -- SCRIPT ARGS...

(no profiler: the bootstrap records the host and GPU start of every top-level NVTX range on the
main thread). An iteration's time is the distance between consecutive starts of ``step_range``
(``iteration_times``), on the GPU timeline when every instance has a GPU timestamp, else on the
host clock; the first 20 % of the periods (at least 3) are warm-up and the median of the rest is
the run's iteration time (``steady_median``). The runs alternate: baseline, then each fix, rep
after rep, so that slow drifts of the machine hit every variant alike.

``OUTDIR/measured.json`` is rewritten after every run, and a later ``measure`` into the same
OUTDIR resumes it: runs already measured (or failed) are kept and not repeated (``--fresh``
starts over). ``--budget`` bounds one call: once it is spent the remaining runs are skipped and
listed, and a run never gets more time than is left (a run cut short by the budget counts as
skipped, not failed). So the corpus can be measured in several calls of a few minutes each,
e.g. ``--programs`` subsets or the same command repeated until nothing is skipped. One rep of
all 53 variants took about 15 minutes on an H200 (each run imports torch and builds its model:
5-25 s, 15-45 s for variants that compile).

Variants that ``torch.compile`` (``compiles`` in the registry) compile in their first run on a
machine and find Inductor's on-disk caches warm afterwards; host-bound compiled programs ran
measurably slower in the run that compiled (bert_b1_infer: 0.75x against 1.15-1.5x). The median
over 3 reps then follows the warm runs; ``--prime`` runs each compiling variant once, untimed,
before the timed runs, so that all of them find the caches warm.

``--fixes`` times only the fixes named (and the baseline beside them), for a fix added to the
registry after the others were timed. ``merge`` adds each rep of a ``measure`` output to the
committed data (``analyses/data/whatif/measured_h200.json``) as a run folder ``LABEL_rN``.

``interleave`` times the programs whose entry has ``interleave`` another way: per program and
rep, one process builds the baseline and the fixes side by side (the script's ``--interleave``,
``scripts/workloads/_corpus.py``) and times them in blocks of 0.2 s (10 iterations or more) that
take turns, the order reversed each round. Separate runs of a host-bound program seconds apart ran
at CPU speeds up to 1.9x apart on the timing machines (TF32 on EfficientNet-B0 at batch 4, a fix
that changes one small GEMM: 0.58-1.96x over six alternated reps), so its small fixes could not be
resolved to 15%; in one process the variants share the CPU's state, and a fix's gain is paired
round by round (``paired_gain``). ``merge`` names those folders ``ab-LABEL_rN``, and the page reads
a pair from them alone where it has any, showing the separate runs beside them. A process also
times, after each round, the host's issue time of an iteration of each variant (after one
untimed iteration, not waited for: ``issue_ns``, see _corpus.interleave), the CPU's speed in that
process where the GPU sets the baseline's pace; the page prices each folder at its own baseline and that issue time
(``Profile.findings_at``).

``table`` prints, per program and variant, the median iteration time over the reps, the
speedup over the baseline (baseline median / variant median), the spread (slowest / fastest
rep) and whether the fix was expected to pay.

Imports nothing beyond the standard library (no torch) and profkit's own standard-library module
profkit.run.iterations, so it runs anywhere.
"""
from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# One definition of an iteration's time, shared with `profkit capture --try` (standard library only)
from profkit.run.iterations import iteration_times, steady_median  # noqa: E402

W = "scripts/workloads"
DEFAULT_TIMEOUT_S = 120   # a run (imports, model build, warm-up, steps) took 5-25 s on an H200
COMPILE_TIMEOUT_S = 300   # variants that torch.compile: 15-45 s there with cold Inductor caches

# kind: training | inference | decode | data.  pays: True (expected > 1.05x), False (expected
# < 1.05x), None (not sure).  compiles: the variant runs torch.compile (longer time limit; see
# --prime).  "h200" in the notes: one unprofiled run of each variant on an H200 (torch 2.11,
# transformers 5.17), iteration medians timed as ``measure`` does; a first look, not a result.

def _cnn_inference_fixes(channels_last_pays: Optional[bool]) -> dict:
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


def _cnn_inference(name: str, arch: str, expect: dict, channels_last_pays: Optional[bool],
                   steps: int = 10, fixes: Optional[dict] = None, more: tuple = (),
                   timed_steps: Optional[int] = None) -> dict:
    """A torchvision classifier's fp32 inference through w_resnet50_fp32_infer.py --arch ARCH
    (``more``: further arguments, such as --batch), with PK305's fixes and TF32 (``fixes``
    replaces or adds to them)."""
    timed = ["--steps", str(timed_steps)] if timed_steps else []
    return {"name": name, "script": f"{W}/w_resnet50_fp32_infer.py", "args": ["--arch", arch, *more, *timed],
            "capture_args": ["--arch", arch, *more, "--steps", str(steps)], "step_range": "infer",
            "kind": "inference", "fixes": {**_cnn_inference_fixes(channels_last_pays), **(fixes or {})},
            "interleave": "all", "expect": expect}


def _small_batch_inference(name: str, arch: str, expect: dict) -> dict:
    """A torchvision classifier's fp32 inference at batch 4, where the CPU sets the pace: captured
    for 60 batches, timed for 200; PK305's fixes are not expected to pay, nor bf16, and the
    forward captured in a CUDA graph is."""
    return _cnn_inference(name, arch, expect, channels_last_pays=False, steps=60, more=("--batch", "4"),
                          timed_steps=200, fixes={
                              "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": False,
                                                     "what": "model and input in bf16 and torch.channels_last"},
                              "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": True,
                                             "what": "the forward captured in a CUDA graph on a static input, "
                                                     "replayed each batch"}})


def _generate_fixes() -> dict:
    """The fixes of w_generate_llama_nvtx.py (any --arch): HF's static KV cache, which compiles
    the decode forward, alone and with CUDA graphs."""
    return {
        "static": {"args": ["--fix", "static"], "pays": True, "compiles": True,
                   "what": "static KV cache: transformers compiles the decode forward (default mode)"},
        "graphs": {"args": ["--fix", "graphs"], "pays": True, "compiles": True,
                   "what": "static cache + compile mode='reduce-overhead' (CUDA graphs), fullgraph"},
    }


# TF32 for the fp32 GEMMs, as the transformer programs spell it (a fresh copy each: entries are dicts)
def _tf32() -> dict:
    return {"args": ["--fix", "tf32"], "pays": True, "what": "torch.set_float32_matmul_precision('high')"}


def _finetune_fixes(no_item_pays: Optional[bool]) -> dict:
    """The fixes of the HF fine-tuning programs (w_distilbert_finetune.py, w_t5_finetune.py):
    TF32, bf16 autocast, fused AdamW and the loss kept on the GPU (whether that pays)."""
    return {
        "tf32": _tf32(),
        "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                          "what": "forward and loss under torch.autocast(bfloat16)"},
        "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": None,
                        "what": "AdamW(fused=True) instead of the default foreach"},
        "no_item": {"args": ["--fix", "no_item"], "pays": no_item_pays,
                    "what": "the loss summed on the GPU, read once after the loop"},
    }


def _cnn_training(name: str, arch: str, baseline: str, channels_last: str, bf16: str,
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


PROGRAMS: list[dict] = [
    {
        "name": "train_llama", "script": f"{W}/train_llama.py", "args": ["--steps", "40"],
        "interleave": "all",
        "capture_args": ["--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "fused": {"args": ["--fused"], "pays": True,
                      "what": "AdamW(fused=True) instead of foreach"},
            "compile": {"args": ["--compile"], "pays": True, "compiles": True,
                        "what": "model under torch.compile(mode='reduce-overhead'), optimizer step compiled"},
        },
        "expect": {
            "baseline": "2-layer HF Llama, bf16 autocast, batch 8x512, foreach AdamW: host-bound. One middle step "
                        "is wrapped in ncu_iter, so one period spans two steps (the median ignores it). h200: 10.9 ms",
            "fused": "pays a little: fewer optimizer launches in a host-bound step. h200: 8.5 ms, 1.28x",
            "compile": "pays: CUDA graphs remove the launch overhead; ~35 s to compile. h200: 4.4 ms, 2.5x",
        },
    },
    {
        "name": "gpt2_empty_cache", "script": f"{W}/w_gpt2_empty_cache.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "no_empty_cache": {"args": ["--fix", "no_empty_cache"], "pays": True,
                               "what": "drop torch.cuda.empty_cache() at the end of each step"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "6-layer GPT-2, bf16 autocast, 8x512 tokens; empty_cache syncs and forces cudaMalloc "
                        "every step. h200: 37.4 ms",
            "no_empty_cache": "pays: no device sync, no cudaMalloc churn. h200: 22.6 ms, 1.65x",
            "fused_adamw": "pays a little: 82M params, fewer optimizer passes and launches. h200: 33.2 ms, 1.13x",
        },
    },
    {
        "name": "vit_grad_norms", "script": f"{W}/w_vit_grad_norms.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "no_item": {"args": ["--fix", "no_item"], "pays": True,
                        "what": "per-parameter grad norms via torch._foreach_norm + stack, kept on the GPU"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "timm ViT-B/16, batch 64, bf16 autocast; ~150 .item() syncs a step after backward. "
                        "h200: 37.1 ms",
            "no_item": "pays: ~150 sync round trips (GPU idle) removed. h200: 27.8 ms, 1.33x",
            "fused_adamw": "pays a little: 86M params. h200: 31.6 ms, 1.17x",
        },
    },
    {
        "name": "early_exit_sync", "script": f"{W}/w_early_exit_sync.py", "args": ["--steps", "100"],
        "interleave": "all",
        "capture_args": ["--steps", "60"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "no_sync": {"args": ["--fix", "no_sync"], "pays": True,
                        "what": "exit decision as torch.where on the GPU instead of .item() mid-forward"},
            "graphs": {"args": ["--fix", "graphs"], "pays": True,
                       "what": ".item() kept; the encoder and the refiner each captured as a CUDA graph"},
        },
        "expect": {
            "baseline": "bf16 MLP encoder (~3 ms GPU), .item() exit check, then ~280 small refiner launches "
                        "with the GPU idle. h200: 9.1 ms",
            "no_sync": "pays: refiner launches overlap the encoder; same GPU work. h200: 5.6 ms, 1.63x",
            "graphs": "pays: the refiner's ~280 launches become one after the sync",
        },
    },
    {
        "name": "resnet18_pageable", "script": f"{W}/w_resnet18_pageable.py", "args": ["--steps", "100"],
        "interleave": "all",
        "capture_args": ["--steps", "60"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "pinned": {"args": ["--fix", "pinned"], "pays": True,
                       "what": "input pool in pinned memory, copied with non_blocking=True"},
            "channels_last_bf16": {"args": ["--fix", "channels_last_bf16"], "pays": False,
                                   "what": "model and input in bf16 channels_last (copy unchanged)"},
            "pinned+channels_last_bf16": {"args": ["--fix", "pinned,channels_last_bf16"], "pays": True,
                                          "what": "both"},
        },
        "expect": {
            "baseline": "ResNet-18 fp32 batch 32: 19 MB pageable copy (synchronous, no overlap) + forward. "
                        "h200: 4.9 ms",
            "pinned": "pays: async DMA at full speed, CPU runs ahead. h200: 2.7 ms, 1.79x",
            "channels_last_bf16": "does not pay alone: the synchronous pageable copy dominates, and the bf16 "
                                  "conversion adds a pass. h200: 5.5 ms, 0.89x",
            "pinned+channels_last_bf16": "pays most. h200: 1.8 ms, 2.69x",
        },
    },
    {
        "name": "lstm_cell_loop", "script": f"{W}/w_lstm_cell_loop.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "25"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": True,
                           "what": "the whole 256-step cell loop captured in one CUDA graph and replayed"},
            "cudnn_lstm": {"args": ["--fix", "cudnn_lstm"], "pays": True,
                           "what": "nn.LSTM(num_layers=2) (cuDNN) with the same weights instead of the loop"},
        },
        "expect": {
            "baseline": "2-layer LSTMCell loop, 256 timesteps, batch 16: ~1,500 tiny launches a batch, "
                        "launch-bound. h200: 27.8 ms",
            "cuda_graph": "pays: launch overhead gone, the GPU still runs ~1,500 tiny kernels. h200: 10.1 ms, 2.76x",
            "cudnn_lstm": "pays: a handful of cuDNN kernels. h200: 8.9 ms, 3.13x; interleaved 7.6-9.2 ms, "
                          "3.50-3.58x: cuDNN's kernels are faster than the cells' (10.1 ms), which PK106 "
                          "does not price (a floor)",
        },
    },
    {
        "name": "bert_fp32_infer", "script": f"{W}/w_bert_fp32_infer.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "20"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "tf32": {"args": ["--fix", "tf32"], "pays": True,
                     "what": "torch.set_float32_matmul_precision('high') (TF32 tensor cores)"},
            "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                              "what": "forward under torch.autocast(bfloat16)"},
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": False,
                           "what": "forward captured in a CUDA graph and replayed"},
        },
        "expect": {
            "baseline": "BERT-base fp32, 32x256 tokens: ~1.5 TFLOP at fp32 FMA speed, GPU-bound. h200: 35.5 ms",
            "tf32": "pays: GEMMs on tensor cores. h200: 8.8 ms, 4.0x",
            "bf16_autocast": "pays: bf16 GEMMs and attention, host-bound at the CPU's pace. h200: 7.1-7.3 ms, "
                             "5.0x, on the first machines; 12.7-14.4 ms, 2.5-2.8x, on a slower one",
            "cuda_graph": "no gain, a loss: GPU-bound, and under capture HF builds an all-true attention mask, so "
                          "SDPA takes its slower masked fp32 path. h200: 40.2-40.3 ms (two runs), 0.88x",
        },
    },
    {
        "name": "bert_b1_infer", "script": f"{W}/w_bert_b1_infer.py", "args": ["--steps", "200"],
        "interleave": "all",
        "capture_args": ["--steps", "120"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": True,
                           "what": "forward captured in a CUDA graph on a static input and replayed"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode"},
        },
        "expect": {
            "baseline": "BERT-base bf16, batch 1 x 128: ~250 launches, host-bound. h200: 4.7 ms",
            "cuda_graph": "pays: one launch a request. h200: 1.15 ms, 4.05x. Not only the launches change: "
                          "under capture HF cannot check that the mask is all ones, so the graph runs the "
                          "masked attention path (fp32 score GEMMs, bool reductions, copies): 1.21 ms of GPU "
                          "work a request against 0.46 ms eager (nsys, bert_b1_infer__cuda_graph), which "
                          "the price of the same work graphed (0.6 ms) cannot know",
            "compile": "unsure: fused kernels, still launched one by one from Python, ~15-20 s to compile. "
                       "h200: 6.0-6.3 ms (0.75x) in the run that compiled with cold Inductor caches, 3.1-4.1 ms "
                       "(1.15-1.5x) in runs that found them warm: use --prime or read the median of 3 reps",
        },
    },
    {
        "name": "generate_llama", "script": f"{W}/w_generate_llama_nvtx.py",
        "args": ["--steps", "64", "--runs", "3"],
        "capture_args": ["--steps", "24", "--runs", "2"],
        "step_range": "decode_step", "kind": "decode",
        "fixes": _generate_fixes(),
        "expect": {
            "baseline": "HF generate, 4-layer Llama bf16, batch 1, eager: ~150 launches a token, host-bound; one "
                        "warm-up generate() outside the ranges, then 3 measured (the 2 run boundaries are outlier "
                        "periods). h200: 4.05 ms a token",
            "static": "pays: fused Inductor kernels, fewer launches; compiled in the warm-up call. "
                      "h200: 1.47 ms, 2.8x",
            "graphs": "pays, but no more than static: what is left is generate()'s own Python per token. "
                      "h200: 1.43-1.46 ms, 2.8x",
        },
    },
    {
        "name": "dataloader_cnn", "script": f"{W}/dataloader_cnn.py",
        # More steps than the workers' prefetch buffer (8 x 4 batches) holds past the warm-up:
        # timed inside it, the step runs at the main process's pace, not the workers' (steady
        # state).
        "args": ["--steps", "160"],
        "capture_args": ["--steps", "16"],
        "step_range": "train_step", "kind": "data",
        "fixes": {
            "workers_pin": {"args": ["--workers", "8", "--pin"], "pays": True,
                            "what": "DataLoader(num_workers=8, pin_memory=True), non_blocking copies"},
        },
        "expect": {
            "baseline": "ResNet-18 training fed by per-sample numpy work in the main process (num_workers=0). "
                        "h200: 173 ms",
            "workers_pin": "pays: samples prepared in parallel ahead of the step. h200: 12.1-13.6 ms, "
                           "13.5-15.9x in steady state (8.9 ms, 19x within the prefetch buffer)",
        },
    },
    {
        "name": "numpy_aug_train", "script": f"{W}/w_numpy_aug_train.py",
        "interleave": ["gpu_aug"],
        "args": ["--steps", "120"],  # past the workers' prefetch buffer, as dataloader_cnn
        "capture_args": ["--steps", "16"],
        "step_range": "train_step", "kind": "data",
        "fixes": {
            "workers": {"args": ["--fix", "workers"], "pays": True,
                        "what": "the augmentation in a Dataset read by DataLoader(8 workers, pin_memory)"},
            "gpu_aug": {"args": ["--fix", "gpu_aug"], "pays": True,
                        "what": "uint8 batch copied in; crop, flip, normalise on the GPU"},
        },
        "expect": {
            "baseline": "ResNet-18 training at 128 px, batch 128; numpy augmentation in the loop, outside any "
                        "range. h200: 91 ms",
            "workers": "pays: CPU work spread over 8 processes, ahead of the step. h200: 17.3-17.6 ms, "
                       "3.7x past the prefetch buffer on 2026-12-02 (10.3-12.6 ms within it, 2026-12-01)",
            "gpu_aug": "pays: only a gather and an 8 MB uint8 copy left on the CPU. h200: 11.5 ms, 8.0x",
        },
    },
    {
        "name": "mlp_train_big", "script": f"{W}/w_mlp_train_big.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": False,
                           "what": "whole step (fwd, bwd, capturable AdamW) captured in a CUDA graph"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": False,
                            "what": "AdamW(fused=True) instead of the default foreach"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode"},
        },
        "expect": {
            "baseline": "2-block MLP, 65,536 x 1024 rows, bf16 autocast: ~7 TFLOP a step, ~60 launches, "
                        "GPU-bound. h200: 15.5 ms",
            "cuda_graph": "no gain: nothing to hide, the CPU is already far ahead. h200: 15.9 ms, 0.98x",
            "fused_adamw": "small: 17M params, a fraction of a ms of the step. h200: 15.2 ms, 1.02x",
            "compile": "the LayerNorm/GELU/residual passes over 65,536 x 4,096 activations fused; the GEMMs "
                       "stay cuBLAS's",
        },
    },
    {
        "name": "compiled_gpt_train", "script": f"{W}/w_compiled_gpt_train.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training", "compiles": True,
        "fixes": {
            "reduce_overhead": {"args": ["--fix", "reduce_overhead"], "pays": False,
                                "what": "torch.compile mode='reduce-overhead' (CUDA graphs) instead of default"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "4-layer GPT (d=1024), 16x512 tokens, already torch.compile'd (default): GPU-bound; "
                        "~15 s to compile. h200: 8.2 ms",
            "reduce_overhead": "little: launch overhead already hidden behind GPU work. h200: 8.0 ms, 1.02x",
            "fused_adamw": "pays a little: 58M params, ~1 ms of foreach traffic. h200: 7.45 ms, 1.10x",
        },
    },
    {
        "name": "graphed_encoder_infer", "script": f"{W}/w_graphed_encoder_infer.py", "args": ["--steps", "100"],
        "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "pinned": {"args": ["--fix", "pinned"], "pays": False,
                       "what": "token ids in pinned memory, copied with non_blocking=True"},
            "tf32": {"args": ["--fix", "tf32"], "pays": False,
                     "what": "torch.set_float32_matmul_precision('high') on an all-bf16 model"},
        },
        "expect": {
            "baseline": "6-layer bf16 SDPA encoder, 64x128 tokens, forward as one CUDA graph; 64 KB pageable "
                        "copy a batch. h200: 2.76 ms",
            "pinned": "no gain: only the CPU's few tens of us a batch stop showing as GPU idle. "
                      "h200: 2.75 ms, 1.01x",
            "tf32": "none: there is no fp32 matmul. h200: 2.74 ms, 1.01x",
        },
    },
    {
        "name": "resnet50_train", "script": f"{W}/w_resnet50_train.py", "args": [],
        "interleave": ["fused_sgd", "compile", "compile_graphs"],
        "capture_args": ["--steps", "16"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "fused_sgd": {"args": ["--fix", "fused_sgd"], "pays": False,
                          "what": "SGD(fused=True) instead of the default foreach"},
            "cudnn_benchmark": {"args": ["--fix", "cudnn_benchmark"], "pays": False,
                                "what": "torch.backends.cudnn.benchmark = True"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode"},
            "compile_graphs": {"args": ["--fix", "compile_graphs"], "pays": None, "compiles": True,
                               "what": "torch.compile(model, mode='reduce-overhead')"},
        },
        "expect": {
            "baseline": "ResNet-50, bf16 autocast, channels_last, batch 128: GPU-bound. h200: 29.6-29.7 ms",
            "fused_sgd": "no gain: 25.6M params, the update is a fraction of a ms. h200: 29.4 ms, 1.01x",
            "cudnn_benchmark": "no gain: cuDNN's heuristics already pick well for bf16 NHWC on Hopper; ~10 s "
                               "of benchmarking in the first step. h200: 29.8 ms, 1.00x",
        },
    },
    {
        "name": "handwritten_block_train", "script": f"{W}/w_handwritten_block_train.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "compile": {"args": ["--fix", "compile"], "pays": True, "compiles": True,
                        "what": "torch.compile(model), default mode"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "3-layer d=2048 decoder, hand-written RMSNorm/SwiGLU/dropout/residual, 4x1024 tokens, "
                        "bf16 autocast: GPU-bound, much of it memory-bound elementwise passes. h200: 16.7 ms",
            "compile": "pays: norms, gate, dropout and residuals fused; ~15 s to compile. "
                       "h200: 12.2-12.4 ms (4 runs), 1.37x",
            "fused_adamw": "pays: 188M params, several ms of foreach passes a step. h200: 14.1 ms, 1.19x",
        },
    },
    {
        "name": "gpt2_fp32_train", "script": f"{W}/w_gpt2_fp32_train.py", "args": [],
        "capture_args": ["--steps", "16"],
        # the GEMM shapes (the LM head's 50,257 columns) from a --aten capture of the same program
        "shapes_from": "traces/real/train_gpt2_fp32_rec.sqlite.xz",
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "tf32": {"args": ["--fix", "tf32"], "pays": True,
                     "what": "torch.set_float32_matmul_precision('high')"},
            "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                              "what": "forward under torch.autocast(bfloat16)"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": None,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "GPT-2 124M, fp32 without TF32, batch 8x512: fp32 GEMMs on the CUDA cores, GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays more: bf16 GEMMs and half the activation bytes",
            "fused_adamw": "a little: 124M params, ~10 foreach passes become one",
        },
    },
    {
        # Added after PK302's bf16 pricing (autocast's casts, attention) was last changed: a model
        # it was not built on, captured and timed in one allocation.
        "name": "vit_fp32_infer", "script": f"{W}/w_vit_fp32_infer.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "tf32": {"args": ["--fix", "tf32"], "pays": True,
                     "what": "torch.set_float32_matmul_precision('high')"},
            "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                              "what": "forward under torch.autocast(bfloat16)"},
        },
        "expect": {
            "baseline": "torchvision ViT-B/16 fp32, batch 64 at 224 px: fp32 GEMMs on the CUDA cores, GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs and attention, with autocast's casts on the CPU",
        },
    },
    {
        "name": "resnet50_fp32_infer", "script": f"{W}/w_resnet50_fp32_infer.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "infer", "kind": "inference",
        "fixes": _cnn_inference_fixes(channels_last_pays=None),
        "expect": {
            "baseline": "torchvision ResNet-50 fp32 NCHW, batch 128: TF32 convolutions with cuDNN's layout "
                        "transposes, GPU-bound",
            "channels_last": "the transposes go",
            "bf16_channels_last": "pays: bf16 convolutions, half the bytes between them",
            "tf32": "no gain: the convolutions already run as TF32",
        },
    },
    _cnn_inference("efficientnet_b0_fp32_infer", "efficientnet_b0", {
        "baseline": "torchvision EfficientNet-B0 fp32 NCHW inference, batch 128: PyTorch's own depthwise "
                    "kernels; timed after PK305's depthwise estimate, as a test of it in inference",
        "channels_last": "pays: the depthwise convolutions go to cuDNN. h200: 9.23 ms from 12.50, 1.35x "
                         "(priced 1.31x)",
        "bf16_channels_last": "pays, by how much varies: 11.50, 6.68, 6.54 and 6.56 ms in four runs on two "
                              "machines, 1.09-1.90x (priced 2.31x until its bf16 capture showed the depthwise "
                              "and broadcast kernels no faster in bf16: no test of that)",
        "tf32": "no gain: the convolutions already run as TF32. h200: 1.00x",
    }, channels_last_pays=True, steps=20),
    _cnn_inference("mobilenet_v3_fp32_infer", "mobilenet_v3_large", {
        "baseline": "torchvision MobileNetV3-Large fp32 NCHW inference, batch 128: PyTorch's depthwise "
                    "kernels, hardswish, squeeze-and-excitation; added after PK305's bf16 exceptions "
                    "(broadcasts, NHWC depthwise) as a test of them",
        "channels_last": "pays a little: the depthwise convolutions go to cuDNN. h200: 5.65-8.73 ms from "
                         "7.50-7.89, 1.12x (priced 1.14x)",
        "bf16_channels_last": "about nothing: 7.06-7.96 ms, 1.03x (priced 1.16x)",
        "tf32": "no gain: the convolutions already run as TF32. h200: 1.04x",
    }, channels_last_pays=True),
    _cnn_inference("convnext_tiny_fp32_infer", "convnext_tiny", {
        "baseline": "torchvision ConvNeXt-Tiny fp32 NCHW inference, batch 128: cuDNN's 7x7 depthwise "
                    "convolutions, LayerNorm, fp32 GELU MLPs on the CUDA cores; added after PK305's "
                    "bf16 exceptions as a test of them",
        "channels_last": "little: cuDNN runs the depthwise convolutions in NHWC already. h200: 1.01x",
        "bf16_channels_last": "pays most: the MLPs' fp32 GEMMs on the tensor cores. h200: 11.97 ms from "
                              "40.83, 3.41x (first priced 1.00x: PK305 did not fire; no test of the fix)",
        "tf32": "pays: the MLPs' GEMMs are fp32 on the CUDA cores. h200: 19.64 ms, 2.08x (priced 2.15x)",
    }, channels_last_pays=None, fixes={"tf32": {"args": ["--fix", "tf32"], "pays": True,
                                  "what": "torch.set_float32_matmul_precision('high'): the MLPs' Linear layers"}}),
    _cnn_inference("regnet_y_800mf_fp32_infer", "regnet_y_800mf", {
        "baseline": "torchvision RegNetY-800MF fp32 NCHW inference, batch 128: grouped convolutions, "
                    "squeeze-and-excitation; added after all of PK305's changes of 2026-12-02, as a test",
        "channels_last": "pays: the layout transposes go. h200: 7.55 ms from 9.92, 1.31x (priced 1.14x)",
        "bf16_channels_last": "pays, by how much varies: 9.28 and 6.79 ms in two runs, 1.27x (priced 1.24x)",
        "tf32": "no gain: the convolutions already run as TF32. h200: 1.00x",
    }, channels_last_pays=None),
    _small_batch_inference("resnet50_b4_infer", "resnet50", {
        "baseline": "torchvision ResNet-50 fp32 NCHW inference at batch 4: about 170 launches of a few "
                    "microseconds of GPU work each, the CPU's launch path the pace; added after the model's "
                    "last change, as a test",
        "channels_last": "should not pay: the GPU waits for the CPU either way",
        "bf16_channels_last": "should not pay, for the same reason",
        "tf32": "no gain",
        "cuda_graph": "pays: one launch a batch",
    }),
    _small_batch_inference("efficientnet_b0_b4_infer", "efficientnet_b0", {
        "baseline": "torchvision EfficientNet-B0 fp32 NCHW inference at batch 4: depthwise convolutions, "
                    "squeeze-and-excitation, SiLU, about 250 launches of microseconds each, host-bound; added "
                    "after PK103's whole-step graph edit, as a test of it",
        "channels_last": "should not pay: the GPU waits for the CPU either way",
        "bf16_channels_last": "should not pay, for the same reason",
        "tf32": "no gain",
        "cuda_graph": "pays: one launch a batch",
    }),
    _small_batch_inference("mobilenet_v3_b4_infer", "mobilenet_v3_large", {
        "baseline": "torchvision MobileNetV3-Large fp32 NCHW inference at batch 4: depthwise convolutions, "
                    "hardswish, squeeze-and-excitation, host-bound; added after PK103's whole-step graph "
                    "edit, as a second test of it (only the graph timed: the small fixes of a host-bound "
                    "program vary more from run to run than the target band)",
        "cuda_graph": "pays: one launch a batch",
    }),
    {
        "name": "resnet18_fp32_train", "script": f"{W}/w_resnet18_fp32_train.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "channels_last": {"args": ["--fix", "channels_last"], "pays": None,
                              "what": "model and input in torch.channels_last, fp32"},
            "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                                   "what": "channels_last, forward and loss under torch.autocast(bfloat16)"},
            "fused_sgd": {"args": ["--fix", "fused_sgd"], "pays": False,
                          "what": "SGD(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "torchvision ResNet-18 training, fp32 NCHW, batch 128: TF32 convolutions with cuDNN's "
                        "layout transposes, GPU-bound",
            "channels_last": "the transposes go",
            "bf16_channels_last": "pays: bf16 convolutions, half the bytes between them",
            "fused_sgd": "small: 11.7M parameters",
        },
    },
    {
        "name": "resnet50_fp32_train", "script": f"{W}/w_resnet18_fp32_train.py", "args": ["--arch", "resnet50"],
        "capture_args": ["--arch", "resnet50", "--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "channels_last": {"args": ["--fix", "channels_last"], "pays": None,
                              "what": "model and input in torch.channels_last, fp32"},
            "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                                   "what": "channels_last, forward and loss under torch.autocast(bfloat16)"},
        },
        "expect": {
            "baseline": "torchvision ResNet-50 training, fp32 NCHW, batch 128: a second CNN for PK305's "
                        "BatchNorm estimate, timed after it was made",
            "channels_last": "the transposes go, cuDNN's NCHW BatchNorm of training is replaced",
            "bf16_channels_last": "pays: bf16 convolutions, half the bytes between them",
        },
    },
    # CNNs the model was not built on, each captured and timed in one allocation.
    _cnn_training("densenet121_fp32_train", "densenet121",
                  "torchvision DenseNet-121, batch 128: BatchNorm and concatenations between thin convolutions",
                  "pays: transposes and NCHW BatchNorm go. h200: 64.5 ms from 85.2, 1.32x (first priced 1.30x)",
                  "pays, no more than channels_last: 65.8-72.9 ms, 1.17-1.40x (first priced 1.45x)"),
    _cnn_training("efficientnet_b0_fp32_train", "efficientnet_b0",
                  "torchvision EfficientNet-B0, batch 128: depthwise convolutions, SiLU, squeeze-and-excitation",
                  "pays most: PyTorch's NCHW depthwise kernels give way to cuDNN's. h200: 34.0 ms from 62.4, "
                  "1.84x (first priced 1.00x: no rule fired)",
                  "pays, less than channels_last alone: 35.2-36.5 ms, 1.71x (first priced 1.00x)"),
    _cnn_training("resnext50_fp32_train", "resnext50_32x4d",
                  "torchvision ResNeXt-50 32x4d, batch 128: grouped convolutions on eight cuDNN side streams",
                  "pays: h200: 59.2 ms from 77.0, 1.30x (first priced 1.22x)",
                  "pays most: 36.9 ms, 2.09x (first priced 1.43x)"),
    _cnn_training("mobilenet_v3_fp32_train", "mobilenet_v3_large",
                  "torchvision MobileNetV3-Large, batch 128: depthwise convolutions, hardswish, "
                  "squeeze-and-excitation; timed after PK305's depthwise estimate",
                  "pays: h200: 22.4-27.5 ms from 44.5, 1.71x (priced 2.00x)",
                  "pays most: 22.9-32.2 ms, 1.88x (priced 2.02x)"),
    _cnn_training("convnext_tiny_fp32_train", "convnext_tiny",
                  "torchvision ConvNeXt-Tiny, batch 128: 7x7 depthwise convolutions, LayerNorm, fp32 GELU MLPs; "
                  "timed after PK305's depthwise estimate",
                  "no gain: h200: 183.4 ms from 184.2, 1.00x (priced 1.00x)",
                  "pays most: 46.8 ms, 3.93x (first priced 1.78x, then 2.37x before cuDNN's depthwise weight "
                  "gradients were priced from its bf16 capture: no test of that)", pays=(False, True),
                  more={"bf16_compile": {
                      "args": ["--fix", "bf16_channels_last", "--fix", "compile"], "pays": True, "compiles": True,
                      "what": "bf16_channels_last and the model under torch.compile (default mode)",
                      "expect": "the combiner's plan PK305 + PK103 (bf16 and compile), priced 5.51x before "
                                "it was timed: autocast's casts leave the bf16 step host-bound, which "
                                "Inductor's fusion takes away"}}),
    {
        # Held out: added after the last change of the step model and PK302, captured and timed
        # in one allocation.
        "name": "swin_t_fp32_train", "script": f"{W}/w_resnet18_fp32_train.py", "args": ["--arch", "swin_t"],
        "capture_args": ["--arch", "swin_t", "--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "tf32": _tf32(),
            "bf16_autocast": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                              "what": "forward and loss under torch.autocast(bfloat16) (and channels_last, "
                                      "which reaches only the patch embedding)"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "the model under torch.compile (default mode), fp32"},
        },
        "expect": {
            "baseline": "torchvision Swin-T fp32, batch 128 at 224 px, SGD: fp32 GEMMs on the CUDA cores, window "
                        "partitions, shifts and LayerNorms between them; GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs and attention, with autocast's casts",
            "compile": "some: the elementwise, LayerNorm and window reshuffles between GEMMs fused",
        },
    },
    {
        # Held out, as swin_t_fp32_train.
        "name": "t5_finetune", "script": f"{W}/w_t5_finetune.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            **_finetune_fixes(no_item_pays=None),
            "compile_graphs": {"args": ["--fix", "compile_graphs"], "pays": None, "compiles": True,
                               "what": "the model under torch.compile(mode='reduce-overhead'); optimizer and "
                                       ".item() eager"},
        },
        "expect": {
            "baseline": "HF T5-small fine-tuning, fp32, batch 32, 256 source and 64 target tokens, loss.item() "
                        "every step",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs, with autocast's casts on the CPU",
            "fused_adamw": "small: 60M parameters",
            "no_item": "little while the step is GPU-bound",
            "compile_graphs": "PK103's top action (CUDA graphs between the step's syncs), timed after it was "
                              "priced",
        },
    },
    {
        # Held out, as swin_t_fp32_train.
        "name": "generate_qwen2", "script": f"{W}/w_generate_llama_nvtx.py",
        "args": ["--arch", "qwen2", "--steps", "64", "--runs", "3"],
        "capture_args": ["--arch", "qwen2", "--steps", "16", "--runs", "2"],
        "step_range": "decode_step", "kind": "decode",
        "fixes": _generate_fixes(),
        "expect": {
            "baseline": "HF generate, a Qwen2.5-0.5B-shaped decoder (24 layers, 896 wide, GQA) in bf16, batch 1, "
                        "eager: host-bound",
            "static": "pays: fused Inductor kernels, fewer launches",
            "graphs": "pays most: one graph launch a token for the forward",
        },
    },
    {
        "name": "distilbert_finetune", "script": f"{W}/w_distilbert_finetune.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": _finetune_fixes(no_item_pays=False),
        "expect": {
            "baseline": "HF DistilBERT fine-tuning, fp32, batch 32 x 256, loss.item() every step: GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs and attention, with autocast's casts on the CPU",
            "fused_adamw": "small: 67M parameters against a fp32 step of tens of ms",
            "no_item": "no gain while the step is GPU-bound: the sync costs a queue refill",
        },
    },
    {
        # Not in the corpus: a CUDA graph per padded length (empty_cache kept), PK103's top action
        # here. Captured as a user would (torch.cuda.graph around model(input_ids=...)),
        # transformers 5.17 took its fp32 eager attention path under capture instead of SDPA's
        # flash kernel: 35 ms a 512-token batch against 7.3 ms eager, 0.41x overall, a different
        # program rather than a test of the graph (runs in the _late archive, m1).
        "name": "varlen_empty_cache", "script": f"{W}/w_varlen_empty_cache_infer.py", "args": ["--steps", "60"],
        "capture_args": ["--steps", "32"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "no_empty_cache": {"args": ["--fix", "no_empty_cache"], "pays": True,
                               "what": "drop torch.cuda.empty_cache() after each batch"},
            "expandable_segments": {"args": ["--fix", "expandable_segments"], "pays": False,
                                    "what": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, empty_cache kept"},
        },
        "expect": {
            "baseline": "BERT-base bf16, batch 32, length 128/256/384/512 changing every batch, empty_cache "
                        "after each. Periods differ by length (same length sequence in every variant); each "
                        "length's first batch costs ~40 ms of set-up, all within the warm-up. h200: 7.4 ms",
            "no_empty_cache": "pays: no sync, no cudaMalloc churn. h200: 5.5 ms, 1.36x",
            "expandable_segments": "no gain: empty_cache still syncs and unmaps. h200: 7.8 ms, 0.95x",
        },
    },
    {
        "name": "sync_loop", "script": f"{W}/sync_loop.py", "args": ["--steps", "40"],
        "interleave": "all",
        "capture_args": ["--steps", "30"],
        "step_range": "step", "kind": "training",
        "fixes": {
            "no_sync": {"args": ["--no-sync"], "pays": True,
                        "what": "losses kept on the GPU, no loss.item() before the CPU bookkeeping"},
            "graph": {"args": ["--graph"], "pays": None,
                      "what": "loss.item() kept; forward, backward and the fused AdamW step as one CUDA graph"},
        },
        "expect": {
            "baseline": "6x Linear(4096) training, loss.item() then ~2 ms of CPU bookkeeping a step; one "
                        "middle step is wrapped in ncu_iter (one period spans two steps). h200: 6.1 ms",
            "no_sync": "pays: bookkeeping overlaps the GPU work. h200: 4.35 ms, 1.40x",
            "graph": "a little: the step's ~100 launches become one; the GPU still idles during the bookkeeping",
        },
    },
]


# --------------------------------------------------------------------------- iteration times

# --------------------------------------------------------------------------- registry access

def variants(prog: dict, only: set[str] | None = None) -> list[tuple[str, list[str], dict]]:
    """[(variant name, full argument list, fix entry or {} for the baseline), ...], baseline first;
    ``only``: the fixes to keep (the baseline always stays, since a fix is timed against it)."""
    out = [("baseline", list(prog["args"]), {})]
    for name, fix in prog["fixes"].items():
        if only is None or name in only:
            out.append((name, list(prog["args"]) + list(fix["args"]), fix))
    return out


def select(names: str | None) -> list[dict]:
    if not names:
        return PROGRAMS
    want = [n.strip() for n in names.split(",") if n.strip()]
    known = {p["name"]: p for p in PROGRAMS}
    bad = [n for n in want if n not in known]
    if bad:
        raise SystemExit(f"unknown program(s) {', '.join(bad)}; known: {', '.join(known)}")
    return [known[n] for n in want]


def cmd_list(args: argparse.Namespace) -> None:
    for prog in PROGRAMS:
        if args.capture:  # fewer steps where a full run would make a large trace
            cargs = prog.get("capture_args", prog["args"])
            # profkit capture's own flags ("-" for none: an empty field would vanish in the shell's read)
            flags = " ".join(prog.get("capture_flags", [])) or "-"
            print("\t".join([prog["name"], flags, prog["script"], *cargs]))
            if args.fixed:  # NAME__FIX: the program with one fix applied, to see where the time went
                for fname, fix in prog["fixes"].items():
                    print("\t".join([f"{prog['name']}__{fname}", flags, prog["script"], *cargs, *fix["args"]]))
        elif args.variants:
            for vname, vargs, _ in variants(prog):
                print("\t".join([prog["name"], vname, prog["script"], *vargs]))
        else:
            print("\t".join([prog["name"], prog["script"], *prog["args"]]))


# --------------------------------------------------------------------------- measure

def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _write_json(path: Path, data: dict) -> None:
    """``data`` as indented JSON whose innermost objects (a run folder's timing) each take one
    line: diffs stay one line a run, and the file a fraction of its fully indented size."""
    def dump(x, depth: int) -> str:
        if not isinstance(x, dict) or not any(isinstance(v, (dict, list)) for v in x.values()):
            return json.dumps(x)
        pad = " " * (depth + 1)
        body = ",\n".join(f"{pad}{json.dumps(k)}: {dump(v, depth + 1)}" for k, v in x.items())
        return "{\n" + body + "\n" + " " * depth + "}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dump(data, 0) + "\n")
    os.replace(tmp, path)


def _run_once(args: argparse.Namespace, prog: dict, vargs: list[str], stem: str, limit: float,
              env: dict) -> tuple[int | None, float, Path]:
    """One unprofiled run under the calibrating bootstrap: (exit status or None if killed at
    ``limit`` seconds, wall seconds, calibration path)."""
    out = Path(args.outdir).resolve()
    calib_path = out / "calib" / f"{stem}.json"
    calib_path.unlink(missing_ok=True)
    cmd = [args.python, "-m", "profkit.capture.bootstrap", "--calibrate", str(calib_path), "--",
           prog["script"], *vargs]
    rc, wall = _run_logged(cmd, out, stem, limit, env)
    return rc, wall, calib_path


def _run_logged(cmd: list[str], out: Path, stem: str, limit: float, env: dict) -> tuple[int | None, float]:
    """``cmd`` run from the repository root, its output in OUTDIR/logs/STEM.out and .err: (exit
    status or None if killed at ``limit`` seconds, wall seconds)."""
    t0 = time.monotonic()
    with open(out / "logs" / f"{stem}.out", "w") as so, open(out / "logs" / f"{stem}.err", "w") as se:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=so, stderr=se,
                                stdin=subprocess.DEVNULL, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return rc, time.monotonic() - t0


def limit_for(prog: dict, fix: dict) -> float:
    """The seconds a run of this variant may take: longer for one that compiles."""
    compiles = fix.get("compiles", prog.get("compiles", False))
    return float(fix.get("timeout_s", prog.get("timeout_s",
                                              COMPILE_TIMEOUT_S if compiles else DEFAULT_TIMEOUT_S)))


def _open_result(args: argparse.Namespace, mj: Path, progs: list[dict],
                 chosen: Callable[[dict], list[tuple[str, list[str], dict]]]) -> dict:
    """OUTDIR/measured.json to resume (a new one with --fresh or none there), this call recorded
    in its ``runs`` and an entry made for each program's ``chosen(prog)`` variants."""
    result = (json.loads(mj.read_text()) if (mj.exists() and not args.fresh)
              else {"format": "profkit-whatif-measured/1", "runs": [], "programs": {}, "skipped": []})
    result["skipped"] = []
    result["runs"].append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "host": platform.node(), "python": args.python, "reps": args.reps,
                           "budget_s": args.budget, "programs": [p["name"] for p in progs]})
    for prog in progs:
        entry = result["programs"].setdefault(prog["name"], {
            "script": prog["script"], "step_range": prog["step_range"], "kind": prog["kind"],
            "variants": {}})
        for v, a, f in chosen(prog):
            entry["variants"].setdefault(v, {
                "args": a, "pays": f.get("pays"), "what": f.get("what", "as written"),
                "reps": [], "median_ns": [], "n_used": [], "wall_s": [], "failures": []})
    return result


def cmd_measure(args: argparse.Namespace) -> None:
    out = Path(args.outdir).resolve()
    (out / "calib").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    progs = select(args.programs)
    only = {f.strip() for f in args.fixes.split(",") if f.strip()} if args.fixes else None
    if only and only - {f for p in progs for f in p["fixes"]}:
        raise SystemExit(f"unknown fix(es) {', '.join(sorted(only - {f for p in progs for f in p['fixes']}))} "
                         "for the programs selected")
    mj = out / "measured.json"
    # Resume: results already in OUTDIR/measured.json are kept, and the runs they hold (measured
    # or failed) are not repeated; runs skipped for lack of budget are tried again.
    result = _open_result(args, mj, progs, lambda prog: variants(prog, only))

    t_start = time.monotonic()
    deadline = t_start + args.budget if args.budget else math.inf
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def stamp() -> str:
        return f"[{time.monotonic() - t_start:7.1f}s]"

    if args.prime:  # one untimed run of each compiling variant: later runs find Inductor's caches warm
        for prog in progs:
            for vname, vargs, fix in variants(prog, only):
                if not fix.get("compiles", prog.get("compiles", False)):
                    continue
                left = deadline - time.monotonic()
                if left < args.min_left:
                    print(f"{stamp()} prime {prog['name']} {vname}: skipped (budget spent)", flush=True)
                    continue
                rc, wall, _ = _run_once(args, prog, vargs, f"{prog['name']}__{vname}__prime",
                                        min(limit_for(prog, fix), left), env)
                print(f"{stamp()} prime {prog['name']} {vname}: exit {rc} in {wall:.1f}s", flush=True)

    runs = [(prog, rep, v) for prog in progs for rep in range(1, args.reps + 1) for v in variants(prog, only)]
    for k, (prog, rep, (vname, vargs, fix)) in enumerate(runs, 1):
        name = prog["name"]
        v = result["programs"][name]["variants"][vname]
        label = f"{k}/{len(runs)} {name} {vname} rep {rep}/{args.reps}"
        if rep in v["reps"] or any(f["rep"] == rep for f in v["failures"]):
            print(f"{stamp()} {label}: already in {mj.name}", flush=True)
            continue
        own = limit_for(prog, fix)
        left = deadline - time.monotonic()
        if left < args.min_left:
            result["skipped"].append({"program": name, "variant": vname, "rep": rep})
            print(f"{stamp()} {label}: skipped (budget spent)", flush=True)
            continue
        stem = f"{name}__{vname}__{rep}"
        rc, wall, calib_path = _run_once(args, prog, vargs, stem, min(own, left), env)
        failure = None
        if rc is None and left < own:  # cut short by the budget, not by its own limit: try again later
            result["skipped"].append({"program": name, "variant": vname, "rep": rep})
            print(f"{stamp()} {label}: stopped at the end of the budget after {wall:.1f}s", flush=True)
            _write_json(mj, result)
            continue
        if rc is None:
            failure = f"timed out after {own:.0f} s"
        elif rc != 0:
            failure = f"exit status {rc}"
        else:
            try:
                calib = json.loads(calib_path.read_text())
                med, n = steady_median(iteration_times(calib, prog["step_range"]))
                if med is None:
                    failure = f"too few '{prog['step_range']}' ranges in {calib_path.name}"
            except (OSError, ValueError) as e:
                failure = f"no calibration: {e}"
        if failure:
            v["failures"].append({"rep": rep, "rc": rc, "reason": failure, "wall_s": round(wall, 1),
                                  "stderr_tail": _tail(Path(args.outdir).resolve() / "logs" / f"{stem}.err")})
            print(f"{stamp()} {label}: FAILED ({failure}) after {wall:.1f}s", flush=True)
        else:
            v["reps"].append(rep)
            v["median_ns"].append(med)
            v["n_used"].append(n)
            v["wall_s"].append(round(wall, 1))
            print(f"{stamp()} {label}: {med / 1e6:.3f} ms ({n} iterations) in {wall:.1f}s", flush=True)
        _write_json(mj, result)
    _write_json(mj, result)
    if result["skipped"]:
        print(f"budget of {args.budget:.0f} s spent: {len(result['skipped'])} run(s) skipped; "
              f"run the same command again to continue", flush=True)
    print(f"wrote {mj}", flush=True)


# --------------------------------------------------------------------------- interleave

# ``interleave`` in a program's entry: its script can build the variants side by side in one
# process and time them in blocks that take turns (``--interleave``, scripts/workloads/_corpus.py),
# "all" of its fixes or those listed (not DataLoader workers, which would prepare batches in the
# background while the other variants run, nor cuDNN's benchmark mode, a process-wide setting).
# merge names an interleaved output's folders AB_PREFIX + LABEL + _rN: the page reads a pair from
# them alone where it has any (``measured_speedups``).
AB_PREFIX = "ab-"


def cmd_interleave(args: argparse.Namespace) -> None:
    """Per program and rep, one process that builds the baseline and every fix and times them in
    alternating blocks; OUTDIR/measured.json holds per variant the rep's median, as ``measure``
    writes it (so ``table`` and ``merge`` read it alike). A later call into the same OUTDIR keeps
    the reps measured and tries the failed ones again."""
    progs = select(args.programs) if args.programs else [p for p in PROGRAMS if p.get("interleave")]
    bad = [p["name"] for p in progs if not p.get("interleave")]
    if bad:
        raise SystemExit(f"{', '.join(bad)}: the script cannot interleave its variants; these can: "
                         + ", ".join(p["name"] for p in PROGRAMS if p.get("interleave")))
    out = Path(args.outdir).resolve()
    for sub in ("calib", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    mj = out / "measured.json"

    def chosen(prog: dict) -> list[tuple[str, list[str], dict]]:
        want = prog["interleave"]
        return variants(prog, None if want == "all" else set(want))

    result = _open_result(args, mj, progs, chosen)
    result["interleaved"] = True
    deadline = time.monotonic() + args.budget if args.budget else math.inf
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for rep in range(1, args.reps + 1):
        for prog in progs:
            name, vs = prog["name"], chosen(prog)
            entry = result["programs"][name]
            if rep in entry["variants"]["baseline"]["reps"]:
                continue
            left = deadline - time.monotonic()
            own = max(limit_for(prog, f) for _, _, f in vs)
            if left < args.min_left:
                result["skipped"].append({"program": name, "rep": rep})
                print(f"{name} rep {rep}: skipped (budget spent)", flush=True)
                continue
            stem = f"{name}__interleaved__{rep}"
            path = out / "calib" / f"{stem}.json"
            path.unlink(missing_ok=True)
            cmd = [args.python, prog["script"], *prog["args"], "--interleave", str(path),
                   "--variants", ",".join(v for v, _, _ in vs), "--rounds", str(args.rounds)]
            rc, wall = _run_logged(cmd, out, stem, min(own, left), env)
            try:
                timed = json.loads(path.read_text())["variants"] if rc == 0 else None
            except (OSError, ValueError, KeyError):
                timed = None
            if timed is None:
                reason = "timed out" if rc is None else f"exit status {rc}"
                for vname, _, _ in vs:
                    entry["variants"][vname]["failures"].append(
                        {"rep": rep, "rc": rc, "reason": reason, "wall_s": round(wall, 1),
                         "stderr_tail": _tail(out / "logs" / f"{stem}.err")})
                print(f"{name} rep {rep}: FAILED ({reason}) after {wall:.1f}s", flush=True)
            else:
                for vname, t in timed.items():
                    v = entry["variants"][vname]
                    v["reps"].append(rep)
                    v["median_ns"].append(int(t["median_ns"]))
                    v["n_used"].append(int(t["n_used"]) * int(t["block_iterations"]))
                    v["wall_s"].append(round(wall, 1))
                base = timed["baseline"]["median_ns"]
                print(f"{name} rep {rep} ({wall:.0f}s): " + ", ".join(
                    f"{k} {t['median_ns'] / 1e6:.3f} ms" + ("" if k == "baseline" else f" {base / t['median_ns']:.2f}x")
                    for k, t in timed.items()), flush=True)
            _write_json(mj, result)
    _write_json(mj, result)
    print(f"wrote {mj}", flush=True)


# --------------------------------------------------------------------------- table

def table_rows(measured: dict) -> list[dict]:
    rows = []
    for pname, prog in measured.get("programs", {}).items():
        vs = prog.get("variants", {})
        base = vs.get("baseline", {}).get("median_ns") or []
        base_med = statistics.median(base) if base else None
        for vname, v in vs.items():
            meds = v.get("median_ns") or []
            med = statistics.median(meds) if meds else None
            rows.append({
                "program": pname, "variant": vname,
                "ms": med / 1e6 if med else None,
                "speedup": base_med / med if (med and base_med) else None,
                "spread": max(meds) / min(meds) if meds else None,
                "reps": len(meds), "failed": len(v.get("failures") or []),
                "pays": v.get("pays"), "baseline": vname == "baseline",
            })
    return rows


def cmd_table(args: argparse.Namespace) -> None:
    measured = json.loads(Path(args.measured).read_text())
    rows = table_rows(measured)
    head = ("program", "variant", "step ms", "speedup", "spread", "reps", "expected")
    fmt = "{:<24} {:<26} {:>9} {:>8} {:>7} {:>6}  {}"
    print(fmt.format(*head))
    print(fmt.format(*("-" * len(h) for h in head)))
    exp = {True: "pays", False: "no gain", None: "?"}
    for r in rows:
        print(fmt.format(
            r["program"], r["variant"],
            f"{r['ms']:.3f}" if r["ms"] is not None else "-",
            f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-",
            f"{r['spread']:.3f}" if r["spread"] is not None else "-",
            f"{r['reps']}" + (f"+{r['failed']}F" if r["failed"] else ""),
            "" if r["baseline"] else exp.get(r["pays"], "?")))
    if measured.get("skipped"):
        print(f"\n{len(measured['skipped'])} run(s) skipped for lack of budget")
    for pname, prog in measured.get("programs", {}).items():
        for vname, v in prog.get("variants", {}).items():
            for f in v.get("failures") or []:
                print(f"\nFAILED {pname} {vname} rep {f['rep']}: {f['reason']}")
                tail = (f.get("stderr_tail") or "").splitlines()[-3:]
                for line in tail:
                    print(f"    {line}")


# --- predicted against measured: analyses/whatif.md ----------------------------------------------
# Which trace stands for each program (a calibrated `profkit capture` where there is one), and which
# rule of profkit's catalogue proposes each fix (None: no rule proposes it; predicted 1.00x). For
# PK103 the evidence key names the variant (CUDA graph alone, torch.compile's default mode: the
# fusion alone, or torch.compile with graphs; in a step that holds blocking calls, the pieces
# between them: HF generate()'s static cache compiles the decode forward, which runs between
# generate()'s own syncs).
# The torchvision CNNs of _cnn_training, each fix priced by PK305's evidence of it.
CNN_INFERENCE = ("resnet50_fp32_infer", "efficientnet_b0_fp32_infer", "mobilenet_v3_fp32_infer",
                 "convnext_tiny_fp32_infer", "regnet_y_800mf_fp32_infer", "resnet50_b4_infer",
                 "efficientnet_b0_b4_infer", "mobilenet_v3_b4_infer")
CNN_TRAINING = ("densenet121_fp32_train", "efficientnet_b0_fp32_train", "resnext50_fp32_train",
                "mobilenet_v3_fp32_train", "convnext_tiny_fp32_train")
TRACES = {prog["name"]: f"traces/corpus/{prog['name']}.sqlite.xz" for prog in PROGRAMS}
# What each pair is evidence of. "built on": the first programs of the corpus, timed while the
# step model and the rules were written (allocations 1-6 and 8 of the data's note); "no test": a
# later pair whose miss led to a change of the model or of the rule that prices it (the rule's
# --explain says which); every other pair is a test: first priced after the model and the rule
# that price it were written, and no change of them came from it.
BUILT_ON = {"train_llama", "gpt2_empty_cache", "vit_grad_norms", "early_exit_sync", "resnet18_pageable",
            "lstm_cell_loop", "bert_fp32_infer", "bert_b1_infer", "generate_llama", "dataloader_cnn",
            "numpy_aug_train", "mlp_train_big", "compiled_gpt_train", "graphed_encoder_infer",
            "resnet50_train", "handwritten_block_train", "varlen_empty_cache", "sync_loop"}
NO_TEST = {
    ("resnet18_fp32_train", "channels_last"): "led to PK305's NCHW BatchNorm estimate",
    ("resnet50_fp32_train", "bf16_channels_last"): "led to the step model's launch-queue depth",
    ("efficientnet_b0_fp32_train", "channels_last"): "led to PK305's NCHW depthwise estimate",
    ("efficientnet_b0_fp32_train", "bf16_channels_last"): "led to PK305's NCHW depthwise estimate",
    ("resnext50_fp32_train", "channels_last"): "led to the launch queue and latency beside side streams",
    ("resnext50_fp32_train", "bf16_channels_last"): "led to the launch queue and latency beside side streams",
    ("convnext_tiny_fp32_train", "bf16_channels_last"): "led to PK305's fp32 GEMMs and depthwise weight gradients",
    ("efficientnet_b0_fp32_infer", "bf16_channels_last"): "led to PK305's bf16 exceptions",
    ("convnext_tiny_fp32_infer", "bf16_channels_last"): "led to counting cuDNN's depthwise kernels",
    ("resnet50_b4_infer", "bf16_channels_last"): "led to PK305's added launches of a bf16 BatchNorm",
    ("efficientnet_b0_b4_infer", "bf16_channels_last"): "led to PK305's added launches of a bf16 BatchNorm",
    ("mobilenet_v3_b4_infer", "bf16_channels_last"): "led to PK305's added launches of a bf16 BatchNorm",
    ("generate_qwen2", "static"): "led to PK103 not refusing graphs for an allocator that grew once",
    ("generate_qwen2", "graphs"): "led to PK103 not refusing graphs for an allocator that grew once",
    ("t5_finetune", "compile_graphs"): "led to PK103 pricing the captured pieces with Inductor's fusion too",
    ("t5_finetune", "bf16_autocast"): "led to PK302's price of bf16 below 1 (and its warning)",
    ("resnet50_b4_infer", "cuda_graph"): "led to PK103's whole-step graph taking the Python inside the step's range",
    ("gpt2_fp32_train", "tf32"): "led to PK302's unaligned GEMMs (their shapes need --aten, which this capture has not)",
}


def role(prog: str, fix: str) -> str:
    """What the pair is evidence of: "built on", "no test" or "test" (see BUILT_ON, NO_TEST)."""
    if prog in BUILT_ON:
        return "built on"
    return "no test" if (prog, fix) in NO_TEST else "test"


# (program, fix) -> (the rule that proposes it, or rules joined by + for a fix that does what
# several propose; the evidence key of the variant the fix is, where the rule prices several:
# its price, or with + the edit of that variant replayed with the others')
FIX_RULES = {
    **{(name, fix): ("PK305", f"{fix}_speedup") for name in CNN_TRAINING
       for fix in ("channels_last", "bf16_channels_last")},
    # --compile compiles the model (reduce-overhead) and the optimizer step (its foreach kernels
    # fused): the two rules' edits replayed together
    ("train_llama", "fused"): ("PK201", None), ("train_llama", "compile"): ("PK103+PK201", None),
    ("gpt2_empty_cache", "no_empty_cache"): ("PK105", None), ("gpt2_empty_cache", "fused_adamw"): ("PK201", None),
    ("vit_grad_norms", "no_item"): ("PK101", None), ("vit_grad_norms", "fused_adamw"): ("PK201", None),
    ("early_exit_sync", "no_sync"): ("PK101", None), ("early_exit_sync", "graphs"): ("PK103", "pieces_speedup"),
    ("resnet18_pageable", "pinned"): ("PK104", None), ("resnet18_pageable", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("resnet18_pageable", "pinned+channels_last_bf16"): ("PK104+PK305", "bf16_channels_last_speedup"),
    ("lstm_cell_loop", "cuda_graph"): ("PK103", "cuda_graph_speedup"), ("lstm_cell_loop", "cudnn_lstm"): ("PK106", None),
    ("bert_fp32_infer", "tf32"): ("PK302", None), ("bert_fp32_infer", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("bert_fp32_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("bert_b1_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"), ("bert_b1_infer", "compile"): ("PK103", "fusion_speedup"),
    # the static cache makes transformers compile the decode forward: fused, then (graphs) captured
    ("generate_llama", "static"): ("PK103", "compile_pieces_speedup"),
    ("generate_llama", "graphs"): ("PK103", "compile_pieces_speedup"),
    ("dataloader_cnn", "workers_pin"): ("PK102", None),
    ("numpy_aug_train", "workers"): ("PK102", None), ("numpy_aug_train", "gpu_aug"): ("PK102", None),
    ("mlp_train_big", "cuda_graph"): ("PK103", "cuda_graph_speedup"), ("mlp_train_big", "fused_adamw"): ("PK201", None),
    ("mlp_train_big", "compile"): ("PK103", "fusion_speedup"), ("resnet50_train", "compile"): ("PK103", "fusion_speedup"),
    ("resnet50_train", "compile_graphs"): ("PK103", "compile_speedup"),
    ("compiled_gpt_train", "reduce_overhead"): ("PK103", "cuda_graph_speedup"),
    ("compiled_gpt_train", "fused_adamw"): ("PK201", None),
    ("graphed_encoder_infer", "pinned"): ("PK104", None), ("graphed_encoder_infer", "tf32"): ("PK302", None),
    ("resnet50_train", "fused_sgd"): ("PK201", None), ("resnet50_train", "cudnn_benchmark"): (None, None),
    ("handwritten_block_train", "compile"): ("PK103", "fusion_speedup"),
    ("handwritten_block_train", "fused_adamw"): ("PK201", None),
    ("varlen_empty_cache", "no_empty_cache"): ("PK105", None), ("varlen_empty_cache", "expandable_segments"): (None, None),
    ("sync_loop", "graph"): ("PK103", "pieces_speedup"),
    ("gpt2_fp32_train", "tf32"): ("PK302", None), ("gpt2_fp32_train", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("gpt2_fp32_train", "fused_adamw"): ("PK201", None),
    ("sync_loop", "no_sync"): ("PK101", None),
    ("vit_fp32_infer", "tf32"): ("PK302", None), ("vit_fp32_infer", "bf16_autocast"): ("PK302", "bf16_speedup"),
    # the CNN inference programs (w_resnet50_fp32_infer.py): PK305's two fixes and PK302's TF32
    **{(name, fix): ("PK305", f"{fix}_speedup") if fix != "tf32" else ("PK302", None)
       for name in CNN_INFERENCE for fix in ("channels_last", "bf16_channels_last", "tf32")},
    ("resnet18_fp32_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("resnet18_fp32_train", "bf16_channels_last"): ("PK305", "bf16_channels_last_speedup"), ("resnet18_fp32_train", "fused_sgd"): ("PK201", None),
    ("resnet50_fp32_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("resnet50_fp32_train", "bf16_channels_last"): ("PK305", "bf16_channels_last_speedup"),
    ("distilbert_finetune", "tf32"): ("PK302", None),
    ("distilbert_finetune", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("distilbert_finetune", "fused_adamw"): ("PK201", None), ("distilbert_finetune", "no_item"): ("PK101", None),
    ("convnext_tiny_fp32_train", "bf16_compile"): ("PK305+PK103", "bf16_channels_last_speedup"),
    ("swin_t_fp32_train", "tf32"): ("PK302", None), ("swin_t_fp32_train", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("swin_t_fp32_train", "compile"): ("PK103", "fusion_speedup"),
    ("t5_finetune", "tf32"): ("PK302", None), ("t5_finetune", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("t5_finetune", "fused_adamw"): ("PK201", None), ("t5_finetune", "no_item"): ("PK101", None),
    ("t5_finetune", "compile_graphs"): ("PK103", "compile_pieces_speedup"),
    ("resnet50_b4_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("efficientnet_b0_b4_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("mobilenet_v3_b4_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("generate_qwen2", "static"): ("PK103", "compile_pieces_speedup"),
    ("generate_qwen2", "graphs"): ("PK103", "compile_pieces_speedup"),
}
MEASURED = ROOT / "analyses" / "data" / "whatif" / "measured_h200.json"
# The interleaved processes' blocks, as ``interleave`` wrote them (``merge`` copies them here).
# Every interleaved process's blocks, {FOLDER__PROGRAM: the process's output}, xz-compressed JSON
INTERLEAVED = ROOT / "analyses" / "data" / "whatif" / "interleaved_blocks.json.xz"
# The issue's band: a predicted step time within 15% of the measured one is right.
BAND = 0.15
PAGE = ROOT / "analyses" / "whatif.md"


def paired_gain(base_ns: list[float], fix_ns: list[float]) -> float:
    """An interleaved process's gain for a fix: the median over its rounds (the first, warm-up,
    left out) of the baseline's block over the fix's block of the same round. The blocks of one
    round ran next to each other, so a change of the CPU's speed that lasts several rounds (seen
    on the timing machines: 1.9x for seconds) divides out of each ratio, where the ratio of the
    two medians would keep it."""
    return float(statistics.median(b / f for b, f in zip(base_ns[1:], fix_ns[1:])))


def cmd_merge(args: argparse.Namespace) -> None:
    """Each rep of a ``measure`` output becomes one run folder of the committed data (the baseline
    and the fixes of one rep ran one after the other, which is what a folder means there). An
    ``interleave`` output's folders are named AB_PREFIX + LABEL_rN; each fix's ``gain`` there is
    ``paired_gain`` of the process's blocks (read from OUTDIR/calib/, copied to INTERLEAVED)."""
    try:
        new = json.loads(Path(args.measured).read_text())
        programs = new["programs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"cannot read {args.measured} as a `measure` output ({e}): pass "
                         "OUTDIR/measured.json") from None
    ab = bool(new.get("interleaved"))
    data = json.loads(MEASURED.read_text())
    kept = interleaved_blocks()
    added = 0
    for prog, entry in programs.items():
        blocks = {}
        for rep in (entry["variants"].get("baseline", {}).get("reps", []) if ab else []):
            raw = Path(args.measured).parent / "calib" / f"{prog}__interleaved__{rep}.json"
            try:
                blocks[rep] = json.loads(raw.read_text())
            except (OSError, ValueError) as e:
                raise SystemExit(f"cannot read {raw} ({e}): an interleaved output needs its calib/ folder") from None
            kept[f"{AB_PREFIX}{args.folder}_r{rep}__{prog}"] = blocks[rep]
        for var, v in entry["variants"].items():
            for rep, med, n in zip(v["reps"], v["median_ns"], v["n_used"]):
                folder = f"{AB_PREFIX if ab else ''}{args.folder}_r{rep}"
                runs = data["runs"].setdefault(prog, {}).setdefault(var, {})
                if folder in runs:
                    raise SystemExit(f"folder {folder} already holds {prog} {var}: pick another --folder")
                runs[folder] = {"iterations": n, "median_ns": med}
                if ab and "issue_median_ns" in blocks[rep]["variants"][var]:
                    # the host's issue time of one iteration (_corpus.interleave): the CPU's speed
                    # in this process, which a GPU-paced baseline's period does not show
                    runs[folder]["issue_ns"] = blocks[rep]["variants"][var]["issue_median_ns"]
                if ab and var != "baseline":
                    vb = blocks[rep]["variants"]
                    runs[folder]["gain"] = round(paired_gain(vb["baseline"]["block_ns"], vb[var]["block_ns"]), 4)
                added += 1
    if args.note:
        data["how"] = data["how"].rstrip(". ") + ". " + args.note
    if ab:
        INTERLEAVED.write_bytes(lzma.compress((json.dumps(kept, sort_keys=True) + "\n").encode(), preset=9))
    _write_json(MEASURED, data)
    print(f"added {added} run(s) to {MEASURED.relative_to(ROOT)}")


def interleaved_blocks() -> dict:
    """The committed blocks of every interleaved process, by FOLDER__PROGRAM (empty before any)."""
    return json.loads(lzma.decompress(INTERLEAVED.read_bytes())) if INTERLEAVED.exists() else {}


def shared_folders(base: dict, runs: dict, interleaved: bool | None = None) -> list[str]:
    """The run folders that timed both the baseline and the fix: the interleaved ones alone where
    there are any (the variants shared one process, so the machine's drift between processes,
    up to 1.9x on host-bound programs, is not in them), else the separate runs. ``interleaved``
    True / False picks one kind."""
    both = [f for f in runs if f in base]
    ab = [f for f in both if f.startswith(AB_PREFIX)]
    if interleaved is None:
        return ab or both
    return ab if interleaved else [f for f in both if not f.startswith(AB_PREFIX)]


def measured_speedups(measured: dict, interleaved: bool | None = None
                      ) -> dict[tuple[str, str], tuple[float, int, list[float]]]:
    """(program, fix) -> (median over run folders of baseline / fix measured in the same folder,
    folders, the per-folder ratios); the folders as ``shared_folders`` picks them."""
    out = {}
    for prog, variants in measured["runs"].items():
        base = variants.get("baseline", {})
        for var, runs in variants.items():
            if var == "baseline":
                continue
            ratios = [runs[r].get("gain", base[r]["median_ns"] / runs[r]["median_ns"])
                      for r in shared_folders(base, runs, interleaved)]
            if ratios:
                out[(prog, var)] = (float(statistics.median(ratios)), len(ratios), ratios)
            else:  # never in one folder: medians of different runs (separate runs only, with False)
                bs = [b["median_ns"] for f, b in base.items() if interleaved is not False or not f.startswith(AB_PREFIX)]
                vs = [v["median_ns"] for f, v in runs.items() if interleaved is not False or not f.startswith(AB_PREFIX)]
                if bs and vs and interleaved is not True:
                    r = statistics.median(bs) / statistics.median(vs)
                    out[(prog, var)] = (r, 0, [r])
    return out


def timed_baseline(measured: dict, prog: str, fix: str, interleaved: bool | None = None) -> float:
    """The baseline's median iteration in the run folders where ``fix`` was timed beside it
    (``shared_folders``; median over them, over every folder when they never shared one)."""
    runs = measured["runs"][prog]
    base, mine = runs["baseline"], runs[fix]
    shared = shared_folders(base, mine, interleaved) or [
        f for f in base if interleaved is None or f.startswith(AB_PREFIX) == interleaved] or list(base)
    return float(statistics.median(base[f]["median_ns"] for f in shared))


def predicted(prof, code: str | None, key: str | None, at: tuple | None = None) -> tuple[float, str]:
    """profkit's predicted gain for a fix: the finding of the rule that proposes it (1.0 when the
    rule does not fire or no rule proposes it). ``at``: (findings, CPU scale) of
    ``Profile.findings_at`` to price it there instead of at the capture's calibration."""
    if code is None:
        return 1.0, "no rule proposes it"
    findings, host = at if at is not None else (prof.findings(), None)
    if "+" in code:  # a fix that does what several rules propose: their edits replayed at once
        g = prof.price_together(code.split("+"), host, findings, key)
        return (g, code) if g is not None else (1.0, f"{code}: not every rule fires, or the edits "
                                                      "do not compose")
    for f in findings:
        if f.code == code:
            g = float(f.evidence.get(key, f.expected_end_to_end_speedup)) if key else f.expected_end_to_end_speedup
            if f.evidence.get("refused") and key and key not in ("pieces_speedup", "compile_pieces_speedup"):
                return 1.0, "refused as the program stands"  # (the pieces are what can be captured)
            # A rule's own price never goes below 1 (no gain); an alternative it prices in the
            # evidence may (bf16 where autocast's casts make the step slower)
            return (g if key else max(g, 1.0)), f.rule
    return 1.0, f"{code} does not fire"


def page_rows(measured: dict, load=None) -> tuple[list[dict], list[dict]]:
    """Per pair and per program, what the page says; ``load``: how a trace is loaded (default
    profkit.load; the tests hand in their shared, already judged Profiles)."""
    import profkit
    load = load or profkit.load
    meas = measured_speedups(measured)
    apart = measured_speedups(measured, interleaved=False)
    pairs, progs = [], []
    for prog in PROGRAMS:
        name = prog["name"]
        trace = TRACES.get(name)
        if trace is None or not (ROOT / trace).exists():
            continue
        # A program with a --aten capture beside its plain one: its GEMM shapes, the plain one's
        # timing (profkit classify --shapes-from)
        p = (profkit.load(ROOT / trace, shapes_from=ROOT / prog["shapes_from"]) if prog.get("shapes_from")
             else load(ROOT / trace))
        m = p.step_model()
        cal = m.calibration
        run = p.run_json(p.ops(by="range"))
        top = run["actions"][0] if run["actions"] else None
        best = None
        mine: list[dict] = []
        at_timed: dict[int, tuple] = {}

        def price_at(code: str | None, key: str | None, base_ns: float,
                     issue_ns: float | None = None) -> tuple[float, str]:
            # the model calibrated to a timed baseline (findings_at once per baseline)
            at = (round(base_ns), issue_ns)
            if at not in at_timed:
                at_timed[at] = p.findings_at(base_ns, issue_ns)
            return predicted(p, code, key, at_timed[at])

        def by_folder(code: str | None, key: str | None, fix: str,
                      interleaved: bool | None) -> tuple[float, float, str] | None:
            # Each run folder priced at its own baseline (and the host's issue time beside it,
            # where timed), as a capture is at its own calibration run: (median price, median of
            # the folders' errors, why); None where no folder timed the baseline and the fix.
            base, mine = measured["runs"][name]["baseline"], measured["runs"][name][fix]
            folders = shared_folders(base, mine, interleaved)
            if not folders:
                return None
            prices, errors, why = [], [], ""
            for f in folders:
                gain = mine[f].get("gain", base[f]["median_ns"] / mine[f]["median_ns"])
                price, why = price_at(code, key, base[f]["median_ns"], base[f].get("issue_ns"))
                prices.append(price)
                errors.append(gain / price - 1.0)
            return float(statistics.median(prices)), float(statistics.median(errors)), why

        for fix in prog["fixes"]:
            if (name, fix) not in meas:
                continue
            ms, runs, ratios = meas[(name, fix)]
            code, key = FIX_RULES.get((name, fix), (None, None))
            ps_cap, _ = predicted(p, code, key)
            # Priced for the machine and day the fix was timed on: the model calibrated to the
            # baseline timed beside it, as to a capture's own calibration run.
            base = timed_baseline(measured, name, fix)
            folders = by_folder(code, key, fix, None)
            if folders:
                ps, error, why = folders
            else:  # never in one folder: the medians of different runs, priced at the baseline's
                ps, why = price_at(code, key, base)
                error = ms / ps - 1.0
            ab = bool(shared_folders(measured["runs"][name]["baseline"], measured["runs"][name][fix], True))
            apart_row = None
            if ab and (name, fix) in apart:
                # the separate runs' gain, against the price at their own baselines
                sep = by_folder(code, key, fix, False)
                if sep:
                    apart_row = (*apart[(name, fix)], sep[0], sep[1])
            row = {"program": name, "fix": fix, "rule": code or "-", "why": why, "predicted": ps,
                   "predicted_capture": ps_cap, "measured": ms, "runs": runs,
                   "spread": (min(ratios), max(ratios)), "base_ns": base, "pred_ns": base / ps,
                   "meas_ns": base / ms, "error": error, "error_capture": ms / ps_cap - 1.0,
                   "role": role(name, fix),
                   "interleaved": ab, "apart": apart_row}
            pairs.append(row)
            mine.append(row)
            if best is None or ms > best["measured"]:
                best = row
        progs.append({"program": name, "trace": trace, "calibration": cal.source,
                      "profiled_ns": cal.profiled_iteration_ns, "unprofiled_ns": cal.unprofiled_iteration_ns,
                      "predicted_ns": cal.predicted_iteration_ns, "top": top, "best": best,
                      "top_ok": top_is_right(top, best, mine)})
    return pairs, progs


def top_is_right(top: dict | None, best: dict | None, rows: list[dict]) -> tuple[bool, str]:
    """Whether profkit's top action is the measured best fix or within 5% of it (the fix of the
    same rule measured at least 95% of the best), or, where no fix measured 1.05x, whether it
    promised under 1.10x; and the measured gain of the top action's fix."""
    if best is None:
        return False, "-"
    if best["measured"] < 1.05:
        ok = top is None or top["expected_end_to_end_speedup"] < 1.10
        return ok, "nothing pays"
    if top is None:
        return False, "no action"
    same = [r for r in rows if r["rule"] != "-" and top["rule"] in map(_rule_name, r["rule"].split("+"))]
    if not same:
        return False, "not measured"
    got = max(r["measured"] for r in same)
    return got >= 0.95 * best["measured"], f"{got:.2f}x"


def resolved(r: dict) -> bool:
    """Whether the timings resolve a pair to the target's ±15%: every run folder's gain within
    15% of their median (a single folder cannot show its own spread and counts as resolved)."""
    lo, hi = r["spread"]
    return lo >= r["measured"] / (1 + BAND) and hi <= r["measured"] * (1 + BAND)


def resolution_text(pairs: list[dict]) -> str:
    """What the timings can resolve: the ±15% target split by whether the pair's own runs agree
    to 15%. Said beside the target, not instead of it."""
    res = [r for r in pairs if resolved(r)]
    rest = [r for r in pairs if not resolved(r)]
    hit = sum(abs(r["error"]) <= BAND for r in res)
    misses = [f"{r['program']} {r['fix']} {r['error']:+.0%}" for r in res if abs(r["error"]) > BAND]
    # The widest of the fixes priced to change nothing: what the runs alone do to a gain of 1.
    flat = [r for r in rest if 0.97 <= r["predicted"] <= 1.03]
    w = max(flat, key=lambda r: r["spread"][1] / r["spread"][0]) if flat else None
    example = (f": {w['program']} {w['fix']}, priced {w['predicted']:.2f}x, measured "
               f"{w['spread'][0]:.2f}-{w['spread'][1]:.2f}x across its runs" if w else "")
    return ("How much of that the timings can tell: in **" + f"{len(res)}" + "** pairs every run folder's "
            "gain lies within 15% of their median, and **" + f"{hit} of {len(res)}" + "** of those are within "
            "±15% (misses: " + (", ".join(misses) or "none") + "). In the other "
            f"{len(rest)} the runs of the same fix disagree with each other by more than the target band (host-bound "
            f"programs on machines whose CPU speed changes from one run to the next{example}); "
            f"{sum(abs(r['error']) <= BAND for r in rest)} of them are "
            "within ±15%. The target above counts every pair.")


def page_text(measured: dict, load=None) -> str:
    pairs, progs = page_rows(measured, load)
    n = len(pairs)
    within = sum(abs(r["error"]) <= BAND for r in pairs)
    med = statistics.median(abs(r["error"]) for r in pairs) if pairs else 0.0
    within_cap = sum(abs(r["error_capture"]) <= BAND for r in pairs)
    med_cap = statistics.median(abs(r["error_capture"]) for r in pairs) if pairs else 0.0
    low = [r for r in pairs if r["measured"] < 1.05]
    false_promise = [r for r in low if r["predicted"] >= 1.10]
    idle_promise = [p for p in progs if p["best"] and p["best"]["measured"] < 1.05 and p["top"]
                    and p["top"]["expected_end_to_end_speedup"] >= 1.10]
    lines = [
        "# What-if accuracy: each fix priced by the step model, against the fix timed without a profiler",
        "",
        "*Generated by `python3 scripts/whatif_accuracy.py page` from the committed traces and "
        f"`{MEASURED.relative_to(ROOT)}`; `--check` fails when this page is stale.*",
        "",
        "Each program of the corpus (`scripts/whatif_accuracy.py`, `scripts/workloads/`) was captured on an "
        "NVIDIA H200 with `profkit capture` (a calibration run without the profiler, then nsys), and each fix was "
        f"applied by hand (a flag of the program) and timed without any profiler ({measured['gpu']}, "
        f"{measured['date']}). **Predicted** is the gain "
        "profkit's rule for that fix prices through the step model (the rule's edit of the step graph, replayed "
        "at the calibrated CPU scale; a fix that does what two rules propose, such as `PK103+PK201`, by both "
        "edits replayed together) for the program as it ran where the fix was timed: in each run folder the "
        "model is calibrated to the baseline timed there, as `profkit capture` calibrates it to its own run "
        "without the profiler (`Profile.findings_at`), and where the GPU set that baseline's pace (its period "
        "then shows nothing of the CPU's speed), to the host's time to issue one iteration, "
        "timed in the same process (`issue_ns`, in the folders of allocation 31 on: one iteration from an "
        "idle GPU there, from 32 on two after an untimed one; not where the launch queue would have filled "
        "while it was timed, the GPU's time then as much as the CPU's); gpt2_fp32_train is priced with "
        "the GEMM shapes of a `--aten` capture of it (`classify --shapes-from`, "
        "`traces/real/train_gpt2_fp32_rec.sqlite.xz`). The price shown is the "
        "median over the folders, `baseline timed` the median of their baselines. The "
        "timings ran on other allocations of the machine kind than most captures, on other days, and the "
        "host-bound programs' baselines moved with them (gpt2_empty_cache: 32.3 ms in its capture's "
        "calibration run, 37.4-38.2 ms beside its fixes); **at capture** is the same rule's price at the "
        "capture's calibration. **Measured** is the baseline's median iteration over the fix's, both from "
        "the same run folder (median over folders); where the pair was timed with the baseline side by side "
        "in one process (`runs` N ab), from those processes alone (see *Pairs timed side by side in one process*). "
        "The step time after the fix is the timed baseline "
        "divided by each gain; the error is predicted step time over measured step time, minus one, in each "
        "folder (its fix against the price at its own baseline), the median over the folders. `runs` 0: the "
        "fix and the baseline were never timed in the same run folder, and their medians from different "
        "runs (other machines of the same kind) are compared.",
        "",
        "## Targets (issue: ±15% for 90% of pairs, median error ≤ 7%, top action the measured best on 90% of "
        "programs, no 1.10x promise where every fix measured under 1.05x)",
        "",
        f"- pairs: {n}, of which {len(low)} measured below 1.05x",
        f"- step time after the fix within ±15%: **{within} of {n}** ({within / max(n, 1):.0%})",
        f"- median absolute error: **{med:.1%}**",
        f"- priced at the capture's calibration instead: {within_cap} of {n} within ±15%, median error "
        f"{med_cap:.1%}",
        f"- pairs measured below 1.05x that profkit priced at 1.10x or more: **{len(false_promise)}**"
        + (" (" + ", ".join(f"{r['program']} {r['fix']} {r['predicted']:.2f}x" for r in false_promise) + ")"
           if false_promise else ""),
        *[f"- {label}: {sum(abs(r['error']) <= BAND for r in rs)} of {len(rs)} within ±15%, median error "
          f"{statistics.median(abs(r['error']) for r in rs):.1%}"
          for label, rs in (("tests (later pairs from which no change of their model or rule came)",
                             [r for r in pairs if r["role"] == "test"]),
                            ("built on (the corpus's first programs, timed while the model was written)",
                             [r for r in pairs if r["role"] == "built on"]),
                            ("no test (later pairs whose miss led to a change: see the rules' --explain)",
                             [r for r in pairs if r["role"] == "no test"])) if rs],
        f"- programs where every measured fix gave under 1.05x and the top action promised 1.10x or more: "
        f"**{len(idle_promise)}**" + (" (" + ", ".join(
            f"{p['program']}: {p['top']['rule']} {p['top']['expected_end_to_end_speedup']:.2f}x, a fix not timed"
            for p in idle_promise) + ")" if idle_promise else ""),
        "",
        resolution_text(pairs),
        "",
        "## Pairs",
        "",
        "| program | fix | rule | predicted | at capture | measured | runs | spread | baseline timed | step after (pred) "
        "| step after (meas) | error | error at capture | role |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in pairs:
        lo, hi = r["spread"]
        lines.append(f"| {r['program']} | {r['fix']} | {r['rule']} | {r['predicted']:.2f}x | "
                     f"{r['predicted_capture']:.2f}x | {r['measured']:.2f}x | "
                     f"{r['runs']}{' ab' if r['interleaved'] else ''} | {lo:.2f}-{hi:.2f}x | {r['base_ns'] / 1e6:.2f} ms | {r['pred_ns'] / 1e6:.2f} ms | "
                     f"{r['meas_ns'] / 1e6:.2f} ms | {r['error']:+.0%} | {r['error_capture']:+.0%} | "
                     f"{r['role']} |")
    lines += both_ways_text(pairs)
    lines += ["", "## Programs: calibration, and the top action against the measured best", "",
              "| program | calibration | under nsys | without (measured) | model without | top action | its fix measured "
              "| measured best | right |",
              "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    ok_top = 0
    for p in progs:
        top, best = p["top"], p["best"]
        top_txt = f"{top['rule']} {top['expected_end_to_end_speedup']:.2f}x" if top else "none"
        best_txt = f"{best['fix']} {best['measured']:.2f}x" if best else "-"
        ok, got = p["top_ok"]
        ok_top += ok
        meas = f"{p['unprofiled_ns'] / 1e6:.2f} ms" if p["calibration"] == "measured" else "(estimated)"
        lines.append(f"| {p['program']} | {p['calibration']} | {p['profiled_ns'] / 1e6:.2f} ms | {meas} | "
                     f"{p['predicted_ns'] / 1e6:.2f} ms | {top_txt} | {got} | {best_txt} | {'yes' if ok else 'no'} |")
    lines += ["", f"The top action is the measured best fix, or within 5% of it, on **{ok_top} of {len(progs)}** "
              "programs (where no fix measured 1.05x: the top action promised under 1.10x; a timed fix that does what "
              "the top action's rule and another propose, such as `PK104+PK305`, counts as the top action's: profkit "
              "prices its top actions together on the `together` line). `runs`: the run folders "
              "in which the baseline and the fix were timed one after the other; `spread`: the lowest and highest "
              "ratio among them (the host-bound programs vary most between runs of one machine).", ""]
    return "\n".join(lines) + "\n"


def both_ways_text(pairs: list[dict]) -> list[str]:
    """The pairs timed side by side in one process (``interleave``) as well as in separate runs:
    both measurements, so that the change of protocol shows."""
    ab = [r for r in pairs if r["interleaved"]]
    if not ab:
        return []
    lines = ["", "## Pairs timed side by side in one process", "",
             f"In {len(ab)} pairs the baseline and the fixes were built in one process and timed in blocks "
             "that take turns (`scripts/whatif_accuracy.py interleave`: blocks of 0.2 s or 10 iterations or more, "
             "the order reversed each round, the first round warm-up, one process per run folder, folders `ab-*`). "
             "Those folders alone give the pair's measured gain above (`runs` N ab), because separate runs seconds "
             "apart drifted with the machine's CPU speed by more than the target band. A process's gain for a "
             "fix is the median over its rounds of the baseline's block over the fix's block of the same round "
             "(`paired_gain`): a change of the CPU's speed that lasts several blocks divides out (every block: "
             f"`{INTERLEAVED.relative_to(ROOT)}`). Both "
             "measurements, each folder against the price at its own baseline:", "",
             "| program | fix | separate runs: predicted | measured | spread | runs | interleaved: predicted "
             "| measured | spread | processes | error, separate | error, interleaved |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    apart = [r for r in ab if r["apart"]]
    lines[-3:-3] = ["", f"Within ±15%: {sum(abs(r['apart'][4]) <= BAND for r in apart)} of "
                    f"{len(apart)} with the separate runs (the others were timed interleaved only), "
                    f"{sum(abs(r['error']) <= BAND for r in ab)} of {len(ab)} interleaved."]
    for r in ab:
        lo, hi = r["spread"]
        if r["apart"]:
            am, an, ar, ap, aerr = r["apart"]
            then = f"{ap:.2f}x | {am:.2f}x | {min(ar):.2f}-{max(ar):.2f}x | {an}"
            err = f"{aerr:+.0%}"
        else:
            then, err = "- | - | - | 0", "-"
        lines.append(f"| {r['program']} | {r['fix']} | {then} | {r['predicted']:.2f}x | {r['measured']:.2f}x | "
                     f"{lo:.2f}-{hi:.2f}x | {r['runs']} | {err} | {r['error']:+.0%} |")
    return lines


def _rule_name(code: str) -> str:
    from profkit.judge import rules
    return rules.get(code).RULE.name


def cmd_page(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    text = page_text(json.loads(MEASURED.read_text()))
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            import difflib
            old = PAGE.read_text().splitlines(keepends=True) if PAGE.exists() else []
            sys.stdout.writelines(difflib.unified_diff(old, text.splitlines(keepends=True), str(PAGE), "regenerated"))
            print("whatif_accuracy: analyses/whatif.md is stale: run `python3 scripts/whatif_accuracy.py page`")
            raise SystemExit(1)
        print("whatif_accuracy: analyses/whatif.md is current")
        return
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")


def _timing_options(p: argparse.ArgumentParser, unit: str, min_left: float, reps_help: str) -> None:
    """What ``measure`` and ``interleave`` share: OUTDIR, the programs, the reps, the budget, the
    interpreter and --fresh."""
    p.add_argument("outdir")
    p.add_argument("--programs", help="comma-separated program names (default: all)")
    p.add_argument("--reps", type=int, default=3, help=reps_help)
    p.add_argument("--budget", type=float, default=0, help="seconds for the whole measurement (0: no limit)")
    p.add_argument("--min-left", type=float, default=min_left,
                   help=f"skip a {unit} when fewer seconds than this are left in the budget")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the programs")
    p.add_argument("--fresh", action="store_true",
                   help="start a new OUTDIR/measured.json instead of resuming the one there")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="print name<TAB>script<TAB>args... for each program's baseline")
    p.add_argument("--capture", action="store_true",
                   help="the arguments `profkit capture` gets (capture_args: fewer steps, a smaller trace)")
    p.add_argument("--fixed", action="store_true",
                   help="with --capture, also one line NAME__FIX per fix (the fix's arguments appended)")
    p.add_argument("--variants", action="store_true",
                   help="one line per variant: name<TAB>variant<TAB>script<TAB>args...")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("measure", help="time every (program, variant) without a profiler (GPU machine)")
    _timing_options(p, "run", 20, "runs of each variant")
    p.add_argument("--fixes", help="comma-separated fix names to time beside the baseline (default: all)")
    p.add_argument("--prime", action="store_true",
                   help="first run each compiling variant once, untimed, so that every timed run finds "
                        "Inductor's caches warm")
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("interleave", help="time each program's variants side by side in one process, "
                       "alternating blocks (GPU machine; the programs whose entry has `interleave`)")
    _timing_options(p, "process", 30, "processes per program")
    p.add_argument("--rounds", type=int, default=15, help="rounds of blocks a process")
    p.set_defaults(func=cmd_interleave)
    p = sub.add_parser("page", help="write analyses/whatif.md: predicted against measured (CPU)")
    p.add_argument("--check", action="store_true", help="fail when the committed page is stale")
    p.set_defaults(func=cmd_page)
    p = sub.add_parser("merge", help=f"add a measured.json's reps to {MEASURED.relative_to(ROOT)} as run folders")
    p.add_argument("measured")
    p.add_argument("--folder", required=True, help="label of the allocation: rep N becomes folder LABEL_rN")
    p.add_argument("--note", default="", help="appended to the data's 'how'")
    p.set_defaults(func=cmd_merge)
    p = sub.add_parser("table", help="print the speedups from a measured.json")
    p.add_argument("measured")
    p.set_defaults(func=cmd_table)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    main()
