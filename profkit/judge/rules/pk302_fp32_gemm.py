"""PK302 fp32-gemm: real fp32 GEMMs run on the CUDA cores instead of the tensor cores.

What
    GEMM kernels whose names say fp32 in and fp32 math (``sgemm``, ``xmma_gemm_f32f32``, nvjet
    ``sss``), not TF32 and not bf16/fp16.
Why
    On an H200 fp32 FFMA peaks near 67 TFLOP/s; TF32 tensor cores near 495 and bf16 near 989.
    ``torch.backends.cuda.matmul.allow_tf32`` is off by default, so fp32 models run on FFMA.
Evidence
    The kernel's element type from its name (profkit.judge.dtypes). bf16/fp16/TF32 GEMMs never fire
    it, nor does fused attention in fp32 (``fmha_cutlassF_f32``): TF32 leaves it as it is (measured
    on the H200: BERT-base 3.0 -> 2.6 ms an iteration, GPT-2 7.6 -> 7.4 ms, while their GEMMs ran
    4-9x faster); PK301 prices it in bf16.
Fix
    ``torch.set_float32_matmul_precision("high")`` (TF32), or autocast / bf16 weights.
Expected gain
    Graph edits, replayed by the step model. TF32 is a math mode: the GEMMs read the same fp32
    operands and nothing is cast, and a library GEMM reaches about the same share of the TF32
    roof as it did of the fp32 one (measured on the H200: BERT-base's GEMMs at 65% of the fp32
    roof and 69% of the TF32 one, 7.8x faster; ViT-B/16's at 68% of the fp32 roof), so the fp32
    GEMM kernels shrink by TF32 peak / fp32 peak (7.4x with the H200's datasheet peaks). A GEMM
    whose M, K or N is not a multiple of 4 (16 bytes) is the exception: TF32 then runs a
    1-element-aligned tensor-core kernel, and bf16 (multiple of 8) likewise. A ``--aten`` capture
    holds the shapes (``classify --shapes-from`` lends them to a plain capture of the same
    program): the kernels of those GEMMs shrink by ``unaligned_tf32_gain`` (bf16:
    ``unaligned_bf16_gain``) instead (measured on the H200, GPT-2's LM head over its 50,257-word
    vocabulary, forward and both gradients: scripts/bench/bench_gemm_precision.py; in the training
    step its three GEMMs ran 2.39x faster in TF32, the model's other GEMMs 5.2x). Without shapes
    every fp32 GEMM is taken as aligned, and an unaligned one is over-promised (GPT-2 training:
    2.67x priced without shapes, 2.31x with them, 2.17x measured; the pair is not a test). bf16 autocast
    is priced with the GEMMs at ``bf16_share`` of the bf16 roof, the casts of their operands
    that autocast adds counted with them (their sizes need shapes the trace does not hold:
    measured GEMMs and casts together, bf16 against fp32, 8.0x for ViT-B/16 and 10.6x for
    BERT-base, against 10.3x priced), fp32 fused attention at half its time (with the op record's
    SDPA shapes, at flash attention's FLOPs and bytes in bf16 as PK301 prices them: a BERT-base
    encoder over 512 tokens, padded_encoder_infer, measured 6.83x in bf16 where half the
    attention's time priced 4.84x; its shapes give 6.7x), and the CPU that
    autocast adds: the casts of each GEMM's operands, ``cast_cpu_us`` a GEMM kernel added to its
    launch (measured without a profiler on the H200: BERT-base inference 194 more launches an
    iteration for 74 GEMMs, GPT-2 training 342 for 155, about 16 us each): a GPU-bound fp32 step
    can become host-bound in bf16 (both did, at 11.6 and 42 ms). The figure was 37 us, from
    GPT-2's launches alone; on the corpus's bf16 pairs of 19 programs (PK302's and PK305's,
    timed by hand) it priced bf16 low on 13, by 7% in the median and by 10-17% on GPT-2 training
    itself, a Transformer translator, a diffusion UNet and a WGAN. At 30 us the median is 5% low
    and the median miss 6.6% (7.3% before); 25 us centred them (2% low, the median miss 5%) but
    priced T5-small's bf16, measured 0.98x, at 1.11x: a promise a fix that measured under 1.05x
    must not get. The larger misses left are priced high: ResNeXt-50 and DenseNet-121 training
    and BERT inference, by 10-12%.
    cuBLAS's GEMV kernels (a matmul with one side a vector: a scan's read-out token by token)
    are charged their casts too, their own time kept (memory-bound: the casts' writes spend what
    their halved reads save; a Mamba-style scan's 512 GEMVs an iteration, an H100, priced bf16 at 0.99x
    uncharged, 0.73x charged, measured 0.79x); not in a step that runs a backward, whose GEMVs
    autocast does not cast and whose names do not tell from the forward's.
    A kernel's cast is an average: autocast casts a weight once per region and a forward op's
    operands, not its backward kernels, so a step with more backward kernels per forward op
    (a double backward) is charged more than it pays. In the evidence as
    ``bf16_speedup``; the finding leads with TF32, the one-line change, and names bf16 when it
    is the larger one, or warns against it when the model finds the step slower in bf16
    (T5-small fine-tuning, partly host-bound: priced 0.96x, measured 0.78-0.98x).
    Not in a recurrent cell loop (PK106's cells, from an iteration's first to its last): autocast
    caches the cast of each weight for the region and the cells' state is bf16 once they run in
    it, so those GEMMs add no cast a step (``bf16_recurrent_gemms_uncast``: their kernels per
    iteration; a GRU forecaster's 476 GEMM kernels an iteration, each charged a cast, priced bf16
    at 0.32x where it measured 1.02x, and 0.98x without).
    **Timed at capture** (``profkit capture`` records the program's GEMM shapes in its calibration
    run and times each fp32 one in full fp32, in TF32 and with bf16 operands, PROFKIT_META
    ``replacements``): the fp32 GEMM kernels shrink by the measured ratio instead (over the
    shapes timed, weighted by their calls: alignment is in it), TF32's and bf16's apart; the
    action says "replacement timed at the program's shapes: X us vs Y us". Without it the peaks'
    ratios above are the estimate, said as "estimated: no replacement timed at capture" (the bf16
    casts' CPU is priced the same either way: the timing runs the GEMM alone).
Trial
    ``profkit capture --try tf32`` measures the finding's price: the program run with
    ``torch.set_float32_matmul_precision("high")`` (and cuDNN's convolutions in TF32), every
    matmul of it, the GEMMs the trace shows and any the trace does not (a library's, a compiled
    region's). ``--try bf16`` measures ``bf16_speedup``: autocast bf16 around the outermost
    module's call only (the loss outside it stays fp32, as in the usual training loop), so a
    program that autocasts more or keeps bf16 weights can gain more. ``--try auto`` runs both.
References
    PyTorch docs "TensorFloat-32 (TF32) on Ampere (and later) devices"; NVIDIA H200 datasheet.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.judge.dtypes import kernel_dtype
from profkit.judge.flops import gemm_mkn
from profkit.judge.patterns import FLASH_RE
from profkit.run.replacements import backward_launched
from profkit.run.step.transform import add_cpu, scale_ops
from profkit.model import GEMM_ALIGN, Rung
from profkit.judge.rules.base import (ESTIMATED, GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Scope,
                                      Table, TrialOf, matches, timed_text)

RULE = RuleMeta(
    code="PK302", name="fp32-gemm",
    summary="fp32 GEMMs on the CUDA cores: allow TF32 or run them in bf16",
    tables=(Table.KERNEL,), example="traces/probe_h200_addnorm_gemm.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    trials=(TrialOf("tf32"), TrialOf("bf16", "bf16_speedup")),
    params=(Param("min_gpu_share", 0.02, "fp32 GEMMs' share of the window's GPU time"),
            Param("bf16_share", 0.70, "share of the bf16 roof the GEMMs reach with the casts autocast "
                                      "adds to them counted in"),
            Param("cast_cpu_us", 30.0, "CPU time (without a profiler) autocast adds a GEMM kernel: "
                                       "the dispatch and launch of its operands' casts (fitted on the "
                                       "corpus's bf16 pairs)"),
            Param("unaligned_tf32_gain", 2.4, "what TF32 makes of an fp32 GEMM whose M, K or N is not "
                                              "a multiple of 4 (shapes from --aten)"),
            Param("unaligned_bf16_gain", 2.3, "what bf16 makes of an fp32 GEMM whose M, K or N is not "
                                              "a multiple of 8 (shapes from --aten)")))

CONV_RE = re.compile(r"conv|fprop|dgrad|wgrad", re.I)
GEMV_RE = re.compile(r"gemv", re.I)


def cast_cpu_ns(ctx: RuleContext) -> float:
    """``cast_cpu_us`` (measured without a profiler) in the trace's CPU time, where the step model
    scales it back by the calibrated CPU scale."""
    return RULE.param("cast_cpu_us") * 1e3 / max(ctx.host, 1e-9)


def recurrent_gemms(g) -> np.ndarray:
    """The graph's operations launched inside a recurrent cell loop (PK106's cell kernels: from
    each iteration's first cell kernel's launch to its last, on that thread): the cells'
    projections and what runs between their steps."""
    from profkit.judge.rules.pk106_rnn_cell_loop import cell_kernels, loop_calls
    cell_ops = cell_kernels(g)
    if len(cell_ops) < 2:
        return np.empty(0, np.int64)
    return g.launched_by(loop_calls(g, cell_ops))


def bf16_gemm_gain(peaks: dict) -> float:
    """What bf16 autocast makes of an fp32 GEMM on the CUDA cores: ``bf16_share`` of the bf16
    roof over the fp32 one, never less than TF32's gain (the tensor-core roof the trace shows
    when it has no fp32 one)."""
    fp32 = peaks.get("fp32", peaks["tf32"])
    return max(1.0, peaks["tf32"] / fp32, RULE.param("bf16_share") * peaks["bf16"] / fp32)


# fp32 fused attention in bf16 without its shapes: half its time (its bytes halve)
ATTENTION_BF16_GAIN = 2.0


def attention_bf16_gain(ctx: RuleContext, fp32_ns: float) -> float:
    """How many times faster the fp32 fused attention (``fmha_cutlassF_f32``: its GEMMs on the
    CUDA cores) runs in bf16: from the op record's SDPA shapes (profkit.capture.oprecord ``sdpa``),
    its per-iteration time ``fp32_ns`` over flash attention's FLOPs at the share of the bf16 roof
    flash reached in a measured capture and its bytes at the memory bandwidth (PK301's estimate),
    never below the bytes' gain; without the shapes, ATTENTION_BF16_GAIN. A BERT-base encoder over
    512 tokens spends 10.5 ms an iteration in it: half its time would leave 5.2 ms, its FLOPs in
    bf16 take 1.2."""
    shapes = [s for s in ctx.replacements.recorded("sdpa") if s.get("dtype") == "fp32"]
    if not shapes or fp32_ns <= 0:
        return ATTENTION_BF16_GAIN
    from profkit.judge.rules.pk301_attention_path import FLASH_ROOF_SHARE, flash_ns
    est = 0.0
    for s in shapes:
        n = int(s.get("count", 1))
        est += n * flash_ns(ctx, s, False, "bf16", FLASH_ROOF_SHARE)
        if s.get("grad"):
            est += n * flash_ns(ctx, s, True, "bf16", FLASH_ROOF_SHARE)
    return max(fp32_ns / est, ATTENTION_BF16_GAIN) if est > 0 else ATTENTION_BF16_GAIN


def unaligned(ctx: RuleContext, rows, multiple: int):
    """The rows of ``rows`` (GEMM kernels) launched by an aten GEMM whose M, K or N is not a
    multiple of ``multiple`` elements; none without ``--aten`` shapes."""
    bad = [ix for op, ix in ctx.aten_acts.items()
           if (mkn := gemm_mkn(op)) is not None and any(d % multiple for d in mkn)]
    if not bad:
        return rows.iloc[:0]
    return rows[rows.index.isin(np.concatenate(bad))]


def timed_gain(ctx: RuleContext, kind: str) -> tuple[float | None, str]:
    """(the fp32 GEMMs' gain timed at the program's shapes for ``kind`` (gemm_tf32, gemm_bf16):
    Replacements.gemm_gain, the aligned and unaligned shapes each by its share of the FLOPs; the
    words that say so), or (None, the estimate's words)."""
    ratio = ctx.replacements.gemm_gain(kind)
    if ratio is None:
        return None, ESTIMATED
    timed = ctx.replacements.measured(kind)
    name = "TF32" if kind == "gemm_tf32" else "bf16"
    return max(ratio, 1.0), timed_text(timed, f"{name} vs fp32 GEMMs, ")


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    peaks = ctx.prof.peaks.flops
    if "fp32" not in peaks or "tf32" not in peaks:
        return []
    names = k.index.to_series()
    fp32 = [n for n in names[matches(names, GEMM_KERNEL_RE) & ~matches(names, CONV_RE) & ~matches(names, FLASH_RE)]
            if kernel_dtype(n).precision == "fp32"]
    attn = [n for n in names[matches(names, FLASH_RE)] if kernel_dtype(n).precision == "fp32"]
    if not fp32:
        return []
    rows = k.loc[fp32]
    total = float(rows["total_ns"].sum())
    if total < RULE.param("min_gpu_share") * float(k["total_ns"].sum()):
        return []
    op_gain = max(1.0, peaks["tf32"] / peaks["fp32"])
    acts = ctx.acts_named(fp32)
    # The GEMMs whose shapes keep them off the aligned tensor-core kernels (a --aten capture)
    odd_tf32 = unaligned(ctx, acts, GEMM_ALIGN["tf32"])
    odd_gain = min(op_gain, RULE.param("unaligned_tf32_gain"))
    ops_all, ops_odd = ctx.graph_ops(acts), ctx.graph_ops(odd_tf32)
    ops_even = np.setdiff1d(ops_all, ops_odd)
    tf32_timed, said = timed_gain(ctx, "gemm_tf32")
    ev = {"fp32_gemm_ns": int(total), "kernels": len(fp32)}
    pad = ""
    if tf32_timed is not None:
        # Timed at the program's shapes: the alignment is in the measured ratio already.
        op_gain = odd_gain = tf32_timed
        ev["tf32_timed_gain"] = round(tf32_timed, 3)
    what = f"fp32 GEMMs {ctx.per_iteration(total)} / {op_gain:.1f}"
    if len(odd_tf32) and tf32_timed is None:
        ev["unaligned_gemm_ns"] = int(odd_tf32["dur"].sum())
        what += (f", the {ctx.per_iteration(float(ev['unaligned_gemm_ns']))} of those with a "
                 f"dimension not a multiple of 4 / {odd_gain:.1f}")
        pad = (f"; the GEMMs with a dimension that is not a multiple of 4 "
               f"({ev['unaligned_gemm_ns'] / total:.0%} of their time) gain less: pad it (PK304)")
    g, basis = ctx.price(lambda gr: scale_ops(scale_ops(gr, ops_even, op_gain), ops_odd, odd_gain),
                         what, cap=op_gain)
    action = ("fp32 GEMMs on the CUDA cores: torch.set_float32_matmul_precision(\"high\") (TF32) "
              "or run them in bf16 (autocast)")
    if "bf16" in peaks and ctx.model is not None:
        # The elementwise ops' bytes, which autocast halves where they run on bf16 activations,
        # are left as they are: the trace of an fp32 run cannot say which do.
        bf_gain = bf16_gemm_gain(peaks)
        bf_odd = ctx.graph_ops(unaligned(ctx, acts, GEMM_ALIGN["bf16"]))
        bf_even = np.setdiff1d(ops_all, bf_odd)
        odd_bf = min(bf_gain, RULE.param("unaligned_bf16_gain"))
        bf_timed, _ = timed_gain(ctx, "gemm_bf16")
        if bf_timed is not None:
            bf_gain = odd_bf = bf_timed
            ev["bf16_timed_gain"] = round(bf_timed, 3)
        attn_ops = ctx.graph_ops(ctx.acts_named(attn))
        cast_ns = cast_cpu_ns(ctx)
        attn_ns = float(k.loc[attn, "total_ns"].sum()) / max(ctx.iterations, 1) if attn else 0.0
        attn_gain = attention_bf16_gain(ctx, attn_ns)
        if attn and attn_gain != ATTENTION_BF16_GAIN:
            ev["bf16_attention_gain"] = round(attn_gain, 2)

        # A recurrent cell loop's GEMMs cast nothing a step: autocast caches its weights' casts
        # for the region, and the state the cells produce is already bf16 (a GRU forecaster's
        # 476 GEMM kernels an iteration priced 0.32x with a cast each, measured 1.02x)
        recurrent = recurrent_gemms(ctx.model.graph)
        cast_ops = np.setdiff1d(ops_all, recurrent)
        if len(cast_ops) < len(ops_all):
            ev["bf16_recurrent_gemms_uncast"] = round((len(ops_all) - len(cast_ops)) / max(ctx.iterations, 1), 1)
        # A matmul cuBLAS runs as a GEMV (a batched matrix-vector product: a scan's read-out
        # token by token) is cast by autocast all the same: its operands' casts cost the CPU as
        # a GEMM's do, while its kernel, memory-bound, gains little (the casts' writes spend
        # what its halved reads save): a Mamba-style scan's 512 GEMVs an iteration, uncounted,
        # priced bf16 at 0.99x where it measured 0.79x
        # (a training step's are left out: its backward GEMVs, which autocast does not cast,
        # cannot be told from the forward's by their names)
        gemv = [n for n in names[matches(names, GEMV_RE)] if kernel_dtype(n).precision == "fp32"]
        if gemv and not backward_launched(ctx.prof.full_trace):
            gemv_ops = np.setdiff1d(ctx.graph_ops(ctx.acts_named(gemv)), recurrent)
            if len(gemv_ops):
                ev["bf16_gemv_casts_per_iteration"] = round(len(gemv_ops) / max(ctx.iterations, 1), 1)
                cast_ops = np.union1d(cast_ops, gemv_ops)

        def bf16(gr):
            gr = scale_ops(scale_ops(gr, bf_even, bf_gain), bf_odd, odd_bf)
            return add_cpu(scale_ops(gr, attn_ops, attn_gain), cast_ops, cast_ns)
        bf, _ = ctx.price(bf16, "", cap=bf_gain, slower=True)
        ev["bf16_speedup"] = round(bf, 3)
        if bf > g * 1.05:
            action += f" [bf16: {bf:.2f}x end to end]"
        elif bf < 1 / 1.02:
            # Autocast's casts cost the CPU more than the faster GEMMs save: a step the CPU
            # paces, or one it would pace in bf16, runs slower.
            action = ("fp32 GEMMs on the CUDA cores: torch.set_float32_matmul_precision(\"high\") "
                      f"(TF32); not bf16 autocast here: its casts add more CPU time than the GEMMs "
                      f"save [bf16: {bf:.2f}x end to end]")
    ev["priced_from"] = "estimate" if tf32_timed is None else "timed"
    ratio_text = (f"TF32 / fp32 peak = {op_gain:.1f}" if tf32_timed is None else
                  f"TF32 / fp32 timed = {op_gain:.1f}")
    return [Finding(RULE.code, RULE.name, action + pad, Rung.LIBRARY, ev, g,
                    f"{said}; {ratio_text}; {basis}", g,
                    op_gain, Scope.OPS, frozenset(fp32))]
