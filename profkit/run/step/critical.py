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
from profkit.run.summary import DATA_RE, FAMILIES

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
    per_it: list[dict[tuple[str, str], float]] = [dict() for _ in range(k)]
    for a, b, kind, where, owner in segs:
        parts = [(kind, where, 1.0)]
        if owner is not None:
            f = share.get(owner, 0.0)
            parts = [(owner[0], owner[1], f), (kind, where, 1.0 - f)]
        # Clip to the iterations it overlaps.
        i = max(int(np.searchsorted(bounds, a, side="right")) - 1, 0)
        while i < k and bounds[i] < b:
            lo, hi = max(a, bounds[i]), min(b, bounds[i + 1])
            if hi > lo:
                for kk, ww, f in parts:
                    if f > 0:
                        per_it[i][(kk, ww)] = per_it[i].get((kk, ww), 0.0) + f * (hi - lo)
            i += 1
    periods = np.diff(bounds)
    med = float(np.median(periods)) if k else 0.0
    typical = [i for i in range(k) if med and abs(periods[i] / med - 1) <= TYPICAL] or list(range(k))
    total: dict[tuple[str, str], float] = {}
    for i in typical:
        covered = sum(per_it[i].values())
        gap = periods[i] - covered  # stretches no segment reached (before the first call)
        if gap > 0:
            per_it[i][("cpu:python", "(outside the calls)")] = per_it[i].get(
                ("cpu:python", "(outside the calls)"), 0.0) + gap
        for key, v in per_it[i].items():
            total[key] = total.get(key, 0.0) + v
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
    from profkit.run.step.simulate import simulate
    from profkit.run.step.transform import drop_waits
    site_of = np.array([f"{_api(g.call_names[g.c_name[i]])} in {_where_call(g, i)}"
                        for i in range(g.n_calls)], dtype=object) if g.n_calls else np.empty(0, object)
    base = float(s.end_ns - s.starts[0]) if len(s.starts) else 0.0
    shares = {}
    for site in sorted(refill, key=lambda x: -refill[x])[:MAX_SITES]:
        sel = np.flatnonzero((site_of == site[1]) & (g.c_wait > 0))
        if not len(sel):
            continue
        t = simulate(drop_waits(g, sel), host)
        saved = base - float(t.end_ns - t.starts[0])
        shares[site] = float(np.clip(saved / refill[site], 0.0, 1.0))
    return shares


def _api(name: str) -> str:
    """An API name without its version suffix (cudaLaunchKernel_v7000 -> cudaLaunchKernel)."""
    return re.sub(r"_v\d+$", "", str(name))


def _where_call(g: StepGraph, i: int) -> str:
    return g.range_names[int(g.c_range[i])]


def _walk(g: StepGraph, s: Schedule) -> list[tuple]:
    """Segments (start, end, kind, where, released by the GPU) from the window's end back to
    its start."""
    out: list[tuple] = []
    n, m = g.n_calls, g.n_ops
    if n == 0:
        return out
    t_stop = float(s.c_start[0])
    in_win = np.flatnonzero(g.g_call >= 0)
    last_op = int(in_win[np.argmax(s.g_end[in_win])]) if len(in_win) else -1
    if last_op >= 0 and s.g_end[last_op] > s.c_end[n - 1]:
        node, idx = "g", last_op
    else:
        node, idx = "ce", n - 1
    tail_from = s.g_end[idx] if node == "g" else s.c_end[idx]
    if s.end_ns > tail_from:
        out.append((float(tail_from), float(s.end_ns), "cpu:python", "(after the last call)", False, False))
    names = g.call_names
    guard = 4 * (n + m) + 10
    while guard > 0:
        guard -= 1
        if node == "g":
            op = idx
            call = int(g.g_call[op])
            where = _where_call(g, call) if call >= 0 else "(before the window)"
            out.append((float(s.g_start[op]), float(s.g_end[op]), GPU_KINDS[int(g.g_family[op])], where, False,
                        int(s.g_by[op]) in (BY_STREAM, BY_DEP)))
            by = int(s.g_by[op])
            if s.g_start[op] <= t_stop or by == BY_FIXED:
                break
            if by == BY_LAUNCH:
                out.append((float(s.c_start[call]), float(s.g_start[op]), "cpu:launch", where, False, False))
                node, idx = "cs", call
            elif by == BY_STREAM:
                p = int(g.g_prev[op])
                out.append((float(s.g_end[p]), float(s.g_start[op]), "gpu:gap", where, False, False))
                node, idx = "g", p
            else:  # BY_DEP
                d = int(g.g_dep[op])
                out.append((float(s.g_end[d]), float(s.g_start[op]), "gpu:gap", where, False, False))
                node, idx = "g", d
        elif node == "ce":
            i = idx
            kind = _call_label(g, i)
            where = f"{_api(names[g.c_name[i]])} in {_where_call(g, i)}"
            if int(s.c_end_by[i]) == BY_WAIT and int(s.c_waited[i]) >= 0:
                w = int(s.c_waited[i])
                out.append((float(s.g_end[w]), float(s.c_end[i]), kind, where, True, False))
                node, idx = "g", w
            else:
                out.append((float(s.c_start[i]), float(s.c_end[i]), kind, where, False, False))
                node, idx = "cs", i
        else:  # "cs": the CPU time before the call
            i = idx
            p = int(g.c_pred[i])
            if p < 0 or s.c_start[i] <= t_stop:
                break
            where = g.range_names[int(g.c_gap_range[i])]
            label = "cpu:data" if _DATA.search(where) else "cpu:python"
            out.append((float(s.c_end[p]), float(s.c_start[i]), label, where, False, False))
            node, idx = "ce", p
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
