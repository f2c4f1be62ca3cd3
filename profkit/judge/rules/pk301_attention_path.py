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
    Graph edit (``scale_ops`` with the launches dropped): the kernels between the GEMM before
    each softmax and the GEMM after it (scale, mask, softmax, casts: every pass over the score
    matrix) take no time, and their launch calls go with the short dispatch before each; the
    GEMM work stays. fp32 fused attention: its kernels at half their time (half the bytes per
    element in bf16). The step model replays the edited graph at the calibrated CPU scale; never
    above the op's own gain. On HF eager attention (a host-bound Llama step) SDPA measured 1.11x,
    from 38 fewer launches a step.
References
    Dao et al., FlashAttention (2022); PyTorch SDPA docs.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profkit.judge.dtypes import kernel_dtype
from profkit.model import Rung
from profkit.judge.patterns import FLASH_RE
from profkit.judge.rules.base import (GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Scope, Table,
                                matches, removed_launch_cost)

RULE = RuleMeta(
    code="PK301", name="attention-math-path",
    summary="attention runs as GEMM + softmax + GEMM: use SDPA with a flash/cuDNN backend",
    tables=(Table.KERNEL,), example="traces/real/train_llama_eager_attn.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_gpu_share", 0.02, "softmax kernels' share of the window's GPU time"),
            Param("dispatch_gap_us", 50.0, "host gaps before a removed launch shorter than this "
                  "count as its dispatch cost")))

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
    g, basis = ctx.price_ops(ctx.acts_named(fp32), 2.0, f"fp32 attention {ctx.per_iteration(total)} / 2 "
                             "(half the bytes per element)", cap=2.0)
    return [Finding(RULE.code, RULE.name,
                    "attention runs in fp32: run it in bf16 (autocast) so SDPA can use the flash / "
                    "cuDNN kernel", Rung.LIBRARY, {"fp32_attention_ns": int(total)}, g,
                    basis, g, 2.0, Scope.OPS, frozenset(fp32))]


MAX_GLUE = 6  # kernels between the two GEMMs of one attention (scale, mask, softmax, casts)


def _glue(ctx: RuleContext, soft_names: set) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """(glue mask, GEMM-after-softmax mask, kernels in stream order): the kernels between the GEMM
    before each math-path softmax and the GEMM after it, on one stream; the score matrix passes
    through each of them, and a fused attention kernel keeps it on chip."""
    a = ctx.kernels_in_stream_order
    names = a["name"].astype(str)
    gemm = matches(names, GEMM_RE)
    soft = names.isin(soft_names).to_numpy()
    stream = a["streamId"].to_numpy()
    glue = np.zeros(len(a), dtype=bool)
    after = np.zeros(len(a), dtype=bool)
    for i in np.flatnonzero(soft):
        p = i - 1
        while p >= 0 and not gemm[p] and stream[p] == stream[i] and i - p <= MAX_GLUE:
            p -= 1
        q = i + 1
        while q < len(a) and not gemm[q] and stream[q] == stream[i] and q - i <= MAX_GLUE:
            q += 1
        if p >= 0 and q < len(a) and gemm[p] and gemm[q] and stream[p] == stream[q] == stream[i] \
                and q - p - 1 <= MAX_GLUE:
            glue[p + 1:q] = True
            after[q] = True   # two GEMMs become one fused kernel
        else:
            glue[i] = True    # no GEMM pair around it: the softmax alone
    return glue, after, a


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
    glue, after, a = _glue(ctx, set(soft.index))
    dur = a["dur"].to_numpy(np.float64)
    saved = float(dur[glue].sum())
    # The CPU's side: the removed launches (the glue, and one of each GEMM pair) and the short
    # host gaps before them, as PK403 counts them; on a host-bound step this is what shortens it.
    removed = glue | after
    cpu_removed = removed_launch_cost(a, removed, RULE.param("dispatch_gap_us") * 1e3)
    gemm_ns = float(dur[after].sum()) * 2.0  # the GEMM pairs around the glue stay (as one kernel)
    op_gain = (saved + gemm_ns) / gemm_ns if gemm_ns else None
    g, basis = ctx.price_ops(a[glue | after].iloc[np.flatnonzero(glue[glue | after])], float("inf"),
                             f"softmax and the kernels between each attention's GEMMs "
                             f"{ctx.per_iteration(saved)} removed with their launches", True, cap=op_gain)
    per = max(ctx.iterations, 1)
    return [Finding(RULE.code, RULE.name,
                    "attention on the math path (GEMM + softmax + GEMM): use "
                    "torch.nn.functional.scaled_dot_product_attention in bf16 with the flash / cuDNN "
                    "backend", Rung.LIBRARY,
                    {"softmax_kernel_ns": int(total), "glue_kernel_ns": int(saved),
                     "removed_launches": int(removed.sum()), "cpu_removed_ns": int(cpu_removed)}, g,
                    f"{int(removed.sum()) / per:.0f} launches per iteration with their dispatch "
                    f"{ctx.per_iteration(cpu_removed)}; {basis}", g, op_gain,
                    Scope.OPS, frozenset(soft.index))]
