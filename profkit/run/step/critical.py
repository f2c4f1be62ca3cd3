"""The critical path of a replay: the chain of CPU and GPU work that set each iteration's length.

Walking back from the window's end, each node hands over to what bound it in the replay: a GPU
operation to its launch call (the launch latency), to its stream's previous operation (a GPU-side
gap) or to an operation of another stream it waited for; a call's end to its own CPU time or to
the GPU work it waited for (then the wake-up delay); a call's start to the call before it (the CPU
time between calls). Every stretch of the window lies on the path once, so the parts add up to
the window, and per iteration to the iteration.

Kinds: ``gpu:compute``, ``gpu:memory``, ``gpu:launch`` (kernels too short to be more than their
launch), ``nccl``, ``gpu:gap`` (between queued operations, waits on other streams); ``cpu:launch``
(launch calls and launch latency), ``cpu:python`` (CPU time between calls), ``cpu:data`` (the same
inside a data-loading range), ``cpu:sync``, ``cpu:alloc``, ``cpu:pageable_copy``, ``cpu:copy``,
``cpu:other`` (other runtime calls). CPU work on the path right after a blocking call returned
(the CPU refilling a queue the call drained, before the GPU is the bottleneck again) is that
call's cost: it takes the blocking call's kind and place.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from profkit.run.step.graph import CallKind, StepGraph, Wait
from profkit.run.step.simulate import BY_DEP, BY_FIXED, BY_LAUNCH, BY_STREAM, BY_WAIT, Schedule
from profkit.run.summary import DATA_RE

GPU_KINDS = {0: "gpu:compute", 1: "gpu:memory", 2: "gpu:launch", 3: "nccl"}
CALL_KIND_LABEL = {CallKind.LAUNCH: "cpu:launch", CallKind.GRAPH_LAUNCH: "cpu:launch",
                   CallKind.SYNC: "cpu:sync", CallKind.COPY: "cpu:copy", CallKind.MEMSET: "cpu:other",
                   CallKind.ALLOC: "cpu:alloc", CallKind.FREE: "cpu:alloc",
                   CallKind.EVENT: "cpu:other", CallKind.OTHER: "cpu:other"}
CPU_WORK = {"cpu:launch", "cpu:python", "cpu:data", "cpu:other"}
_DATA = DATA_RE


TYPICAL = 0.10      # iterations within 10% of the median period make the typical iteration
MAX_SITES = 5       # blocking-call sites whose refill is priced by a replay without their waits


@dataclass
class Part:
    kind: str
    where: str
    ns: float           # per typical iteration


@dataclass
class CriticalPath:
    """What set the typical iteration's length, part by part (largest first); the parts add up
    to ``iteration_ns``, the median simulated iteration."""
    parts: list[Part]
    iteration_ns: float
    typical: int                   # iterations averaged (within TYPICAL of the median)
    iterations: int

    def per_iteration(self) -> list[dict]:
        return [{"kind": p.kind, "where": p.where, "ns_per_iteration": int(round(p.ns))}
                for p in self.parts]

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.parts:
            out[p.kind] = out.get(p.kind, 0.0) + p.ns
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def critical_path(g: StepGraph, s: Schedule, host: float = 1.0) -> CriticalPath:
    """The critical path of the replay ``s`` of ``g`` at CPU scale ``host`` (module docstring).

    CPU work on the path right after a call that waited for the GPU is charged to that call's
    site as far as a replay without that site's waits says the wait cost; the rest keeps its own
    kind (a CPU-paced program keeps its CPU time, sync or no sync)."""
    segs = _walk(g, s)
    segs.reverse()  # forward in time
    segs = _owners(segs)
    share = _refill_shares(g, s, segs, host)
    k = len(s.starts)
    bounds = np.append(s.starts, s.end_ns)
    # Each segment as a row (start, end, key, weight); a refill becomes two rows, its owner's share
    # and the rest under its own kind.
    keys: dict[tuple[str, str], int] = {}
    rows_a, rows_b, rows_k, rows_w = [], [], [], []
    for a, b, kind, where, owner in segs:
        if owner is not None:
            f = share.get(owner, 0.0)
            if f > 0:
                rows_a.append(a); rows_b.append(b); rows_w.append(f)
                rows_k.append(keys.setdefault(owner, len(keys)))
            if f >= 1.0:
                continue
            w = 1.0 - f
        else:
            w = 1.0
        rows_a.append(a); rows_b.append(b); rows_w.append(w)
        rows_k.append(keys.setdefault((kind, where), len(keys)))
    a = np.asarray(rows_a, dtype=np.float64)
    b = np.asarray(rows_b, dtype=np.float64)
    key = np.asarray(rows_k, dtype=np.int64)
    wgt = np.asarray(rows_w, dtype=np.float64)
    # Clip each row to the iterations it overlaps (most lie in one; the few that span several
    # are split, iteration by iteration).
    per_it = np.zeros((k, max(len(keys), 1)))
    lo_it = np.clip(np.searchsorted(bounds, a, side="right") - 1, 0, max(k - 1, 0))
    hi_it = np.clip(np.searchsorted(bounds, b, side="left") - 1, 0, max(k - 1, 0))
    span = hi_it - lo_it
    for d in range(int(span.max()) + 1 if len(a) and k else 0):
        it = lo_it + d
        ok = it <= hi_it
        lo = np.maximum(a[ok], bounds[it[ok]])
        hi = np.minimum(b[ok], bounds[it[ok] + 1])
        ln = np.clip(hi - lo, 0.0, None) * wgt[ok]
        np.add.at(per_it, (it[ok], key[ok]), ln)
    names = [kk for kk, _ in sorted(keys.items(), key=lambda kv: kv[1])]
    periods = np.diff(bounds)
    med = float(np.median(periods)) if k else 0.0
    typical = [i for i in range(k) if med and abs(periods[i] / med - 1) <= TYPICAL] or list(range(k))
    sums = per_it[typical].sum(axis=0) if k else np.zeros(0)
    total: dict[tuple[str, str], float] = {names[j]: float(v) for j, v in enumerate(sums[:len(names)]) if v > 0}
    # Stretches no segment reached (before the first call of the window).
    outside = float((periods[typical] - per_it[typical].sum(axis=1)).clip(0).sum()) if k else 0.0
    if outside > 0:
        total[("cpu:python", "(outside the calls)")] = total.get(("cpu:python", "(outside the calls)"), 0.0) + outside
    raw = sum(total.values())
    scale = med / raw if raw > 0 else 0.0
    parts = [Part(kk, ww, v * scale) for (kk, ww), v in sorted(total.items(), key=lambda kv: -kv[1])
             if v * scale >= 0.5]
    return CriticalPath(parts, med, len(typical), k)


def _owners(segs: list[tuple]) -> list[tuple]:
    """Mark CPU work on the path after a call that waited for the GPU, while the GPU waits for
    the CPU (the operations on the path start when they are launched): the queue being refilled.
    Returns (start, end, kind, where, owner) with owner = the waiting call's (kind, where)."""
    out = []
    owner = None
    for a, b, kind, where, released, queued in segs:
        if released:
            out.append((a, b, kind, where, None))
            owner = (kind, where)
            continue
        if queued:  # the GPU has work queued again: the refill is over
            owner = None
        out.append((a, b, kind, where, owner if kind in CPU_WORK else None))
    return out


def _refill_shares(g: StepGraph, s: Schedule, segs: list[tuple], host: float) -> dict:
    """Per waiting-call site: the share of its refill that a replay without its waits saves."""
    refill: dict[tuple[str, str], float] = {}
    for a, b, kind, where, owner in segs:
        if owner is not None:
            refill[owner] = refill.get(owner, 0.0) + (b - a)
    if not refill:
        return {}
    from profkit.run.step.simulate import replay
    from profkit.run.step.transform import drop_waits
    # A site is the range the waiting call ran in: `.item()` is a copy and a stream sync, and
    # both go when the value stays on the GPU. Launches that waited on a full queue stay.
    blocking = (g.c_wait > 0) & np.isin(g.c_kind, [int(CallKind.SYNC), int(CallKind.COPY),
                                                   int(CallKind.FREE), int(CallKind.ALLOC)])
    range_of = np.array(list(g.range_names), dtype=object)[g.c_range] if g.n_calls else np.empty(0, object)
    base = float(s.end_ns - s.starts[0]) if len(s.starts) else 0.0
    shares = {}
    for site in sorted(refill, key=lambda x: -refill[x])[:MAX_SITES]:
        sel = np.flatnonzero(blocking & (range_of == site[1].rsplit(" in ", 1)[-1]))
        if not len(sel):
            continue
        t = replay(drop_waits(g, sel), host)
        saved = base - float(t.end_ns - t.starts[0])
        shares[site] = float(np.clip(saved / refill[site], 0.0, 1.0))
    return shares


def _api(name: str) -> str:
    """An API name without its version suffix (cudaLaunchKernel_v7000 -> cudaLaunchKernel)."""
    return re.sub(r"_v\d+$", "", str(name))


def _labels(g: StepGraph) -> tuple[list[str], list[str], list[str], list[str]]:
    """Per call: its kind label and its place ("cudaLaunchKernel in forward"); per call, the
    kind and place of the CPU time before it (by the range open in the middle of it). Made once
    per distinct value, not per call."""
    if not g.n_calls:
        return [], [], [], []
    api = [_api(n) for n in g.call_names]
    names = np.array(list(g.range_names), dtype=object)
    # Each label made once per distinct key (kind and wait; name and range), not once per call.
    arg = np.where(g.c_wait == int(Wait.OP), g.c_wait_arg, -1)
    key = np.stack([g.c_kind.astype(np.int64), g.c_wait.astype(np.int64), arg.astype(np.int64)], axis=1)
    keys, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    c_kind = np.array([_call_label(g, int(i)) for i in first], dtype=object)[inv.ravel()].tolist()
    pairs, pinv = np.unique(np.stack([g.c_name.astype(np.int64), g.c_range.astype(np.int64)], axis=1),
                            axis=0, return_inverse=True)
    c_where = np.array([f"{api[a]} in {g.range_names[b]}" for a, b in pairs.tolist()],
                       dtype=object)[pinv.ravel()].tolist()
    gap_where = names[g.c_gap_range].tolist()
    gap_kind = np.array(["cpu:data" if _DATA.search(w) else "cpu:python" for w in names],
                        dtype=object)[g.c_gap_range].tolist()
    return c_kind, c_where, gap_kind, gap_where


def _walk(g: StepGraph, s: Schedule) -> list[tuple]:
    """Segments (start, end, kind, where, released by the GPU, GPU queued) from the window's end
    back to its start."""
    out: list[tuple] = []
    n, m = g.n_calls, g.n_ops
    if n == 0:
        return out
    t_stop = float(s.c_start[0])
    in_win = np.flatnonzero(g.g_call >= 0)
    last_op = int(in_win[np.argmax(s.g_end[in_win])]) if len(in_win) else -1
    cs, ce, gs, ge = s.c_start.tolist(), s.c_end.tolist(), s.g_start.tolist(), s.g_end.tolist()
    g_by, c_by, waited = s.g_by.tolist(), s.c_end_by.tolist(), s.c_waited.tolist()
    g_call, g_prev, g_dep, fam = g.g_call.tolist(), g.g_prev.tolist(), g.g_dep.tolist(), g.g_family.tolist()
    pred = g.c_pred.tolist()
    c_kind, c_where, gap_kind, gap_where = _labels(g)
    rname = g.range_names
    c_range = g.c_range.tolist()
    if last_op >= 0 and ge[last_op] > ce[n - 1]:
        node, idx = 0, last_op   # 0: a GPU operation's end, 1: a call's end, 2: a call's start
    else:
        node, idx = 1, n - 1
    tail_from = ge[idx] if node == 0 else ce[idx]
    if s.end_ns > tail_from:
        w = g.range_names[g.tail_range] if 0 <= g.tail_range < len(g.range_names) else "(after the last call)"
        out.append((tail_from, float(s.end_ns), "cpu:data" if _DATA.search(w) else "cpu:python",
                    w, False, False))
    guard = 4 * (n + m) + 10
    while guard > 0:
        guard -= 1
        if node == 0:
            op = idx
            call = g_call[op]
            where = rname[c_range[call]] if call >= 0 else "(before the window)"
            by = g_by[op]
            out.append((gs[op], ge[op], GPU_KINDS[fam[op]], where, False, by == BY_STREAM or by == BY_DEP))
            if gs[op] <= t_stop or by == BY_FIXED:
                break
            if by == BY_LAUNCH:
                out.append((cs[call], gs[op], "cpu:launch", where, False, False))
                node, idx = 2, call
            elif by == BY_STREAM:
                pv = g_prev[op]
                out.append((ge[pv], gs[op], "gpu:gap", where, False, False))
                node, idx = 0, pv
            else:  # BY_DEP
                d = g_dep[op]
                out.append((ge[d], gs[op], "gpu:gap", where, False, False))
                node, idx = 0, d
        elif node == 1:
            i = idx
            if c_by[i] == BY_WAIT and waited[i] >= 0:
                w = waited[i]
                out.append((ge[w], ce[i], c_kind[i], c_where[i], True, False))
                node, idx = 0, w
            else:
                out.append((cs[i], ce[i], c_kind[i], c_where[i], False, False))
                node, idx = 2, i
        else:  # the CPU time before the call
            i = idx
            pv = pred[i]
            if pv < 0 or cs[i] <= t_stop:
                break
            out.append((ce[pv], cs[i], gap_kind[i], gap_where[i], False, False))
            node, idx = 1, pv
    return out


def _call_label(g: StepGraph, i: int) -> str:
    kind = CallKind(int(g.c_kind[i]))
    if kind == CallKind.COPY and int(g.c_wait[i]) == int(Wait.OP):
        op = int(g.c_wait_arg[i])
        # A blocking copy that is not device-to-host is one from pageable memory.
        name = str(g.op_names[g.g_name[op]]) if op >= 0 else ""
        # Device-to-host is how .item() and .cpu() wait: a sync; anything else blocked because
        # one side was pageable host memory.
        return "cpu:sync" if "Device-to-Host" in name else "cpu:pageable_copy"
    return CALL_KIND_LABEL.get(kind, "cpu:other")
