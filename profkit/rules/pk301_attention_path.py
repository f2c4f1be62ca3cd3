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
    rule stays quiet (already flash: leave it), unless that kernel runs in fp32 (then: bf16).
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

from profkit.dtypes import kernel_dtype
from profkit.model import Rung
from profkit.patterns import FLASH_RE
from profkit.rules.base import GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Scope, Table, matches

RULE = RuleMeta(
    code="PK301", name="attention-math-path",
    summary="attention runs as GEMM + softmax + GEMM: use SDPA with a flash/cuDNN backend",
    tables=(Table.KERNEL,), example="traces/real/train_llama_eager_attn.sqlite",
    quiet_on="traces/real/train_llama.sqlite",
    params=(Param("min_gpu_share", 0.02, "softmax kernels' share of the window's GPU time"),))

SOFTMAX_RE = re.compile(r"softmax", re.I)
LOG_RE = re.compile(r"LogSoftMax|log_softmax", re.I)
GEMM_RE = re.compile(GEMM_KERNEL_RE.pattern + r"|bmm", re.I)  # batched GEMMs of math-path attention


def _fp32_flash(ctx: RuleContext, names) -> list[Finding]:
    """Fused attention in fp32: the memory-efficient kernel runs, but on fp32 data without the
    16-bit tensor-core path (flash needs bf16/fp16)."""
    k = ctx.kernels
    fp32 = [n for n in names[matches(names, FLASH_RE)] if kernel_dtype(n).precision == "fp32"]
    if not fp32:
        return []
    rows = k.loc[fp32]
    total = float(rows["total_ns"].sum())
    crit = float(rows["critical_ns"].sum()) / total if total else 0.0
    g, _, basis = ctx.gpu_saving_gain(total / 2.0, crit)
    g = min(g, 2.0)
    return [Finding(RULE.code, RULE.name,
                    "attention runs in fp32: run it in bf16 (autocast) so SDPA can use the flash / "
                    "cuDNN kernel", Rung.LIBRARY, {"fp32_attention_ns": int(total)}, g,
                    f"fp32 attention {ctx.per_iteration(total)} / 2 (half the bytes per element); "
                    f"{basis}", g, 2.0, Scope.OPS, frozenset(fp32))]


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    names = k.index.to_series()
    if matches(names, FLASH_RE).any():
        return _fp32_flash(ctx, names)  # already fused: only its precision can be wrong
    if not matches(names, GEMM_RE).any():
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
