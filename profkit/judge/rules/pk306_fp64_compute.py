"""PK306 fp64-compute: the model runs in float64, where float32 (with TF32) or bf16 would do.

What
    Kernels whose names say float64: GEMMs (``dgemm``, ``xmma_gemm_f64f64``, CUTLASS ``d884gemm``,
    nvjet ``d``) and the elementwise, reduction and optimizer kernels on ``double``, together
    ``min_gpu_share`` of the window's GPU time or more. A model ``.double()``'d, or built after
    ``torch.set_default_dtype(torch.float64)``, as code ported from NumPy or SciPy often is.
Why
    Neither switch that speeds up float32 reaches float64: TF32 is a math mode for float32
    matmuls, and autocast leaves float64 tensors as they are (a bf16 autocast of a float64 model
    changes nothing). The GEMMs run on the FP64 tensor cores (67 TFLOP/s on an H100 or H200 SXM,
    about the CUDA cores' float32 rate and a seventh of TF32's), and every other kernel moves
    twice the bytes of float32.
Evidence
    The float64 kernels' time per iteration, GEMMs and the rest apart (``fp64_gemm_ns``,
    ``fp64_other_ns``), from their names (profkit.judge.dtypes).
Fix
    The model and its inputs in float32 (``model.float()``, the data ``.float()``), then TF32
    (``torch.set_float32_matmul_precision("high")``) or bf16 autocast. Keep float64 where the
    numbers need it (an ill-conditioned solve, an accumulation over millions of terms): in a loss or
    a metric, not in the network's layers.
Expected gain
    Graph edits, replayed by the step model: the float64 GEMM kernels shrink by the ratio of the
    new roof to the FP64 one (a library GEMM reaches about the same share of each, as PK302
    measured for TF32 against float32), the other float64 kernels by 2 (their bytes halve).
    Float32 with TF32 is the action's number; float32 alone (``fp32_speedup``: the GEMMs at the
    float32 roof, on an H100 about the FP64 tensor cores' rate, so mostly the halved bytes) and
    float32 with bf16 autocast (``bf16_speedup``: the GEMMs at ``bf16_share`` of the bf16 roof,
    each with the CPU of its operands' casts, as PK302 prices it) are in the evidence.
    **Timed at capture** (``profkit capture`` times each recorded float64 GEMM shape in float64
    against float32, TF32 and bf16 operands, PROFKIT_META ``replacements`` kinds
    ``gemm_fp64_fp32``, ``gemm_fp64_tf32``, ``gemm_fp64_bf16``): the GEMMs shrink by the measured
    ratios instead of the peaks' (the shapes' calls and FLOPs weighing them as PK302's do), and
    the action says "replacement timed at the program's shapes"; without them (a capture before
    this timing, or a plain nsys trace), "estimated: no replacement timed at capture".
    A solver's own kernels (cuSOLVER's factorisation panels, triangular solves: ``SOLVER_RE``)
    are kept as they are: dependent short steps, not bytes (``fp64_solver_ns``). A GP's float64
    Cholesky fit on an H100 (w_gp_cholesky_train.py) was priced 2.58x at first sight, 1.19x
    without TF32, with them halved; float32 measured 1.02x by hand, and its fp32+tf32 trial 1.02x
    (the float64 GEMMs there run on the FP64 tensor cores, at the CUDA cores' float32 rate).
    A GEMM a solver launches inside its routine (the kernel before or after it on its stream a
    solver's own: a blocked trsm's or potrf's trailing updates) is cuBLAS's or cuSOLVER's, which
    neither TF32 nor autocast reaches: it is priced at the float32 / FP64 peak ratio
    (``fp64_solver_gemm_ns``; about 1 on an H100). The GP's TF32 price fell to 1.47x with both;
    its fp32+tf32 trial measured 1.02x, which the PyTorch matmuls that remain (its Cholesky
    backward's two 4096^3 products, 4.3 ms an iteration) do not explain: not resolved.
    An MLP of 6 x 1024 on 16,384 points a step, float64 on an H100, 14.5 ms: float32 with TF32
    measured 4.48x, float32 alone 1.24x, with bf16 4.76x (w_fp64_surrogate_train.py).
Trial
    ``profkit capture --try fp32+tf32`` measures the action: the outermost module's float64
    weights and buffers converted to float32 once, its float64 inputs at each call, its outputs
    returned as float64 (the loss and the metrics outside it keep their float64), TF32 on.
    ``--try fp32`` and ``--try fp32+bf16`` measure the evidence's two variants. ``--try auto``
    runs all three.
References
    PyTorch docs "TensorFloat-32 (TF32) on Ampere (and later) devices", "Automatic Mixed
    Precision" (ops eligible for autocast: float64 is not cast); NVIDIA H100 datasheet.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.judge.dtypes import kernel_dtype
from profkit.judge.rules.base import (ESTIMATED, FACTORISATION, GEMM_KERNEL_RE, Finding, Param, RuleContext,
                                      RuleMeta, Scope, Table, TrialOf, matches, timed_text)
from profkit.judge.rules.pk302_fp32_gemm import RULE as PK302
from profkit.judge.rules.pk302_fp32_gemm import cast_cpu_ns
from profkit.model import Rung
from profkit.run.step.transform import add_cpu, scale_ops

# cuSOLVER's and cuBLAS's factorisation and triangular-solve kernels (``getrf_wo_pivot``,
# ``trsm_left_kernel``, ``trsv_lt_exec``, potrf/geqrf/syevd/gesvd helpers, MAGMA's ``magma_``)
SOLVER_RE = re.compile(FACTORISATION + r"|trsm|trsv", re.I)


def solver_gemms(g, ops: np.ndarray) -> np.ndarray:
    """Per operation of ``ops`` (the step graph's GEMM kernels): whether the kernel before it or
    after it on its stream is a solver's own (SOLVER_RE): a GEMM inside a solver's routine."""
    is_solver = np.array([bool(SOLVER_RE.search(str(n))) for n in g.op_names] + [False], dtype=bool)
    solver_op = is_solver[g.g_name]
    prev = g.g_prev[ops]
    nxt = ops + 1
    ok = nxt < len(g.g_name)
    nxt = np.where(ok, nxt, 0)
    after = ok & (g.g_stream[nxt] == g.g_stream[ops]) & solver_op[nxt]
    return ((prev >= 0) & solver_op[np.maximum(prev, 0)]) | after


RULE = RuleMeta(
    code="PK306", name="fp64-compute",
    summary="the model computes in float64: float32 with TF32, or bf16, does it several times faster",
    tables=(Table.KERNEL,), example="traces/corpus/fp64_surrogate_train.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    trials=(TrialOf("fp32+tf32"), TrialOf("fp32", "fp32_speedup"), TrialOf("fp32+bf16", "bf16_speedup")),
    params=(Param("min_gpu_share", 0.05, "float64 kernels' share of the window's GPU time"),
            Param("bytes_gain", 2.0, "what float32 makes of a float64 kernel that is not a GEMM "
                                     "(half the bytes)")))


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    peaks = ctx.prof.peaks.flops
    if not len(k) or "fp64" not in peaks or "tf32" not in peaks:
        return []
    names = k.index.to_series()
    fp64 = [n for n in names if kernel_dtype(n).precision == "fp64"]
    if not fp64:
        return []
    is_gemm = matches(names.loc[fp64], GEMM_KERNEL_RE)
    is_solver = matches(names.loc[fp64], SOLVER_RE)
    gemm = [n for n, g in zip(fp64, is_gemm) if g]
    # A factorisation's panel steps and triangular solves wait on their own short dependent
    # updates, not on their bytes: float32 does not halve them (a GP's float64 Cholesky, 8.7 ms of
    # such kernels an iteration on an H100: priced at half, float32 measured 1.02x end to end)
    solver = [n for n, g, v in zip(fp64, is_gemm, is_solver) if v and not g]
    other = [n for n, g, v in zip(fp64, is_gemm, is_solver) if not g and not v]
    total = float(k.loc[fp64, "total_ns"].sum())
    if total < RULE.param("min_gpu_share") * float(k["total_ns"].sum()):
        return []
    fp32 = peaks.get("fp32", peaks["tf32"])
    tf32_gain = max(1.0, peaks["tf32"] / peaks["fp64"])
    fp32_gain = peak_fp32_gain = max(1.0, fp32 / peaks["fp64"])
    bf16_gain = max(tf32_gain, PK302.param("bf16_share") * peaks.get("bf16", peaks["tf32"]) / peaks["fp64"])
    timed = {kind: ctx.replacements.gemm_gain(f"gemm_fp64_{kind}") for kind in ("fp32", "tf32", "bf16")}
    said, ratio = ESTIMATED, "TF32 / FP64 peak"
    if timed["tf32"] is not None:
        # measured at the program's shapes: a ratio below 1 is a slower replacement, kept
        tf32_gain = timed["tf32"]
        fp32_gain = timed["fp32"] if timed["fp32"] is not None else fp32_gain
        bf16_gain = timed["bf16"] if timed["bf16"] is not None else bf16_gain
        said = timed_text(ctx.replacements.measured("gemm_fp64_tf32"), "TF32 vs float64 GEMMs, ")
        ratio = "TF32 / float64 timed"
    bytes_gain = RULE.param("bytes_gain")
    gemm_ops = ctx.graph_ops(ctx.acts_named(gemm)) if gemm else np.empty(0, np.int64)
    # A GEMM a solver runs inside its routine (a blocked triangular solve's or factorisation's
    # trailing updates, between its own kernels on the stream) is cuBLAS's or cuSOLVER's, not a
    # PyTorch matmul: TF32 and autocast do not reach it, and float32 runs it at the float32 rate
    # (an exact GP's Cholesky backward: 4.3 ms an iteration of PyTorch matmuls, 3.1 ms of GEMMs
    # between cuBLAS's trsm kernels)
    inner = solver_gemms(ctx.model.graph, gemm_ops) if ctx.model is not None and len(gemm_ops) else \
        np.zeros(len(gemm_ops), dtype=bool)
    gemm_ops, inner_ops = gemm_ops[~inner], gemm_ops[inner]
    other_ops = ctx.graph_ops(ctx.acts_named(other)) if other else np.empty(0, np.int64)
    gemm_ns = float(k.loc[gemm, "total_ns"].sum()) if gemm else 0.0
    solver_ns = float(k.loc[solver, "total_ns"].sum()) if solver else 0.0
    other_ns = total - gemm_ns - solver_ns
    # (the graph's durations: its modelled iterations, scaled to the window's as the rest are)
    inner_ns = gemm_ns * float(ctx.model.graph.g_dur[inner_ops].sum()) / max(
        float(ctx.model.graph.g_dur[np.r_[gemm_ops, inner_ops]].sum()), 1.0) if len(inner_ops) else 0.0
    gemm_ns -= inner_ns
    ev = {"fp64_gemm_ns": int(gemm_ns), "fp64_other_ns": int(other_ns), "kernels": len(fp64),
          **({"fp64_solver_ns": int(solver_ns)} if solver else {}),
          **({"fp64_solver_gemm_ns": int(inner_ns)} if len(inner_ops) else {}),
          "priced_from": "estimate" if said == ESTIMATED else "timed"}
    if said != ESTIMATED:
        ev.update({f"{k}_timed_gain": round(v, 3) for k, v in timed.items() if v is not None})

    def edit(gain: float, cast: bool = False):
        def apply(gr):
            gr = scale_ops(scale_ops(gr, gemm_ops, gain), other_ops, bytes_gain)
            if len(inner_ops):
                gr = scale_ops(gr, inner_ops, peak_fp32_gain)
            # bf16 autocast adds the casts of each GEMM's operands on the CPU (PK302's price)
            return add_cpu(gr, gemm_ops, cast_cpu_ns(ctx)) if cast else gr
        return apply

    what = (f"float64 GEMMs {ctx.per_iteration(gemm_ns)} / {tf32_gain:.1f} ({ratio}), "
            f"the other float64 kernels {ctx.per_iteration(other_ns)} / {bytes_gain:.0f}"
            + (f", the solvers' own kernels (factorisation panels, triangular solves) "
               f"{ctx.per_iteration(solver_ns)} kept" if solver else "")
            + (f", the GEMMs inside the solvers' routines {ctx.per_iteration(inner_ns)} / "
               f"{peak_fp32_gain:.1f} (float32 / FP64 peak: TF32 does not reach them)" if len(inner_ops) else ""))
    g, basis = ctx.price(edit(tf32_gain), what, cap=max(tf32_gain, bytes_gain))
    f32, _ = ctx.price(edit(fp32_gain), "", cap=max(fp32_gain, bytes_gain), slower=True)
    bf, _ = ctx.price(edit(bf16_gain, cast=True), "", cap=max(bf16_gain, bytes_gain), slower=True)
    ev.update(fp32_speedup=round(f32, 3), bf16_speedup=round(bf, 3))
    action = ("the model computes in float64 (TF32 and autocast do not reach it): model and inputs in "
              "float32 (model.float()) with torch.set_float32_matmul_precision(\"high\")")
    if bf > g * 1.05:
        action += f" [bf16 autocast on float32: {bf:.2f}x end to end]"
    action += f" [float32 without TF32: {f32:.2f}x]"
    return [Finding(RULE.code, RULE.name, action, Rung.LIBRARY, ev, g,
                    f"{said}; {ratio} = {tf32_gain:.1f}; {basis}", g,
                    max(tf32_gain, bytes_gain), Scope.OPS, frozenset(fp64))]
