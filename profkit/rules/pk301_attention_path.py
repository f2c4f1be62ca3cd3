"""PK301 attention-math-path: attention runs as GEMMs + softmax instead of a fused kernel.

What
    Attention computed on the "math" path: batched GEMMs for Q.K^T and P.V with a separate
    softmax kernel between them, and no flash / memory-efficient / cuDNN attention kernel.
Why
    The math path writes the seq x seq score matrix to HBM and reads it back twice; the fused
    kernels keep it on chip. It is what SDPA falls back to for fp32 inputs, unsupported masks or
    head sizes, or what a hand-written attention does.
Evidence
    Kernel names: a (non-log) softmax kernel beside GEMMs, and no kernel matching flash / fmha /
    cuDNN SDPA / efficient_attention in the window. When a fused attention kernel is present the
    rule stays quiet (already flash: leave it).
Fix
    ``torch.nn.functional.scaled_dot_product_attention`` in bf16/fp16 (flash or cuDNN backend:
    ``torch.nn.attention.sdpa_kernel``); HF: ``attn_implementation="sdpa"``.
Expected gain
    Bound: the softmax kernels' time removed (the score matrix stays on chip; the GEMM work
    remains), times its critical share, never below the CPU's own time.
References
    Dao et al., FlashAttention (2022); PyTorch SDPA docs.
"""
from __future__ import annotations

import re

from profkit.model import Rung
from profkit.patterns import FLASH_RE
from profkit.rules.base import matches, Finding, Param, RuleContext, RuleMeta, Scope, Table

RULE = RuleMeta(
    code="PK301", name="attention-math-path",
    summary="attention runs as GEMM + softmax + GEMM: use SDPA with a flash/cuDNN backend",
    tables=(Table.KERNEL,), example="(no committed trace runs math-path attention)",
    quiet_on="traces/real/train_llama.sqlite",
    params=(Param("min_gpu_share", 0.02, "softmax kernels' share of the window's GPU time"),))

SOFTMAX_RE = re.compile(r"softmax", re.I)
LOG_RE = re.compile(r"LogSoftMax|log_softmax", re.I)
GEMM_RE = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|bmm", re.I)


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    names = k.index.to_series()
    if matches(names, FLASH_RE).any() or not matches(names, GEMM_RE).any():
        return []
    soft = k[(matches(names, SOFTMAX_RE) & ~matches(names, LOG_RE)
              & ~names.str.contains(r"^triton_|_softmax_kernel$|softmax_reg_kernel", regex=True)).to_numpy()]
    total = float(soft["total_ns"].sum())
    if soft.empty or total < RULE.param("min_gpu_share") * float(k["total_ns"].sum()):
        return []
    crit = float(soft["critical_ns"].sum()) / total
    g, _, basis = ctx.gpu_saving_gain(total, crit)
    return [Finding(RULE.code, RULE.name,
                    "attention on the math path (GEMM + softmax + GEMM): use "
                    "torch.nn.functional.scaled_dot_product_attention in bf16 with the flash / cuDNN "
                    "backend", Rung.LIBRARY, {"softmax_kernel_ns": int(total)}, g,
                    f"softmax kernels removed {ctx.per_iteration(total)}; {basis}", g, None,
                    Scope.OPS, frozenset(soft.index))]
