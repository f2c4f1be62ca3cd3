"""PK303 skinny-gemm: GEMMs with a handful of rows stream the weights (decode, tiny batches).

What
    GEMM kernels tiled for a tiny dimension (nvjet/cuBLAS tiles of 8 or 16 along M or N, split-K,
    gemv): a decode step or a small batch multiplies few tokens by a large weight.
Why
    Such a GEMM reads every weight once for a few tokens: it is bound by the weight bytes, not
    the FLOPs. Its time hardly changes with more tokens per call, and halves with half the bytes
    per weight.
Evidence
    The tile shape in the kernel name (``nvjet_sm90_tst_8x64_...``, ``..._64x8_...``), ``gemv``.
    GEMMs with full tiles near their roof are left alone (the op table says "Leave it").
Fix
    Batch more tokens per call (more sequences per decode step, speculative decoding), or
    weight-only int8/fp8 quantisation (torchao ``int8_weight_only``). Dims that are not multiples
    of 8 (16-bit) break tensor-core alignment: pad them (vocab to a multiple of 64).
Expected gain
    Weight-only 8-bit: half the weight bytes, so the skinny GEMMs' time / 2 at most; times the
    critical share, never below the CPU's own time (a host-bound decode gains little).
References
    PyTorch torchao quantization docs; NVIDIA "Matrix Multiplication Background" (tile
    quantisation, alignment).
"""
from __future__ import annotations

import re

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table

RULE = RuleMeta(
    code="PK303", name="skinny-gemm",
    summary="weight-streaming GEMMs with a few rows: batch more tokens or quantise the weights",
    tables=(Table.KERNEL,), example="traces/real/generate_llama.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_gpu_share", 0.05, "skinny GEMMs' share of the window's GPU time"),))

TILE_RE = re.compile(r"nvjet_sm\d+_\w{3}_(\d+)x(\d+)_")
GEMV_RE = re.compile(r"gemv", re.I)
OP_GAIN = 2.0  # 16-bit -> 8-bit weights


def skinny(name: str) -> bool:
    m = TILE_RE.search(name)
    return bool(GEMV_RE.search(name)) or (m is not None and min(int(m.group(1)), int(m.group(2))) <= 16)


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    names = [n for n in k.index if skinny(n)]
    if not names:
        return []
    rows = k.loc[names]
    total = float(rows["total_ns"].sum())
    if total < RULE.param("min_gpu_share") * float(k["total_ns"].sum()):
        return []
    crit = float(rows["critical_ns"].sum()) / total
    g, basis = ctx.price_ops(ctx.acts_named(names), OP_GAIN,
                             f"skinny GEMMs {ctx.per_iteration(total)} / {OP_GAIN:.0f} (half the weight "
                             "bytes)", cap=OP_GAIN)
    return [Finding(RULE.code, RULE.name,
                    "skinny GEMMs stream the weights: batch more tokens per call (more sequences per "
                    "decode step), or quantise the weights to 8 bits (torchao int8_weight_only)",
                    Rung.LIBRARY, {"skinny_gemm_ns": int(total), "kernels": len(names),
                                   "critical_share": round(crit, 3)}, g,
                    basis, g, OP_GAIN, Scope.OPS, frozenset(names))]
