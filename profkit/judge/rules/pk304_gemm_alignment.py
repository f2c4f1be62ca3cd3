"""PK304 gemm-alignment: GEMM dimensions that are not multiples of 8 run slower than their FLOPs.

What
    ``aten::mm`` / ``addmm`` / ``bmm`` calls (recorder or emit_nvtx shapes) with a dimension M, K
    or N that is not a multiple of 8 elements (16-bit; 4 for fp32): a vocabulary of 50257 (GPT-2),
    a hidden size of 1000. M counts as well: a transposed operand's leading dimension is M.
Why
    Tensor-core GEMMs load operands in 16-byte vectors; an unaligned leading dimension forces
    narrower loads or a slower kernel, and tiles of 64/128 waste the partial tile. Padding the
    dimension (the extra rows are zeros or masked) restores the fast path.
Evidence
    The op's shapes (``capture --aten``), its achieved FLOP/s from those shapes and its GPU time,
    against the median achieved FLOP/s of the aligned GEMMs of the same precision in the same
    trace. Without an aligned GEMM to compare with, the rule stays quiet.
Fix
    Pad the dimension to a multiple of 64 (e.g. the vocabulary: ``pad_to_multiple_of=64`` in HF
    ``resize_token_embeddings``), or choose model sizes that are multiples of 64.
Expected gain
    Per unaligned GEMM: (aligned median FLOP/s / its FLOP/s) / (padded FLOPs / FLOPs), at least
    1; its saved time times its critical share, never below the CPU's own time.
References
    NVIDIA "Matrix Multiplication Background User's Guide" (tensor-core requirements, tile and
    wave quantisation); HF ``resize_token_embeddings(pad_to_multiple_of=...)``.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.judge.flops import gemm_mkn
from profkit.model import GEMM_ALIGN, Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table, matches

RULE = RuleMeta(
    code="PK304", name="gemm-alignment",
    summary="GEMM dims not multiples of 8 (16-bit) run below their FLOP rate: pad them to 64",
    tables=(Table.KERNEL, Table.NVTX), example="traces/real/train_gpt2_rec.sqlite.xz",
    quiet_on="traces/real/train_llama_aten.sqlite.xz",
    params=(Param("pad_to", 64, "pad the unaligned dimension to a multiple of this"),))

ATEN_GEMM_RE = re.compile(r"^aten::(mm|addmm|bmm)")


def _pad(x: int, to: int) -> int:
    return -(-x // to) * to


def detect(ctx: RuleContext) -> list[Finding]:
    r = ctx.prof.trace.ranges
    if r.empty or not matches(r["name"], ATEN_GEMM_RE).any():
        return []
    ops = ctx.prof.ops(by="aten")
    rows = []
    for name, row in ops.iterrows():
        mkn = gemm_mkn(str(name))
        ev = row["evidence"]
        rate, prec = ev.get("achieved_flops_per_s"), row.get("precision")
        if mkn is None or not rate or prec not in GEMM_ALIGN:
            continue
        # M counts too: a transposed operand's leading dimension is M (the LM head's weight
        # gradient, [50257, 4096] x [4096, 768], ran at 145 TFLOP/s against 795 padded on the H200)
        aligned = all(d % GEMM_ALIGN[prec] == 0 for d in mkn)
        rows.append((str(name), prec, mkn, float(rate), aligned, row))
    out = []
    to = int(RULE.param("pad_to"))
    for prec in {x[1] for x in rows}:
        ref = [x[3] for x in rows if x[1] == prec and x[4]]
        bad = [x for x in rows if x[1] == prec and not x[4]]
        if not ref or not bad:
            continue
        good = float(np.median(ref))
        saved = crit_ns = total = 0.0
        names, gains = [], []
        for name, _, (mm, k, n), rate, _, row in bad:
            pad = (_pad(mm, to) * _pad(k, to) * _pad(n, to)) / (mm * k * n)
            g = max(1.0, good / rate / pad)
            t = float(row["gpu_time_median_ns"]) * float(row["count"])
            total += t
            saved += t * (1.0 - 1.0 / g)
            crit_ns += t * float(row.get("critical_fraction", 1.0))
            names.append(name)
            gains.append(g)
        if saved <= 0:
            continue
        op_gain = total / (total - saved)
        kernels = set().union(*(ops.attrs.get("kernels_of", {}).get(n, set()) for n in names))
        e2e, basis = ctx.price_ops(ctx.acts_named(kernels), op_gain,
                                   f"the unaligned GEMMs' kernels {ctx.per_iteration(total)} / {op_gain:.2f}",
                                   cap=op_gain)
        out.append(Finding(RULE.code, RULE.name,
                           f"pad the GEMM dimensions that are not multiples of {GEMM_ALIGN[prec]} to multiples "
                           f"of {to} ({len(names)} {prec} GEMM shapes, e.g. {names[0]})", Rung.LIBRARY,
                           {"unaligned": names[:5], "aligned_median_flops_per_s": good,
                            "op_gains": [round(g, 2) for g in gains[:5]]}, e2e,
                           f"at the aligned GEMMs' median {good / 1e12:.0f} TFLOP/s over the padded "
                           f"FLOPs; {basis}", e2e, op_gain,
                           Scope.OPS, frozenset()))
    return out
