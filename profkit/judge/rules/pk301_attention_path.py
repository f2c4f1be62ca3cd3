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
    rule stays quiet (already flash: leave it), unless that kernel runs in fp32 (then: bf16) or
    its calls got their causal mask as a tensor (then: is_causal).
    Each attention is the GEMM before a softmax, the kernels between (scale, mask, softmax, casts,
    dropout: up to twelve, eight in a nanoGPT block under autocast) and the GEMM after it; in the
    backward (``softmax_backward``) the two GEMMs on each side. A log-softmax, or a loss kernel
    between the GEMMs (a classifier's head and its gradient), is not an attention.
Fix
    ``torch.nn.functional.scaled_dot_product_attention`` in bf16/fp16 (flash or cuDNN backend:
    ``torch.nn.attention.sdpa_kernel``); HF: ``attn_implementation="sdpa"``.
Expected gain
    Graph edit: each attention (its GEMMs and the glue between them) becomes one kernel, the other
    launches gone with the short dispatch before each; the step model replays the edited graph at
    the calibrated CPU scale, never above the op's own gain. The new kernel's time, best first:

    * **timed at capture** (``profkit capture`` records the attention's shapes in its calibration
      run and times SDPA against the math path at them, PROFKIT_META ``replacements``): each
      attention's kernels in the trace divided by the measured ratio (the forward's for a forward,
      the backward's for a backward), never below the bound below. SDPA is timed as the fix
      calls it (no backend chosen) with the dropout the program applied to the probabilities
      (a GPT-2 step's cuDNN attention with dropout 0.1: 293 us a layer timed, 265 us in the
      program with the fix; without the dropout it was timed at 192; an H100, 2026-12-05). The action says
      "replacement timed at the program's shapes: X us vs Y us";
    * **estimated from the shapes** (the op record without a timing, or a ``--aten`` trace, or
      ``classify --shapes-from``): the work flash attention does, 4*B*H*Sq*Sk*D FLOPs forward
      (half under a causal mask), 2.5 times that for a backward, the bytes of Q, K, V and O once
      (and dO, dQ, dK, dV in a backward), the FLOPs at FLASH_ROOF_SHARE (26%) of the peaks'
      16-bit tensor-core roof and the bytes at the memory bandwidth (``classify --peaks`` for
      the measured ones): the S x S GEMMs go too, which the old price kept (a hand-written causal
      attention in bf16 at 2k tokens on the H200: SDPA priced 2.63x with the GEMMs kept,
      measured 5.64x). Said as "estimated: no replacement timed at capture". The share is what
      cuDNN's flash kernels reached in a committed capture (train_llama_sdpa_samerun: B*H 128,
      S 512, D 64, causal: 158.6 us a step where the full roof gives 41.9 us); at the full roof
      the op's gain there would have been over-promised 4x (41x against about 10x). Longer
      sequences reach more of the roof: there the estimate is conservative, and the timing above
      is what closes the gap. An op record whose attention list is empty (taken before casts
      around an fp32 softmax were followed to it) still holds the batched GEMMs: a scores GEMM
      ``[b, Sq, D] @ [b, D, Sk]`` (Sq, Sk >= 128, D <= 256) and its ``[b, Sq, Sk] @ [b, Sk, Dv]``
      partner give the shape, priced without the causal half (the mask is not known): on
      handwritten_attention_train 1.12x with the GEMMs kept became 1.74x (measured 2.12x; the CPU
      scale of that GPU-bound step is an estimate, and the sped-up step is host-bound);
    * **no shapes** (a plain nsys trace): only the glue goes (every pass over the score matrix),
      the GEMM work stays, said as such: a floor.

    fp32 fused attention: its kernels at half their time (half the bytes per element in bf16).

    A causal mask given to SDPA as a tensor (``attn_mask`` exactly the lower triangle, told
    apart by the op record: ``causal_mask``): fused kernels run, but the ones that take a mask
    compute the whole score matrix; ``is_causal=True`` lets them skip the hidden half. The fused
    attention kernels are scaled by the masked calls' share of the attention work at the ratio
    timed at capture (``attention_causal_mask``: the call with the tensor and with is_causal at
    the program's shapes), else at 2x (half the FLOPs). Found on a GPT-2 step at 2k tokens whose
    SDPA got its mask sliced from a buffer (masked_sdpa_train: is_causal measured 1.15x
    end to end, no rule had priced it).
    On HF eager attention (a host-bound Llama step) SDPA measured 1.11x, from 38 fewer launches a
    step.
References
    Dao et al., FlashAttention (2022); Dao, FlashAttention-2 (2023); PyTorch SDPA docs.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np
import pandas as pd

from profkit.judge.dtypes import kernel_dtype
from profkit.judge.flops import FLASH_BACKWARD_FLOPS, flash_attention_work, gemm_mkn
from profkit.read.aten_record import literal_sizes
from profkit.model import Rung
from profkit.judge.patterns import FLASH_RE
from profkit.judge.rules.base import (ESTIMATED, GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Scope,
                                      Table, matches, removed_launch_cost, timed_text)

RULE = RuleMeta(
    code="PK301", name="attention-math-path",
    summary="attention runs as GEMM + softmax + GEMM: use SDPA with a flash/cuDNN backend",
    tables=(Table.KERNEL,), example="traces/real/train_llama_eager_attn.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_gpu_share", 0.02, "the attentions' share (GEMMs, softmax and the glue) of the window's GPU time"),
            Param("dispatch_gap_us", 50.0, "host gaps before a removed launch shorter than this "
                  "count as its dispatch cost")))

SOFTMAX_RE = re.compile(r"softmax", re.I)
# softmax_warp_forward<in, out, acc, log2_elements, is_log_softmax, ...>: the persistent-warp
# kernel says it is a log-softmax by its first bool template argument.
LOG_RE = re.compile(r"LogSoftMax|log_softmax|softmax_warp_\w+<[^>]*?\(int\)\d+, \(bool\)1", re.I)
# Between an attention's two GEMMs every kernel passes over the scores; a loss
# there (a classifier's cross entropy between its head's forward and backward GEMMs) is not one.
NOT_GLUE_RE = re.compile(r"nll_loss|cross_entropy|CrossEntropy", re.I)
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


# Kernels between the two GEMMs of one attention: scale, the mask built and applied, casts to
# and from an fp32 softmax, dropout, a contiguous copy (eight in a nanoGPT block under autocast;
# their gradients in the backward).
MAX_GLUE = 12
BACKWARD_RE = re.compile(r"backward", re.I)


def _glue(ctx: RuleContext, soft_names: set) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """(glue mask, GEMM-after-softmax mask, kernels in stream order): ``_attentions`` without the
    attentions."""
    return _attentions(ctx, soft_names)[:3]


def _attentions(ctx: RuleContext, soft_names: set) -> tuple[np.ndarray, np.ndarray, pd.DataFrame, list]:
    """(glue mask, GEMM-after-softmax mask, kernels in stream order, attentions): the kernels
    between the GEMM before each math-path softmax and the GEMM after it, on one stream; the score
    matrix passes through each of them, and a fused attention kernel keeps it on chip. Each
    attention is ``(first, last, backward)``, positions in the kernels: its GEMMs and the glue
    (in a backward the two GEMMs on each side: dP and dV before, dQ and dK after)."""
    a = ctx.kernels_in_stream_order
    names = a["name"].astype(str)
    gemm = matches(names, GEMM_RE)
    soft = names.isin(soft_names).to_numpy()
    bwd = matches(names, BACKWARD_RE)
    stream = a["streamId"].to_numpy()
    not_glue = matches(names, NOT_GLUE_RE)
    glue = np.zeros(len(a), dtype=bool)
    after = np.zeros(len(a), dtype=bool)
    spans: list[tuple[int, int, bool]] = []
    for i in np.flatnonzero(soft):
        p = i - 1
        while p >= 0 and not gemm[p] and stream[p] == stream[i] and i - p <= MAX_GLUE:
            p -= 1
        q = i + 1
        while q < len(a) and not gemm[q] and stream[q] == stream[i] and q - i <= MAX_GLUE:
            q += 1
        if p >= 0 and q < len(a) and gemm[p] and gemm[q] and stream[p] == stream[q] == stream[i] \
                and q - p - 1 <= MAX_GLUE and not not_glue[p + 1:q].any():
            glue[p + 1:q] = True
            after[q] = True   # two GEMMs become one fused kernel
            lo, hi = p, q
            if bwd[i]:
                if lo > 0 and gemm[lo - 1] and stream[lo - 1] == stream[i]:
                    lo -= 1
                if hi + 1 < len(a) and gemm[hi + 1] and stream[hi + 1] == stream[i]:
                    hi += 1
            if not spans or lo > spans[-1][1]:
                spans.append((lo, hi, bool(bwd[i])))
        else:
            glue[i] = True    # no GEMM pair around it: the softmax alone
    return glue, after, a, spans


def _aten_shapes(ctx: RuleContext, a: pd.DataFrame, spans: list) -> list[Optional[dict]]:
    """Per attention, its shape from the aten op that launched its first GEMM (Q.K^T: ``aten::bmm
    [[B*H, Sq, D], [B*H, D, Sk]]``) and its last (P.V: ``[[B*H, Sq, Sk], [B*H, Sk, Dv]]``): a
    ``--aten`` capture's, or the ``--shapes-from`` one's; None where not known (a backward)."""
    by_label: dict = {}
    for op, labels in ctx.aten_acts.items():
        if str(op).startswith(("aten::bmm ", "aten::baddbmm ")):
            for lab in np.asarray(labels).tolist():
                by_label[lab] = op
    if not by_label:
        return [None] * len(spans)
    labels = a.index.to_numpy()
    out: list[Optional[dict]] = []
    for lo, hi, backward in spans:
        qk, pv = by_label.get(labels[lo]), by_label.get(labels[hi])
        mkn_qk = gemm_mkn(str(qk).replace("aten::baddbmm", "aten::bmm")) if qk and not backward else None
        mkn_pv = gemm_mkn(str(pv).replace("aten::baddbmm", "aten::bmm")) if pv and not backward else None
        sizes = literal_sizes(str(qk).split(" ", 1)[1].split(" | ", 1)[0]) if mkn_qk else None
        if not mkn_qk or not sizes or not isinstance(sizes[0], list) or len(sizes[0]) != 3:
            out.append(None)
            continue
        (sq, d, sk), dv = mkn_qk, (mkn_pv[2] if mkn_pv else mkn_qk[1])
        out.append({"batch": int(sizes[0][0]), "sq": sq, "sk": sk, "d": d, "dv": dv,
                    "mask": "none", "count": 1})
    return out


def _assign(times: np.ndarray, shapes: list[dict]) -> list[dict]:
    """A shape for each attention: the only one, or, for several, by rank: the longest
    attentions get the shapes with the most work, in proportion to each shape's count."""
    if len(shapes) == 1 or not len(times):
        return [shapes[0]] * len(times)
    ranked = sorted(shapes, key=lambda s: -flash_attention_work(
        s["batch"], s["sq"], s["sk"], s["d"], s["dv"], False, False)[0])
    weights = np.cumsum([max(int(s.get("count", 1)), 1) for s in ranked], dtype=float)
    order = np.argsort(-times, kind="stable")
    out: list[dict] = [ranked[0]] * len(times)
    for rank, i in enumerate(order):
        pos = (rank + 0.5) / len(times) * weights[-1]
        out[i] = ranked[int(np.searchsorted(weights, pos))]
    return out


# The share of the 16-bit tensor-core roof flash attention's kernels reached in a committed
# capture: cuDNN's flash forward and backward in train_llama_sdpa_samerun (B*H 128, 512 tokens,
# head size 64, causal, bf16) took 158.6 us a step for the work that the H200 datasheet's 989.5
# TFLOP/s does in 41.9 us (tests/test_replacements.py recomputes it from the two traces). Short
# sequences give each thread block few key blocks to loop over, and its prologue and epilogue
# weigh: longer sequences reach more of the roof, so an estimate at this share is conservative
# there (a smaller gain than the timed one), never the 4x over-promise the roof itself gave.
FLASH_ROOF_SHARE = 0.2645


def flash_ns(ctx: RuleContext, s: dict, backward: bool, precision: str, share: float = 1.0) -> float:
    """The time flash attention takes for one call at shape ``s``: its FLOPs at ``share`` of the
    peaks' 16-bit tensor-core roof or its bytes at the memory bandwidth, whichever is longer
    (``share`` 1: the shortest it can take, the bound)."""
    peaks = ctx.prof.peaks
    roof = peaks.flops.get("fp16" if precision == "fp16" else "bf16") or peaks.compute_peak("bf16")[1]
    flops, nbytes = flash_attention_work(int(s["batch"]), int(s["sq"]), int(s["sk"]), int(s["d"]),
                                         int(s["dv"]), s.get("mask") == "causal", backward)
    return max(flops / (roof * share), nbytes / peaks.memory_bandwidth) * 1e9


def _timed_ratio(entries: list, s: dict, backward: bool) -> Optional[tuple[float, object]]:
    """The measured original/replacement ratio for shape ``s`` (the forward's alone, or the
    backward's: the whole call's less the forward's), with its entry; None when not timed."""
    key = tuple(int(s[k]) for k in ("batch", "sq", "sk", "d", "dv"))
    e = next((e for e in entries if tuple(int(e.shape.get(k, -1)) for k in
                                          ("batch", "sq", "sk", "d", "dv")) == key), None)
    if e is None:
        return None
    if e.forward is None:
        return e.ratio, e
    fo, fr = e.forward
    if not backward:
        return fo / fr, e
    bo, br = e.original_ns - fo, e.replacement_ns - fr
    return ((bo / br) if bo > 0 and br > 0 else e.ratio), e


def _priced_by_shape(ctx: RuleContext, a: pd.DataFrame, spans: list):
    """Each attention as one kernel at its timed or flash-bound time: (rows, group ids, new times,
    where the price comes from, the edit, evidence), or None without shapes."""
    recorded = ctx.replacements.recorded("attention")
    per_span = _aten_shapes(ctx, a, spans) if not recorded else [None] * len(spans)
    fwd_known = [x for x in per_span if x is not None]
    paired = [] if recorded or fwd_known else _gemm_pairs(ctx.replacements.recorded("gemm"))
    shapes = recorded or _merge(fwd_known) or paired
    if not shapes or not spans:
        return None
    source = ("the op record of the calibration run" if recorded else
              "the op record's batched GEMMs (scores then probabilities @ V; the mask not known, "
              "so priced without the causal half)" if paired else
              f"the shapes of {ctx.prof.shapes_from}" if ctx.prof.shapes_from else "the --aten ranges")
    dur = a["dur"].to_numpy(np.float64)
    span_ns = np.array([dur[lo:hi + 1].sum() for lo, hi, _ in spans])
    backward = np.array([b for _, _, b in spans], dtype=bool)
    chosen: list[Optional[dict]] = list(per_span)
    for which in (False, True):
        idx = [i for i in range(len(spans)) if backward[i] == which and chosen[i] is None]
        for i, s in zip(idx, _assign(span_ns[idx], shapes)):
            chosen[i] = s
    precision = kernel_dtype(str(a["name"].iat[spans[0][0]])).precision or "bf16"
    timed = ctx.replacements.measured("attention")
    new_ns = np.empty(len(spans))
    bound_ns = np.empty(len(spans))
    used = []
    for i, ((lo, hi, bwd), s) in enumerate(zip(spans, chosen)):
        bound_ns[i] = flash_ns(ctx, s, bwd, precision)
        got = _timed_ratio(timed, s, bwd)
        # untimed: at the share of the roof flash reached where it was measured (never slower
        # than the math path's own kernels); timed: the measured ratio, never below the bound
        new_ns[i] = (min(flash_ns(ctx, s, bwd, precision, FLASH_ROOF_SHARE), span_ns[i]) if got is None
                     else max(span_ns[i] / max(got[0], 1e-9), bound_ns[i]))
        if got is not None:
            used.append(got[1])
    rows_pos = np.concatenate([np.arange(lo, hi + 1) for lo, hi, _ in spans])
    group = np.concatenate([np.full(hi - lo + 1, i) for i, (lo, hi, _) in enumerate(spans)])
    per = ctx.per_iteration
    main = max(shapes, key=lambda s: int(s.get("count", 1)))
    shape_text = (f"B*H {main['batch']}, Sq {main['sq']}, Sk {main['sk']}, D {main['d']}"
                  f"{', causal' if main.get('mask') == 'causal' else ''}")
    peaks = ctx.prof.peaks
    if used:
        said = timed_text(list({id(e): e for e in used}.values()), "SDPA vs the math path, ")
        what = (f"each of the {len(spans)} attentions' GEMMs and glue {per(float(span_ns.sum()))} as one "
                f"kernel at the measured ratio {per(float(new_ns.sum()))} ({shape_text}, from {source})")
        how = "timed"
    else:
        said = (f"{ESTIMATED}: flash attention's FLOPs and bytes at {FLASH_ROOF_SHARE:.0%} of "
                f"{peaks.compute_peak('bf16')[1] / 1e12:.0f} TFLOP/s (the share its kernels reached in a "
                f"measured capture at 512 tokens; longer sequences reach more) and "
                f"{peaks.memory_bandwidth / 1e12:.2f} TB/s ({peaks.source}); at the full roof "
                f"{per(float(bound_ns.sum()))}")
        what = (f"each of the {len(spans)} attentions' GEMMs and glue {per(float(span_ns.sum()))} as one "
                f"flash-attention kernel {per(float(new_ns.sum()))} ({shape_text}, from {source})")
        how = "flash_estimate"
    ev = {"priced_from": how, "attentions": len(spans), "attention_ns": int(span_ns.sum()),
          "flash_ns": int(new_ns.sum()), "flash_bound_ns": int(bound_ns.sum()), "shapes_from": source}
    return a.iloc[rows_pos], group, new_ns, said, what, ev


# The scores' GEMM of an attention: an output of at least this many rows and columns from an
# inner dimension (the head size) at most HEAD_MAX: a written-out attention's Q.K^T.
SCORES_MIN = 128
HEAD_MAX = 256


def _gemm_pairs(gemms: list[dict]) -> list[dict]:
    """Attention shapes from an op record's batched GEMMs alone (a record whose attention list is
    empty: the chain to the softmax was not followed): a scores GEMM ``[b, Sq, D] @ [b, D, Sk]``
    and, at the same batch, its partner ``[b, Sq, Sk] @ [b, Sk, Dv]``. The counts are the
    forward's and the backward's together; the mask is not known (priced as none)."""
    bmm = [g for g in gemms if str(g.get("op")) in ("bmm", "baddbmm") and int(g.get("batch", 1)) > 1]
    out = []
    for g in bmm:
        b, m, n, k = (int(g[x]) for x in ("batch", "m", "n", "k"))
        if m < SCORES_MIN or n < SCORES_MIN or k > HEAD_MAX:
            continue
        pv = next((h for h in bmm if int(h["batch"]) == b and int(h["m"]) == m
                   and int(h["k"]) == n and int(h["n"]) <= HEAD_MAX), None)
        if pv is not None:
            out.append({"batch": b, "sq": m, "sk": n, "d": k, "dv": int(pv["n"]), "mask": "none",
                        "count": int(g.get("count", 1))})
    return out


def _merge(shapes: list[dict]) -> list[dict]:
    """Equal shapes counted once, with their count."""
    out: dict = {}
    for s in shapes:
        key = tuple(s[k] for k in ("batch", "sq", "sk", "d", "dv"))
        if key in out:
            out[key]["count"] += 1
        else:
            out[key] = dict(s)
    return list(out.values())


# A causal mask given as a tensor, without a timing: the kernels that skip the hidden half do
# half the work (flash attention's FLOPs under is_causal, flops.flash_attention_work)
CAUSAL_MASK_GAIN = 2.0


def _causal_mask(ctx: RuleContext, names) -> list[Finding]:
    """Fused attention given its causal mask as a tensor (the op record's ``causal_mask``: SDPA's
    ``attn_mask`` exactly the lower triangle): the kernels that take a mask compute every block
    of the score matrix, the half the mask hides too; ``is_causal=True`` says the same and lets
    them skip it. Priced by scaling the fused attention kernels: the calls with such a mask, by
    their share of the attention work, at the timed ratio (``attention_causal_mask``: the same
    call with the mask tensor and with is_causal, at the program's shapes) or at
    CAUSAL_MASK_GAIN."""
    shapes = ctx.replacements.recorded("sdpa")
    masked = [s for s in shapes if s.get("mask") == "causal_mask"]
    fused = list(names[matches(names, FLASH_RE)])
    if not masked or not fused:
        return []

    def work(s: dict) -> float:
        flops = flash_attention_work(int(s["batch"]), int(s["sq"]), int(s["sk"]), int(s["d"]), int(s["dv"]),
                                     s.get("mask") == "causal", False)[0]
        return flops * max(int(s.get("count", 1)), 1) * (1 + FLASH_BACKWARD_FLOPS * bool(s.get("grad")))
    share = sum(map(work, masked)) / max(sum(map(work, shapes)), 1.0)
    timed = ctx.replacements.measured("attention_causal_mask")
    if timed:
        gain = (sum(e.original_ns * e.count for e in timed) / sum(e.replacement_ns * e.count for e in timed))
        said = timed_text(timed, "is_causal=True vs the mask tensor, ")
    else:
        gain, said = CAUSAL_MASK_GAIN, f"{ESTIMATED}: the hidden half skipped (half the FLOPs)"
    if gain <= 1.0:
        return []
    op_gain = 1.0 / (1.0 - share + share / gain)
    total = float(ctx.kernels.loc[fused, "total_ns"].sum())
    calls = sum(int(s.get("count", 1)) for s in masked)
    g, basis = ctx.price_ops(ctx.acts_named(fused), op_gain,
                             f"fused attention {ctx.per_iteration(total)} / {op_gain:.2f}", cap=op_gain)
    ev = {"fused_attention_ns": int(total), "causal_mask_calls": calls, "causal_mask_share": round(share, 3),
          "causal_mask_gain": round(gain, 3), "priced_from": "timed" if timed else "estimate"}
    return [Finding(RULE.code, RULE.name,
                    f"scaled_dot_product_attention gets its causal mask as a tensor ({calls} calls an "
                    "iteration): pass is_causal=True instead of attn_mask, so that its kernels skip the "
                    "hidden half of the scores", Rung.LIBRARY, ev, g, f"{said}; {basis}", g, op_gain,
                    Scope.OPS, frozenset(fused))]


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    names = k.index.to_series()
    if matches(names, FLASH_RE).any():
        # already fused: only its precision or a causal mask given as a tensor can be wrong
        return _fp32_flash(ctx, names) + _causal_mask(ctx, names)
    if not matches(names, GEMM_RE).any():
        return []
    soft = k[(matches(names, SOFTMAX_RE) & ~matches(names, LOG_RE)
              & ~names.str.contains(r"^triton_|_softmax_kernel$|softmax_reg_kernel", regex=True)).to_numpy()]
    total = float(soft["total_ns"].sum())
    if soft.empty:
        return []
    glue, after, a, spans = _attentions(ctx, set(soft.index))
    dur = a["dur"].to_numpy(np.float64)
    # What the fix replaces is each attention whole, its GEMMs with the glue: their share, not
    # the softmax's alone, decides (a UNet's attentions: the softmax 1% of the GPU time, the
    # attentions around it more)
    inside = glue.copy()   # each attention's kernels once (its glue lies inside its span)
    for lo, hi, _ in spans:
        inside[lo:hi + 1] = True
    attn_ns = float(dur[inside].sum())
    if max(attn_ns, total) < RULE.param("min_gpu_share") * float(k["total_ns"].sum()):
        return []
    saved = float(dur[glue].sum())
    # The CPU's side: the removed launches (the glue, and one of each GEMM pair) and the short
    # host gaps before them, as PK403 counts them; on a host-bound step this is what shortens it.
    removed = glue | after
    cpu_removed = removed_launch_cost(a, removed, RULE.param("dispatch_gap_us") * 1e3)
    per = max(ctx.iterations, 1)
    ev = {"softmax_kernel_ns": int(total), "glue_kernel_ns": int(saved),
          "removed_launches": int(removed.sum()), "cpu_removed_ns": int(cpu_removed)}
    shaped = _priced_by_shape(ctx, a, spans)
    if shaped is not None:
        rows, group, new_ns, said, what, more = shaped
        op_gain = float(rows["dur"].sum()) / max(float(new_ns.sum()), 1.0)
        g, basis = ctx.price_fusion(rows, group, new_ns, what, cap=op_gain)
        ev.update(more)
    else:
        gemm_ns = float(dur[after].sum()) * 2.0  # the GEMM pairs around the glue stay (as one kernel)
        op_gain = (saved + gemm_ns) / gemm_ns if gemm_ns else None
        said = (f"{ESTIMATED} and no shapes (capture with profkit capture, or --aten): the GEMMs kept, "
                "a floor")
        g, basis = ctx.price_ops(a[glue | after].iloc[np.flatnonzero(glue[glue | after])], float("inf"),
                                 f"softmax and the kernels between each attention's GEMMs "
                                 f"{ctx.per_iteration(saved)} removed with their launches", True, cap=op_gain)
        ev["priced_from"] = "glue_only"
    return [Finding(RULE.code, RULE.name,
                    "attention on the math path (GEMM + softmax + GEMM): use "
                    "torch.nn.functional.scaled_dot_product_attention in bf16 with the flash / cuDNN "
                    "backend", Rung.LIBRARY, ev, g,
                    f"{said}; {int(removed.sum()) / per:.0f} launches per iteration with their dispatch "
                    f"{ctx.per_iteration(cpu_removed)}; {basis}", g, op_gain,
                    Scope.OPS, frozenset(soft.index))]
