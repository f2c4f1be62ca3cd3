"""PK201 unfused-optimizer: a foreach Adam/AdamW/SGD step makes many passes over the weights.

What
    The optimizer step runs as PyTorch's ``foreach`` implementation: one ``multi_tensor_apply``
    kernel per elementwise operation of the update (lerp, mul, addcmul, sqrt, div, add, addcdiv),
    each reading and writing whole parameter-sized lists in fp32.
Why
    ``fused=True`` does the whole update in one kernel per chunk: it reads the parameter, its
    gradient and the two moments once and writes three of them back (AdamW: 7 passes), where
    foreach makes ~21.
Evidence
    Kernel names: ``multi_tensor_apply_kernel<...Functor<float, depth, r_args_depth,
    res_arg_index>>`` (foreach) vs ``FusedAdamMathFunctor`` / ``FusedSgdMathFunctor`` (fused). Each
    foreach kernel passes over ``r_args_depth`` lists read and one written back (in place) or
    ``depth - r_args_depth`` written.
Fix
    ``torch.optim.AdamW(params, fused=True)`` (also Adam, SGD); all parameters on the GPU in a
    floating type. Where the op record finds complex parameters (an FNO's spectral weights,
    complex64), which the fused kernels refuse, the action says to keep them as real tensors
    (``torch.view_as_real``) viewed as complex in forward: torch.optim's foreach and
    single-tensor paths step a complex parameter as that real view already.
Expected gain
    Graph edit: the foreach kernels become one fused kernel per chunk (the most frequent kind's
    launches stay, the others' kernels and launches go), replayed by the step model at the
    calibrated CPU scale, never above the change's own gain. The fused kernels' time, best first:

    * **timed at capture** (``profkit capture`` records each optimizer's class and parameter sizes
      at its step in the calibration run and times one step as constructed against
      ``fused=True`` at those sizes, PROFKIT_META ``replacements``): the foreach kernels' time
      divided by the measured ratio. The action says "replacement timed at the program's shapes:
      X us vs Y us" (the fused step, then the program's). The steps are timed queued behind a
      held GPU, so the times are the kernels', not the host's launching; against the fused
      kernels in the programs with ``fused=True`` (H100, 2026-12-05, analyses/replacement_check.md): within
      6% on three optimizers of 66-125M parameters, 20-28% faster than the program's on two of
      11-14M;
    * **estimated** (no timing: a trace from plain nsys, no GPU at capture): divided by the passes
      over the parameters, foreach's over fused's (AdamW: 7 of ~21), said as "estimated: no
      replacement timed at capture".

    The CPU side (``scale_cpu``): one fused call runs none of the foreach path's Python between
    its ops. Without host times, the host gaps between the first and the last launch of the
    optimizer's kernels in each iteration go, with the own time of every call among them that is
    not a launch the fused step keeps (the gap before the first launch stays: it may hold the
    program's own code between the backward and the step). Where the timing kept each step's
    host time (the call until it returns), that stretch, the gap before it included, shrinks by
    the host time the fused step saved instead, at most all of it, and the cap is the larger of
    the two steps' GPU and host ratios. On the corpus this moved train_llama's price from 1.02x
    to 1.04x (measured 1.06x side by side), vit_grad_norms' from 1.01x to 1.05x (1.10x) and
    compiled_gpt_train's from 1.10x to 1.11x (1.10x); the GPU-bound ones did not move. Against
    it: two nsys captures of another Llama step measured 15.19 -> 15.53 ms with fused=True
    (priced 1.06x; captures minutes apart on a host whose speed drifts), and on a host-bound
    Llama step fused AdamW measured 1.24x: the Python the trace shows between the launches is
    not all the foreach path's host time.
Hand-written optimizers
    An optimizer torch.optim does not have (the op record's class: a LAMB, LARS or Lion written
    in the program) has no foreach kernels to find; written as a Python loop over its
    parameters, it is a loop of PK107's whose copies are the recorded parameters. The fix is a
    fused implementation of it (a library's, such as Apex's FusedLAMB), or torch.optim's fused
    AdamW where the algorithm may change: priced as the loop's kernels replaced by one fused
    step (``AdamW(fused=True)`` over the recorded sizes timed at capture,
    ``optimizer_fused_floor``; else seven passes over the parameters at the memory bandwidth)
    and the loop's other copies' calls and CPU time gone. Found on a BERT-base step trained with
    a hand-written LAMB (lamb_python_optim_train, first seen at 2.22x for its trust ratios' reads,
    which measured 0.98x kept on the GPU): priced 2.34x, AdamW fused measured 2.41x.
Trial
    ``profkit capture --try fused_optim`` measures the finding's price: the program run with
    ``fused=True`` for every Adam, AdamW, SGD and Adagrad it constructs (an explicit ``foreach``
    dropped), which also takes the foreach path's CPU time off the step, which the price keeps.
References
    PyTorch ``torch.optim`` docs ("foreach and fused implementations"); NVIDIA Apex FusedAdam.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import (ESTIMATED, Finding, Param, RuleContext, RuleMeta, Scope, Table, TrialOf,
                                      matches, timed_text)
from profkit.run.step.transform import scale_cpu, scale_ops

RULE = RuleMeta(
    code="PK201", name="unfused-optimizer",
    summary="foreach Adam/AdamW/SGD step: use fused=True (one pass over the optimizer state)",
    tables=(Table.KERNEL,), example="traces/real/train_llama.sqlite.xz",
    quiet_on="traces/real/train_llama_fused.sqlite.xz",
    trials=(TrialOf("fused_optim"),),
    params=(Param("min_gpu_share", 0.01, "optimizer kernels' share of the window's GPU time"),))

FOREACH_RE = re.compile(r"multi_tensor_apply_kernel<.*?Functor<float, \(int\)(\d+), \(int\)(\d+), "
                        r"\(int\)(\d+)>")
FUSED_RE = re.compile(r"Fused(Adam|AdamW|Sgd|SGD)\w*Functor|fused_adam|FusedOptimizer", re.I)
NOT_OPTIMIZER_RE = re.compile(r"LpNorm|Zero|Fill|Norm", re.I)  # grad clipping, zeroing


def optimizer_step_kernel(name: str) -> bool:
    """A kernel of an optimizer's update of its parameters: a foreach (multi-tensor) or fused
    Adam/AdamW/SGD kernel, not a norm or a zeroing (gradient clipping, ``zero_grad``)."""
    return bool((FOREACH_RE.search(name) or FUSED_RE.search(name)) and not NOT_OPTIMIZER_RE.search(name))


def passes(name: str) -> int:
    """Passes over parameter-sized lists made by one foreach kernel (reads + writes)."""
    m = FOREACH_RE.search(name)
    depth, reads, res = (int(x) for x in m.groups())
    return reads + (depth - reads if depth > reads else 1)


def _stretch(ctx: RuleContext, kept, gone, first: bool) -> tuple[np.ndarray, int]:
    """The calls from the first launch of the optimizer's kernels (``first``; else the call after
    it) to the last, in each modelled iteration, and how many iterations hold one."""
    return launch_stretch(ctx.model.graph, np.concatenate([ctx.graph_ops(kept), ctx.graph_ops(gone)]), first)


def launch_stretch(g, ops: np.ndarray, first: bool = True) -> tuple[np.ndarray, int]:
    """The calls from the first launch of the step graph's operations ``ops`` (``first``; else
    the call after it) to the last, in each modelled iteration, and how many iterations hold one
    (PK103 keeps the optimizer step's stretch eager in its compiled price)."""
    calls = np.unique(g.g_call[ops[ops >= 0]])
    calls = calls[calls >= 0]
    if not len(calls):
        return calls, 0
    it = np.searchsorted(g.iter_call, calls, side="right") - 1
    its = np.unique(it)
    skip = 0 if first else 1
    return np.concatenate([np.arange(calls[it == i].min() + skip, calls[it == i].max() + 1)
                           for i in its]), len(its)


def _host_saving(ctx: RuleContext, timed: list, kept, gone) -> tuple[np.ndarray, float, str, float]:
    """(calls, factor, what, the host's own gain) for the CPU side of the fused step: the calls
    from the first to the last launch of the optimizer's kernels in each modelled iteration, their
    CPU time cut by the timed steps' host saving (at the calibrated CPU scale); nothing where the
    timing kept no host times or the step graph holds no optimizer launch."""
    none = (np.empty(0, dtype=np.int64), 1.0, "", 1.0)
    hosts = [e.host for e in timed if e.host is not None]
    if not timed or len(hosts) != len(timed) or ctx.model is None:
        return none
    saved = sum(max(o - r, 0.0) for o, r in hosts)   # per step of every optimizer (unprofiled ns)
    own_gain = sum(o for o, _ in hosts) / max(sum(r for _, r in hosts), 1e-9)
    region, iters = _stretch(ctx, kept, gone, first=True)
    if saved <= 0 or not iters:
        return none
    g = ctx.model.graph
    cpu = float(g.c_gap[region].sum() + g.c_own[region].sum()) * ctx.host  # as the replay runs it
    if cpu <= 0:
        return none
    factor = max(0.0, 1.0 - saved * iters / cpu)
    held = cpu / iters / 1e3
    text = (f"; the optimizer's host time {held:.0f} us an iteration less the {saved / 1e3:.0f} us the "
            "fused step saved on the host where it was timed" if factor > 0 else
            f"; the optimizer's host time {held:.0f} us an iteration gone (the fused step saved "
            f"{saved / 1e3:.0f} us on the host where it was timed, more than the step holds between "
            "the optimizer's launches: no more is taken)")
    return region, factor, text, own_gain


def _foreach_python(ctx: RuleContext, kept, gone) -> tuple[np.ndarray, str, np.ndarray]:
    """(calls, what, calls that are not kept launches) between the first and the last launch of
    the optimizer's kernels in each modelled iteration, the first left out (the host gap before it
    may hold the program's own code between the backward and the step): the foreach path's Python
    between its ops, which one fused call does not run."""
    none = (np.empty(0, dtype=np.int64), "", np.empty(0, dtype=np.int64))
    if ctx.model is None:
        return none
    region, iters = _stretch(ctx, kept, gone, first=False)
    if not iters:
        return none
    g = ctx.model.graph
    kept_ops = ctx.graph_ops(kept)
    kept_calls = np.unique(g.g_call[kept_ops[kept_ops >= 0]])
    between = region[~np.isin(region, kept_calls)]
    cpu = float(g.c_gap[region].sum() + g.c_own[between].sum()) * ctx.host / iters
    return region, f"; the foreach path's Python between its launches {cpu / 1e3:.0f} us an iteration gone", between


# torch.optim's optimizers: a recorded class outside them is the program's own (or a library's)
TORCH_OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "LBFGS", "NAdam",
                              "RAdam", "RMSprop", "Rprop", "SparseAdam", "Adafactor"})
# A fused Adam-like step's passes over parameter-sized tensors: read p, g, m, v; write p, m, v
FUSED_PASSES = 7
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8, "complex64": 8, "complex128": 16}
# the op record's parameters a loop's copies must cover to be that optimizer's step
HAND_WRITTEN_COVER = 0.9


def _hand_written(ctx: RuleContext) -> list[Finding]:
    """An optimizer torch.optim does not have (the op record's class: LAMB, LARS, Lion written in
    the program), stepped as a Python loop over its parameters: a loop of PK107's whose copies
    are the recorded parameters (one unit of kernels each). A fused implementation makes one
    pass over them: priced as the loop's kernels replaced by one kernel of the fused AdamW step
    timed at capture over the same sizes (``optimizer_fused_floor``), else of FUSED_PASSES over
    the parameters at the memory bandwidth, and the loop's other copies' calls and CPU time gone
    (PK107's edit, with the fused step's time in place of the copies' widened kernels)."""
    recs = [o for o in ctx.replacements.recorded("optimizer")
            if str(o.get("class")) not in TORCH_OPTIMIZERS and int(o.get("params") or 0) >= 8]
    if not recs or ctx.model is None:
        return []
    from profkit.judge.rules import pk107_repeated_unit_loop as pk107
    from profkit.run.step.transform import drop_cpu, replace_ops
    found = pk107.loops(ctx)
    g = ctx.model.graph
    its = max(len(g.iter_call) - 1, 1)
    for o in recs:
        n = int(o["params"])
        mine = [lp for lp in found if HAND_WRITTEN_COVER * n <= lp.copies <= n]
        if not mine:
            continue
        timed = [e for e in ctx.replacements.entries if e.kind == "optimizer_fused_floor" and e.error is None
                 and e.replacement_ns and str(e.shape.get("class")) == str(o["class"])]
        if timed:
            fused_ns = float(timed[0].replacement_ns)
            said = (f"the fused AdamW step over the same {n} parameters timed at capture: "
                    f"{fused_ns / 1e3:.1f} us")
        else:
            size = ELEMENT_BYTES.get(str(o.get("dtype")), 4)
            fused_ns = FUSED_PASSES * size * float(o.get("numel") or 0) / ctx.prof.peaks.memory_bandwidth * 1e9
            said = (f"{ESTIMATED}: {FUSED_PASSES} passes over {int(o.get('numel') or 0) / 1e6:.0f}M "
                    f"{o.get('dtype') or 'fp32'} elements")
        per_loop = len(mine) / its
        groups = [np.r_[lp.ops.ravel(), lp.extra] for lp in mine]
        new = np.full(len(groups), fused_ns / max(per_loop, 1.0))
        body = pk107.other_copies_cpu(g, mine)
        loop_ns = float(sum(g.g_dur[lp.ops].sum() + g.g_dur[lp.extra].sum() for lp in mine)) / its
        gain, basis = ctx.price(lambda gr: drop_cpu(replace_ops(gr, groups, new), body),
                                f"the loop over {mine[0].copies} parameters ({loop_ns / 1e3:.0f} us of kernels "
                                f"per iteration) one fused step of {fused_ns / 1e3:.0f} us, its other copies' "
                                "calls and CPU time gone")
        if gain < 1.02:
            continue
        cls = str(o["class"])
        ev = {"optimizer_class": cls, "params": n, "numel": int(o.get("numel") or 0),
              "loop_copies": int(mine[0].copies), "loop_kernel_ns_per_iteration": int(loop_ns),
              "fused_step_ns": int(fused_ns), "priced_from": "timed" if timed else "estimate"}
        return [Finding(RULE.code, RULE.name,
                        f"the optimizer {cls} is not torch.optim's and steps as a Python loop over its {n} "
                        f"parameters ({mine[0].period} kernels each, in {mine[0].where or 'no range'}): use "
                        f"a fused implementation of it (one kernel pass over the parameters and their state: "
                        f"a library's fused {cls}, such as NVIDIA Apex's FusedLAMB for LAMB), or torch.optim's "
                        "fused AdamW/Adam/SGD where the algorithm may change; a torch._foreach_* rewrite "
                        "keeps its passes (PK107)", Rung.LIBRARY, ev, gain, f"{said}; {basis}", gain)]
    return []


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    names = k.index.to_series()
    if matches(names, FUSED_RE).any():
        return []
    foreach = names[matches(names, FOREACH_RE) & ~matches(names, NOT_OPTIMIZER_RE)]
    if foreach.empty:
        return _hand_written(ctx)
    rows = k.loc[foreach.index]
    total = float(rows["total_ns"].sum())
    if total < RULE.param("min_gpu_share") * float(ctx.kernels["total_ns"].sum()):
        return []
    adam = names.str.contains(r"Sqrt|Lerp", regex=True).any()
    fused_passes = 7 if adam else 5   # AdamW: read p, g, m, v; write p, m, v. SGD momentum: 3 + 2
    chunks = float(rows["count"].min())  # launches per foreach op (its chunks), all ops alike
    foreach_passes = float(sum(passes(n) * c for n, c in rows["count"].items())) / chunks
    op_gain = max(1.0, foreach_passes / fused_passes)
    timed = ctx.replacements.measured("optimizer")
    if timed:
        # The program's own steps, fused against as constructed: their ratio over all of them.
        ratio = sum(e.original_ns for e in timed) / sum(e.replacement_ns for e in timed)
        op_gain = max(1.0, ratio)
        said = timed_text(timed, "the fused step vs the program's, ")
        per_pass = f" (the fused step {ratio:.2f}x faster)"
    else:
        said = f"{ESTIMATED}: {fused_passes} of {foreach_passes:.0f} passes"
        per_pass = ""
    crit = float(rows["critical_ns"].sum()) / total if total else 0.0
    # The fused step: one kernel per chunk (the most frequent foreach kind's launches stay and
    # carry the whole update's time / op_gain), the other kinds' kernels and launches go.
    keep = str(rows["count"].idxmax())
    kept = ctx.acts_named([keep])
    gone = ctx.acts_named([n for n in rows.index if n != keep])
    kept_ns = float(kept["dur"].sum())
    # The steps' host times, where they were timed: the foreach path's Python and launches between
    # the first and the last of its launches in each iteration shrink by what the fused step saved.
    cpu_calls, cpu_factor, cpu_text, cap = _host_saving(ctx, timed, kept, gone)
    cap = max(op_gain, cap)

    host_timed = bool(len(cpu_calls))
    if not host_timed:  # the foreach path's Python between its launches: one fused call has none
        cpu_calls, cpu_text, between = _foreach_python(ctx, kept, gone)

    def edit(gr):
        gr = scale_ops(scale_ops(gr, ctx.graph_ops(gone), float("inf"), True),
                       ctx.graph_ops(kept), kept_ns / (total / op_gain))
        if host_timed:
            return scale_cpu(gr, cpu_calls, cpu_factor)
        if len(cpu_calls):
            # the gaps between the optimizer's calls go, and the own time of every call among
            # them that is not a launch the fused step keeps (its temporaries' allocations too)
            gr = scale_cpu(gr, cpu_calls, 0.0, own=False)
            return scale_cpu(gr, between, 0.0)
        return gr

    g, basis = ctx.price(edit, f"foreach kernels {ctx.per_iteration(total)} -> one fused kernel per chunk "
                               f"{ctx.per_iteration(total / op_gain)}{per_pass}{cpu_text}", cap=cap)
    which = "AdamW/Adam" if adam else "SGD"
    complex_ = sorted({str(o.get("dtype")) for o in ctx.replacements.recorded("optimizer")
                       if str(o.get("dtype", "")).startswith("complex")})
    return [Finding(RULE.code, RULE.name,
                    f"use the fused optimizer: torch.optim.{'AdamW' if adam else 'SGD'}(..., fused=True) "
                    f"({which} runs as {len(rows)} foreach kernel kinds, ~{foreach_passes:.0f} passes "
                    f"over the parameters per step instead of {fused_passes})"
                    # torch's fused kernels refuse complex parameters; the foreach path updates each
                    # as its real view already, so the same update runs fused on real storage
                    + (f"; the fused kernels refuse its {'/'.join(complex_)} parameters: keep each as a "
                       "real tensor with a last dimension of 2 (torch.view_as_real) and view it with "
                       "torch.view_as_complex in forward (the update is the same: torch.optim steps a "
                       "complex parameter as its real view), then fused=True" if complex_ else ""),
                    Rung.LIBRARY, {"optimizer_kernel_ns": int(total), "foreach_passes": round(foreach_passes, 1),
                                   "fused_passes": fused_passes, "critical_share": round(crit, 3),
                                   "priced_from": "timed" if timed else "passes",
                                   "fused_over_foreach": round(op_gain, 3)},
                    g, f"{said}; {basis}", cap, cap,
                    Scope.OPS, frozenset(rows.index))]
