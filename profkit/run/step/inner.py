"""The profiler's cost on the host, measured range by range.

Under Nsight Systems the host's CUDA calls and the dispatch around them run slower; Python that
makes no CUDA call (a tokenizer, numpy over copied logits, a loader decoding images) hardly does.
One CPU scale fitted to the step's period prices both alike, and where the period is set by the
GPU, by a pageable copy or by that Python, the period cannot say how much the launches were
slowed: a scoring loop that copies 66 MB of logits to pageable memory and reduces them with numpy
(an H200) ran as long without the profiler as under it (+0% host time from tracing, the CPU scale
1.00), and its forward's 184 calls, 4.1 ms of host time under the profiler, stayed at that speed
in every price: with the copy gone, 5.2 ms predicted, 2.5 ms measured.

The calibration run times the host time of each range opened directly inside the step's range
(profkit.capture.calibrate, ``inner_ns``); the trace holds the same ranges under the profiler.
Their ratio is the CPU scale of the work in each such range, measured: the model's calls in it
(their own CPU time, and the time before each whose middle lies in it) run at that scale, and
the calibration fits the rest to the period as before (profkit.run.step.calibrate). A range is
measured only where all of this holds:

* the calibration run timed it in at least MIN_ITERATIONS steady iterations, and the window holds
  it in every iteration;
* its host time under the profiler is the host's own work: the CPU time of the calls in it (their
  own time and the time before them) covers at least MIN_CPU_SHARE of the range (a range that
  waits for a sync, a blocking copy or a full launch queue times the GPU as much as the host);
* the ratio lies between MIN_SCALE and 1 + NOISE: the profiler only adds host time, so a range
  that ran slower without it ran on a machine whose speed had changed.

A capture made before ``inner_ns`` was recorded, or a program with no range inside its step
range, is calibrated by its period alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from profkit.run.step.calibrate import steady_ranges
from profkit.run.step.graph import StepGraph
from profkit.run.window import main_threads

MIN_ITERATIONS = 3
MIN_CPU_SHARE = 0.9
MIN_SCALE = 0.2
NOISE = 0.03


@dataclass(frozen=True)
class RangeScales:
    """The measured CPU scale of each range inside the step's range, and per call of the graph
    the scale its own CPU time and the time before it run at (NaN: not measured)."""
    scales: dict            # range name -> unprofiled host time over profiled
    own: np.ndarray         # per call
    gap: np.ndarray         # per call

    def graph_at(self, g: StepGraph, host: float) -> StepGraph:
        """``g`` with the measured calls' CPU time rescaled so that, replayed at CPU scale
        ``host``, they run at their measured scale (the rest at ``host``)."""
        out = g.copy()
        h = max(float(host), 1e-9)
        m = ~np.isnan(self.own)
        out.c_own[m] = g.c_own[m] * (self.own[m] / h)
        m = ~np.isnan(self.gap)
        out.c_gap[m] = g.c_gap[m] * (self.gap[m] / h)
        return out


def unprofiled_inner(runs: list[dict], delimiter: str) -> dict[str, list[float]]:
    """Per range name, its host time (ns) in each steady iteration of the calibration ``runs``
    (``inner_ns`` of the instances of ``delimiter``; the first iterations and set-up left out as
    the calibration leaves them out); iterations that did not open it count as none."""
    out: dict[str, list[float]] = {}
    for run in runs:
        steady = steady_ranges(run, delimiter, MIN_ITERATIONS + 1)
        timed = [_timed(r.get("inner_ns")) for r in steady]
        for k in {k for t in timed for k in t}:
            out.setdefault(k, []).extend(t.get(k, 0.0) for t in timed)
    return out


def _timed(inner_ns: object) -> dict[str, float]:
    """A step's ``inner_ns`` as recorded, its entries that are not a time left out (a file written
    by hand or damaged is read, never raised on)."""
    if not isinstance(inner_ns, dict):
        return {}
    return {str(k): float(v) for k, v in inner_ns.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}


def profiled_inner(trace, g: StepGraph) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The ranges directly inside the window's instances of its delimiting range on the main
    thread: (name, starts, ends) of every instance, by name."""
    w = g.window
    user = trace.user_ranges
    if user.empty or not w.delimiter or not w.iteration_ns:
        return []
    mains = set(main_threads(user).values())
    r = user[user["globalTid"].isin(mains) & (user["start"] >= w.start_ns) & (user["end"] <= w.end_ns)]
    if r.empty:
        return []
    codes, names = trace.range_codes_of(r)
    name = np.asarray(names, dtype=object)[codes]
    st, en = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
    tid = r["globalTid"].to_numpy(np.int64)
    order = np.lexsort((-en, st, tid))
    parent = np.full(len(st), -1, dtype=np.int64)
    stack: list[int] = []
    last_tid = None
    for i in order:
        if tid[i] != last_tid:
            stack, last_tid = [], tid[i]
        while stack and en[stack[-1]] <= st[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    step = (name == w.delimiter) & (parent < 0)
    child = (parent >= 0) & np.isin(parent, np.flatnonzero(step))
    out = []
    for k in sorted({str(x) for x in name[child]}):
        sel = np.flatnonzero(child & (name == k))
        sel = sel[np.argsort(st[sel], kind="stable")]
        out.append((k, st[sel], en[sel]))
    return out


def measure(trace, g: StepGraph, runs: list[dict]) -> Optional[RangeScales]:
    """The measured CPU scales of ``g``'s ranges (see the module docstring); None where none is
    measured."""
    if not runs or not g.window.delimiter or g.n_calls == 0:
        return None
    unprof = unprofiled_inner(runs, g.window.delimiter)
    if not unprof:
        return None
    prof = profiled_inner(trace, g)
    bounds = np.asarray(g.window.iteration_bounds_ns, dtype=np.int64)
    its = len(bounds) - 1
    mid = g.c_start - g.c_gap / 2
    own = np.full(g.n_calls, np.nan)
    gap = np.full(g.n_calls, np.nan)
    scales: dict[str, float] = {}
    for k, st, en in prof:
        times = unprof.get(k) or []
        if len(times) < MIN_ITERATIONS or its < 1:
            continue
        per_it = np.bincount(np.clip(np.searchsorted(bounds, st, side="right") - 1, 0, its - 1),
                             weights=(en - st).astype(float), minlength=its)
        if (per_it <= 0).any():
            continue
        # the calls whose own time starts in an instance, and the gaps whose middle lies in one
        inst_of = np.searchsorted(st, g.c_start, side="right") - 1
        in_own = (inst_of >= 0) & (g.c_start < en[np.clip(inst_of, 0, len(en) - 1)])
        inst_gap = np.searchsorted(st, mid, side="right") - 1
        in_gap = (inst_gap >= 0) & (mid < en[np.clip(inst_gap, 0, len(en) - 1)])
        work = float(g.c_own[in_own].sum() + g.c_gap[in_gap].sum())
        if work < MIN_CPU_SHARE * float((en - st).sum()):
            continue
        s = float(np.median(times)) / float(np.median(per_it))
        if not MIN_SCALE <= s <= 1.0 + NOISE:
            continue
        s = min(s, 1.0)
        scales[k] = s
        own[in_own], gap[in_gap] = s, s
    return RangeScales(scales, own, gap) if scales else None
