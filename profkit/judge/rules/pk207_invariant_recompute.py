"""PK207 invariant-recompute: every iteration recomputes tensors from weights that never change.

What
    The op record of the capture (``profkit capture``'s calibration run, one iteration watched,
    no profiler) holds ops whose every input is a parameter or buffer of the program's modules
    that nothing writes, or the output of such an op (``invariant``, profkit.capture.invariant):
    int8 weights dequantized at every call (``q.to(bf16) * scale``), a weight normalisation left on
    at inference (``parametrizations.weight_norm``), a frozen fp32 weight cast to bf16 at every
    step. Their kernels take ``min_share`` of the iteration or more.
Why
    Each such op gives the same tensor every iteration: its kernels (weight-sized reads and
    writes) and its launches are work the step could do once. In a dequantization the weight
    crosses HBM three times more (the int8 read, the cast's write and read, the scaling's write)
    before the GEMM reads it.
Evidence
    The record's ``invariant`` entries (op, input and output element types, size, count per
    iteration, and the time between CUDA events around them in the watched iteration: their
    kernels' time where the GPU was busy, their launches too where it waited for them) and, in the
    trace, the kernels they launched: per iteration, the longest kernels of each op's kind (a copy
    kernel for a cast, the multiply's for a scaling, the weight-norm kernel), as many as the
    record counts. The kernels' names do not say which of a kind's kernels took a weight (an
    activation's multiply is the same kernel); the longest are taken, weights being the largest
    tensors of an inference step. The events' time is shown beside the kernels' trace time.
Fix
    Compute the tensors once, before the loop: dequantize once and keep the 16-bit weights (twice
    the int8 memory), or keep int8 and use a GEMM that reads it (``torch._weight_int8pack_mm``,
    torchao's ``int8_weight_only``); remove the weight normalisation at inference
    (``torch.nn.utils.parametrize.remove_parametrizations(m, "weight")``); cast a frozen model
    once (``model.to(torch.bfloat16)``).
Expected gain
    Graph edit (``scale_ops`` at infinity with their launches): the selected kernels and their
    launch calls gone, replayed at the calibrated CPU scale. The Python around the ops (a
    parametrization's module call) is not in it: on a host-bound step the price is low by that
    (a HiFi-GAN-shaped vocoder with 42 weight-normalised convolutions, an H100: 1.28x, folding the
    weight norm measured 1.41x). An int8 LM whose 40 linear layers are dequantized at every call,
    its capture's record finding them (an H100): 2.24x, dequantizing once measured 2.31x.
References
    PyTorch ``torch.nn.utils.parametrize`` (``cached()``, ``remove_parametrizations``);
    torchao quantization (weight-only int8).
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Table
from profkit.run.step.transform import scale_ops

RULE = RuleMeta(
    code="PK207", name="invariant-recompute",
    summary="every iteration recomputes tensors from weights that never change: compute them once",
    tables=(Table.KERNEL,),
    example="traces/corpus/vocoder_weightnorm_infer.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_share", 0.03, "the invariant ops' kernels, as a share of the modelled iteration"),))

COPY_RE = re.compile(r"copy_kernel", re.I)
# aten op -> the kernels it launches, as their names say
KERNELS: dict[str, re.Pattern] = {
    "to": COPY_RE, "_to_copy": COPY_RE, "copy_": COPY_RE, "clone": COPY_RE, "contiguous": COPY_RE,
    "mul": re.compile(r"Mul", re.I), "div": re.compile(r"Div", re.I),
    "add": re.compile(r"add", re.I), "sub": re.compile(r"sub|add", re.I),
    "_weight_norm_interface": re.compile(r"weight_norm", re.I), "_weight_norm": re.compile(r"weight_norm", re.I),
    "linalg_vector_norm": re.compile(r"norm|reduce", re.I), "norm": re.compile(r"norm|reduce", re.I),
    "mm": GEMM_KERNEL_RE, "addmm": GEMM_KERNEL_RE, "matmul": GEMM_KERNEL_RE, "linear": GEMM_KERNEL_RE,
}
LOW_BITS = {"int8", "uint8", "float8_e4m3fn", "float8_e5m2", "int4", "quint8", "qint8"}


def _entries(ctx: RuleContext) -> list[dict]:
    return [o for o in ctx.replacements.recorded("invariant")
            if isinstance(o.get("op"), str) and all(isinstance(o.get(k), (int, float)) and o[k] >= 0
                                                     for k in ("count", "bytes"))]


def _what(ops: list[dict]) -> str:
    names = {o["op"] for o in ops}
    sources = {o.get("from") for o in ops if o["op"] in ("to", "_to_copy", "copy_")}
    if sources & LOW_BITS:
        return ("the weights are dequantized at every call: dequantize once and keep the 16-bit weights "
                "(twice the int8 memory), or keep int8 and use a GEMM that reads it "
                "(torch._weight_int8pack_mm, torchao int8_weight_only)")
    if names & {"_weight_norm_interface", "_weight_norm"}:
        return ("a weight normalisation is recomputed at every call: remove it at inference "
                "(torch.nn.utils.parametrize.remove_parametrizations(module, \"weight\"), or run the "
                "calls under parametrize.cached())")
    if sources:
        return "weights that never change are cast at every call: cast them once (module.to(dtype))"
    return "compute these tensors once, before the loop, and keep them"


def _select(g, ops: list[dict]) -> tuple[np.ndarray, int, int]:
    """(the graph's operations the invariant ops launched, as many per iteration as the record
    counts and of their kinds, longest first; how many the record counts an iteration; how many
    were found an iteration, the least over the iterations)."""
    want: dict[re.Pattern, int] = {}
    for o in ops:
        pat = KERNELS.get(o["op"])
        if pat is not None:
            want[pat] = want.get(pat, 0) + int(o["count"])
    # per kind, whether each of the graph's kernel names is one (each name matched once)
    named = {pat: np.array([bool(pat.search(str(n))) for n in g.op_names], dtype=bool) for pat in want}
    chosen: list[np.ndarray] = []
    found = None
    for lo, hi in zip(g.iter_call[:-1], g.iter_call[1:]):
        inside = np.flatnonzero((g.g_call >= lo) & (g.g_call < hi))
        taken = np.zeros(0, np.int64)
        for pat, n in want.items():
            hit = np.setdiff1d(inside[named[pat][g.g_name[inside]]], taken)
            taken = np.concatenate([taken, hit[np.argsort(-g.g_dur[hit], kind="stable")[:n]]])
        chosen.append(taken)
        found = len(taken) if found is None else min(found, len(taken))
    return (np.unique(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64),
            sum(want.values()), found or 0)


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    ops = _entries(ctx)
    if m is None or not ops:
        return []
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    picked, counted, found = _select(g, ops)
    if not len(picked) or found < counted / 2:
        return []   # the trace does not show the kernels the record counts: not priced
    gpu_ns = float(g.g_dur[picked].sum()) / its
    if gpu_ns < RULE.param("min_share") * m.iteration_ns:
        return []
    timed = [o for o in ops if o.get("timed")]
    measured = (float(sum(o.get("gpu_ns", 0) for o in timed))
                if timed and sum(o["timed"] for o in timed) == sum(o["count"] for o in timed) else None)
    top = sorted(ops, key=lambda o: -o["bytes"])[:4]
    kinds: dict[str, int] = {}
    for o in sorted(ops, key=lambda o: -o["bytes"]):
        k = f"{o['op']} {o.get('from', '?')}->{o['dtype']}"
        kinds[k] = kinds.get(k, 0) + int(o["count"])
    named = ", ".join(f"{k} x{n}" for k, n in list(kinds.items())[:4])
    gain, basis = ctx.price(lambda gr: scale_ops(gr, picked, np.inf, drop_launches=True),
                            f"{found} of the {counted} invariant ops' kernels an iteration ({gpu_ns / 1e6:.2f} ms "
                            "in the trace" + (f"; {measured / 1e6:.2f} ms between CUDA events around them in the "
                                              "calibration run, their launches included where the GPU waited "
                                              "for them" if measured else "") + ") and their launches gone")
    ev = {"invariant_ops_per_iteration": counted, "kernels_found_per_iteration": found,
          "kernel_ns_per_iteration": int(gpu_ns), "timed_gpu_ns_per_iteration": measured,
          "bytes_per_iteration": int(sum(o["bytes"] for o in ops)),
          "ops": [{k: o.get(k) for k in ("op", "from", "dtype", "numel", "count")} for o in top]}
    return [Finding(RULE.code, RULE.name,
                    f"every iteration recomputes tensors from weights that never change ({counted} ops: "
                    f"{named}; {gpu_ns / 1e6:.2f} ms of kernels an iteration): {_what(ops)}",
                    Rung.LIBRARY, ev, gain, basis, gain)]
