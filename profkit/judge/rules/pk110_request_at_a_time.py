"""PK110 request-at-a-time: a loop runs the model on one input at a time, each fed from the host
and read back.

What
    Inside one iteration, on the thread that opens it, ``min_requests`` segments or more in a row,
    each made of a host-to-device copy (its input), ``min_kernels`` kernels or more, and a
    device-to-host copy (its result, read back) before the next one's input; the segments launch
    the same kernels (the same names, every GEMM read as one, counts that agree to
    ``min_overlap``), and they are launch-bound: their kernels run under ``max_busy_share`` of
    their span in the replay. A service's handler called once per request, an evaluation loop over
    single samples, a detector run image by image.
Why
    Each request pays the whole model's launches, its Python and a wait for the GPU, while its
    kernels, sized for one input, fill a few SMs for microseconds. The same requests stacked into
    one batch launch the model once, with kernels as wide as all of them together, and wait once.
    PK107 finds loops by an exact repeat of their kernel sequence: requests of different sizes
    break it (cuBLAS adds a split-K reduction for one shape, a GEMV for another), and a unit
    whose time is mostly GEMMs it reads as a layer stack. The host copies that bracket each
    segment are what says these are inputs arriving one by one.
Evidence
    The step graph's calls and operations: the device-to-host copies of the main thread cut each
    iteration into segments; a segment counts where a host-to-device copy comes before its first
    kernel. Segments are compared by their kernels' names (PK107's search ids: every GEMM kernel
    one name, an elementwise functor's vectorised and unrolled kernels one), as multisets: the
    overlap of two is the kernels they share over the larger's count. The segments matching the
    iteration's median segment form the loop where ``min_requests`` of them come in a row.
Fix
    Batch the requests: collect what is waiting (a queue with a short timeout, dynamic batching
    as Triton Inference Server or TorchServe do), pad to the longest (rounded up to a multiple
    of 8) with an attention mask, or group by length; run one forward; read the results back in
    one copy. For an evaluation loop, a DataLoader with a batch size.
Expected gain
    PK107's vectorised price on the requests matched position by position: a kernel that every
    request launches (the same name, its k-th occurrence in each) becomes one kernel as wide as
    all the copies together (as many waves as their blocks need at one block per SM, each as long
    as the copies' median; never less than the longest copy, never more than their sum); the
    kernels only some requests launch go in all but the first; the other requests' calls and the
    CPU time before each (their Python, input copies, reads and waits) go, from the first
    request's read-back to the last one's, module loads among them (a library compiling a kernel
    for a request's new shape, PK108's: one batch has one shape, the first request's loads stay).
    Padding's
    extra work is not counted: where lengths vary widely (a batch padded to its longest of 32
    texts) the price leans high.
References
    NVIDIA Triton Inference Server, "Dynamic batcher"; TorchServe batch inference; Hugging Face
    tokenizers' ``padding="longest"``, ``pad_to_multiple_of``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from profkit.model import Rung

from profkit.judge.rules import pk107_repeated_unit_loop as pk107
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table
from profkit.run.step.transform import drop_cpu, replace_ops, scale_ops

RULE = RuleMeta(
    code="PK110", name="request-at-a-time",
    summary="a loop runs the model on one input at a time, fed from the host and read back: batch the inputs",
    tables=(Table.KERNEL, Table.RUNTIME, Table.MEMCPY),
    example="traces/corpus/request_loop_infer.sqlite.xz",
    quiet_on="traces/corpus/detection_postproc_infer.sqlite.xz",
    params=(Param("min_requests", 8, "segments in a row that make a loop of requests"),
            Param("min_kernels", 10, "kernels a segment launches, at least"),
            Param("min_overlap", 0.8, "kernels two segments share over the larger's count"),
            Param("max_busy_share", 0.5, "the segments' kernel time as a share of their span in the "
                                         "replay, below which they are launch-bound")))

H2D_NAME, D2H_NAME = "[CUDA memcpy Host-to-Device]", "[CUDA memcpy Device-to-Host]"


@dataclass
class Requests:
    """One loop of requests: each request's kernels that all of them launch, position by position
    (rows: requests; ``ops[:, j]`` the j-th common kernel), the kernels only some launch (outside
    the first request), the calls the other requests make, and how busy the GPU is over them."""
    ops: np.ndarray
    extras: np.ndarray
    body: np.ndarray
    busy_share: float
    kernels_each: float


def _overlap(a: Counter, b: Counter) -> float:
    big = max(sum(a.values()), sum(b.values()))
    return sum((a & b).values()) / big if big else 0.0


def find(ctx: RuleContext) -> list[Requests]:
    """The loops of requests of the modelled iterations (see the module docstring)."""
    m = ctx.model
    if m is None or ctx.baseline is None or len(m.graph.iter_call) < 2:
        return []
    g = m.graph
    names = np.asarray([str(n) for n in g.op_names], dtype=object)
    cp = np.flatnonzero((g.g_kind == 1) & (g.g_call >= 0))
    h2d = np.sort(g.g_call[cp[names[g.g_name[cp]] == H2D_NAME]])
    d2h = np.unique(g.g_call[cp[names[g.g_name[cp]] == D2H_NAME]])
    if len(d2h) < RULE.param("min_requests"):
        return []
    kern = np.flatnonzero((g.g_kind == 0) & (g.g_call >= 0))
    ids = pk107._search_ids(g)
    out = []
    for it in range(len(g.iter_call) - 1):
        c0, c1 = int(g.iter_call[it]), int(g.iter_call[it + 1])
        main = g.c_tid[c0]
        cuts = d2h[(d2h >= c0) & (d2h < c1)]
        cuts = cuts[g.c_tid[cuts] == main]
        kk = kern[(g.g_call[kern] >= c0) & (g.g_call[kern] < c1)]
        kk = kk[g.c_tid[g.g_call[kk]] == main]
        kk = kk[np.argsort(g.g_call[kk], kind="stable")]
        kc = g.g_call[kk]
        segs = []      # per segment: the call that reads its result back, its kernels or None
        lo = c0 - 1
        for hi in cuts.tolist():
            sel = kk[(kc > lo) & (kc <= hi)]
            fed = len(sel) and bool(((h2d > lo) & (h2d < g.g_call[sel[0]])).any())
            segs.append((hi, sel if fed and len(sel) >= RULE.param("min_kernels") else None))
            lo = hi
        found = _loop(g, ctx, segs, ids)
        if found is not None:
            out.append(found)
    return out


def _loop(g, ctx: RuleContext, segs: list, ids: np.ndarray):
    """The longest run of segments that match the iteration's median one, as Requests; None
    where it holds fewer than ``min_requests``."""
    counts = [Counter(ids[g.g_name[sel]].tolist()) if sel is not None else None for _, sel in segs]
    sizes = sorted(sum(c.values()) for c in counts if c is not None)
    if len(sizes) < RULE.param("min_requests"):
        return None
    ref = next(c for c in counts if c is not None and sum(c.values()) == sizes[len(sizes) // 2])
    match = [c is not None and _overlap(c, ref) >= RULE.param("min_overlap") for c in counts]
    best, start = (0, 0), None
    for i, ok in enumerate([*match, False]):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            if i - start > best[0]:      # the first of the longest runs
                best = (i - start, start)
            start = None
    n, first = best
    if n < RULE.param("min_requests"):
        return None
    run = segs[first:first + n]
    # the j-th occurrence of a kernel name in one request stands for the j-th in every other
    keyed = []
    for _, sel in run:
        seen: Counter = Counter()
        keys = {}
        for op, name in zip(sel.tolist(), ids[g.g_name[sel]].tolist()):
            keys[(name, seen[name])] = op
            seen[name] += 1
        keyed.append(keys)
    common = [k for k in keyed[0] if all(k in ks for ks in keyed[1:])]
    if not common:
        return None
    ops = np.array([[ks[k] for k in common] for ks in keyed], dtype=np.int64)
    members = np.concatenate([sel for _, sel in run])
    extras = np.setdiff1d(np.concatenate([sel for _, sel in run[1:]]), ops.ravel())
    b = ctx.baseline
    span = float(b.g_end[members].max() - b.g_start[members].min())
    busy = float((b.g_end[members] - b.g_start[members]).sum())
    if span <= 0 or busy / span >= RULE.param("max_busy_share"):
        return None
    # from the first request's read-back to the last one's, on the thread that makes them
    calls = np.arange(run[0][0] + 1, run[-1][0] + 1)
    calls = calls[g.c_tid[calls] == g.c_tid[run[0][0]]]
    return Requests(ops, extras, calls, busy / span, float(np.mean([len(sel) for _, sel in run])))


def detect(ctx: RuleContext) -> list[Finding]:
    found = find(ctx)
    if not found:
        return []
    sm = ctx.prof.full_trace.primary_gpu().sm_count
    if not sm:
        return []
    g = ctx.model.graph
    dur = g.g_dur
    grids = ctx.launch_grids(np.concatenate([r.ops.ravel() for r in found]))
    if (grids < 0).any():
        return []      # an export without launch dimensions: a batched kernel's width is unknown
    groups, new, drop, body = [], [], [], []
    before = after = 0.0
    for r, part in zip(found, np.split(grids, np.cumsum([r.ops.size for r in found])[:-1])):
        ns = pk107.merged_ns(dur[r.ops], part.reshape(r.ops.shape), int(sm))
        groups.extend(r.ops[:, j] for j in range(r.ops.shape[1]))
        new.extend(ns.tolist())
        before += float(dur[r.ops].sum() + dur[r.extras].sum())
        after += float(ns.sum())
        drop.append(r.extras)
        body.append(r.body)
    body_calls = np.unique(np.concatenate(body))
    # the other requests' copies (their inputs, their results) go with their calls
    launched = np.flatnonzero(np.isin(g.g_call, body_calls) & (g.g_kind != 0))
    gone = np.unique(np.concatenate([*drop, launched]))
    new_arr = np.asarray(new, dtype=np.float64)
    its = max(len(g.iter_call) - 1, 1)
    big = max(found, key=lambda r: r.ops.shape[0])
    n = big.ops.shape[0]
    what = (f"{len(found) / its:.0f} loop(s) of requests per iteration (the largest {n} requests of ~"
            f"{big.kernels_each:.0f} kernels), each made one batch: {big.ops.shape[1]} kernels as wide as "
            f"the requests together, the kernels' time {before / its / 1e3:.0f} -> {after / its / 1e3:.0f} us "
            f"per iteration, in waves of {int(sm)} blocks at one block per SM; the other requests' "
            f"calls and the CPU time before them {float(g.c_gap[body_calls].sum() + g.c_own[body_calls].sum()) / its / 1e6:.2f} "
            "ms per iteration as profiled (their Python, input copies, reads, waits and module loads)")
    gain, basis = ctx.price(lambda gr: drop_cpu(scale_ops(replace_ops(gr, groups, new_arr), gone, float("inf")),
                                                body_calls), what)
    if gain < 1.02:
        return []
    ev = {"loops_per_iteration": round(len(found) / its, 1), "requests": int(n),
          "kernels_per_request": round(big.kernels_each, 1), "common_kernels": int(big.ops.shape[1]),
          "busy_share": round(max(r.busy_share for r in found), 3),
          "kernel_ns_per_iteration": int(before / its), "batched_kernel_ns_per_iteration": int(after / its),
          "calls_removed_per_iteration": round(len(body_calls) / its, 1), "sm_count": int(sm)}
    action = (f"a loop runs the model on one input at a time: {n} requests in a row per iteration, each "
              f"copied in from the host, ~{big.kernels_each:.0f} launches, and read back (a wait for the "
              "GPU each), its kernels sized for one input: batch the waiting inputs (pad to the longest, "
              "rounded up to 8, with an attention mask, or group them by length; one forward, one read "
              "back)")
    return [Finding(RULE.code, RULE.name, action, Rung.LIBRARY, ev, gain, basis, gain)]
