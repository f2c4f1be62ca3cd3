"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``distill_teacher_train``: knowledge distillation whose teacher keeps its autograd
history; ``lora_finetune_train``: LoRA adapters on a frozen fp32 model under autocast;
``tabular_mlp_train``: an in-memory table read by a DataLoader one row at a time), in the format
of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "distill_teacher_train", "family": "knowledge distillation: a teacher left in the autograd graph",
        "script": f"{W}/w_distill_teacher_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "teacher_no_grad": fix("teacher_no_grad", True, "the teacher's forward under torch.no_grad()"),
            "fused_adamw": fix("fused_adamw", None, "AdamW(fused=True) for the student"),
            "compile": fix("compile", True, "torch.compile of the teacher and of the student (default mode)",
                           compiles=True),
        },
        "expect": {
            "baseline": "BERT-base teacher (12 layers) and a 6-layer student, bf16 autocast over fp32 weights, "
                        "64 x 128 tokens: teacher forward ~1.4 TFLOP, its backward ~2.9 (activation and "
                        "weight gradients nobody reads), the student's forward and backward ~2.2; about "
                        "1,300 launches, GPU-bound. Expected 15-25 ms a step",
            "teacher_no_grad": "pays: the teacher's backward (about 45% of the FLOPs) and its elementwise "
                               "passes go, and its weight-gradient accumulation. Expected 1.5-1.9x",
            "fused_adamw": "unsure, small: one pass over the student's 66M parameters instead of the "
                           "foreach passes, ~1 ms of ~20. Expected 1.02-1.07x",
            "compile": "pays: LayerNorm, GELU, the residual adds and autocast's casts fused in both models; "
                       "the teacher's backward stays. Expected 1.1-1.3x",
        },
    },
    {
        "name": "lora_finetune_train", "family": "parameter-efficient fine-tuning: LoRA on a frozen fp32 model",
        "script": f"{W}/w_lora_finetune_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bf16_base": fix("bf16_base", None, "the frozen base model cast to bf16 once, the adapters fp32"),
            "compile": fix("compile", True, "torch.compile(model) (default mode)", compiles=True),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) for the adapters"),
        },
        "expect": {
            "baseline": "HF Llama 270M frozen in fp32 with 64 rank-16 adapters, bf16 autocast, 8 x 512 tokens: "
                        "~2 TFLOP forward, ~2 backward (activation gradients only, the base is frozen), "
                        "~2,000 launches (each adapter five more a pass, autocast's weight casts). "
                        "Expected 12-18 ms a step, near the line between host- and GPU-bound",
            "bf16_base": "unsure, small: no weight casts (~110 launches, 1.6 GB of traffic a step) and bf16 "
                         "norms' weights. Expected 1.03-1.10x",
            "compile": "pays: the adapters' dropout, scale and add, RMSNorm, SwiGLU, rotary and the casts "
                       "fused; fewer launches. Expected 1.2-1.5x",
            "fused_adamw": "does not pay: 128 small tensors, 2.1M parameters; a few foreach launches saved. "
                           "Expected 1.00-1.02x",
        },
    },
    {
        "name": "tabular_mlp_train", "family": "tabular data: an in-memory table read one row at a time",
        "script": f"{W}/w_tabular_mlp_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "batched_fetch": fix("batched_fetch", True, "a BatchSampler as the loader's sampler and a dataset "
                                                        "indexed by the batch's indices"),
            "gpu_resident": fix("gpu_resident", True, "the table on the GPU, each batch gathered there"),
            "workers": fix("workers", True, "num_workers=4, pin_memory=True, persistent_workers=True"),
        },
        "expect": {
            "baseline": "4,096 rows a batch fetched one at a time (~4 us each) and collated (8,192 small "
                        "tensors stacked): ~15-25 ms of Python a step; the MLP's forward and backward "
                        "(~40 GFLOP in fp32) under 1 ms on the GPU. Host-bound by the loader. Expected "
                        "15-30 ms a step",
            "batched_fetch": "pays: one gather per tensor a batch (~0.2 ms) and a 1 MB pageable copy; the "
                             "step becomes the MLP's launches and kernels. Expected 8-15x",
            "gpu_resident": "pays: no loader, no copy; the step is the MLP's ~60 launches and its kernels. "
                            "Expected 10-25x",
            "workers": "pays: four processes fetch and collate in parallel, pinned copies; the main process "
                       "still unpickles each batch. Expected 2.5-4x",
        },
    },
]
