"""Replay a step graph: each node starts when its predecessors are done (Daydream's scheduler).

Calls run one after the other on the CPU chain, in the order they ran; a GPU operation starts
when its launch call has issued it, its stream's previous operation is done and any operation of
another stream it waits for is done; a call that consumes what other processes prepare (a
DataLoader's workers, ``c_ready``) starts no earlier than they have it ready; a call that puts
work on the GPU returns no earlier than the launch queue has a slot for it. ``host`` scales
every CPU duration (the gaps between calls and the calls' own time): the calibration finds the
scale at which the replay runs as fast as the program without a profiler. Replaying the unmodified graph with ``host=1`` reproduces the trace.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from profkit.run.step.graph import StepGraph, Wait, queue_entries

# How a node's start (GPU) or end (call) was bound, for the critical path.
BY_LAUNCH, BY_STREAM, BY_DEP, BY_FIXED = 0, 1, 2, 3
BY_OWN, BY_WAIT = 0, 1


@dataclass
class Schedule:
    """Simulated times (ns on the trace's timeline) and what bound each node."""
    c_start: np.ndarray
    c_end: np.ndarray
    c_end_by: np.ndarray       # BY_OWN or BY_WAIT
    c_waited: np.ndarray       # the operation whose end released a waiting call, or -1
    g_start: np.ndarray
    g_end: np.ndarray
    g_by: np.ndarray           # BY_LAUNCH, BY_STREAM, BY_DEP, BY_FIXED
    periods: np.ndarray        # each iteration's simulated period
    starts: np.ndarray         # each iteration's simulated start (the periods run from these)
    end_ns: float              # the window's simulated end
    host: float

    @property
    def iteration_ns(self) -> float:
        """The median iteration: what the step takes (as the window measures it)."""
        return float(np.median(self.periods)) if len(self.periods) else 0.0

    @property
    def mean_iteration_ns(self) -> float:
        """The window's simulated length over its iterations. Unlike the median of the periods it
        never grows when a node of the graph gets shorter: what-ifs are priced on it."""
        return float(self.end_ns - self.starts[0]) / len(self.starts) if len(self.starts) else 0.0


def simulate(g: StepGraph, host: float = 1.0) -> Schedule:
    """Replay ``g`` with every CPU duration scaled by ``host``."""
    n, m = g.n_calls, g.n_ops
    c_start = np.zeros(n)
    c_end = np.zeros(n)
    c_end_by = np.full(n, BY_OWN, dtype=np.int8)
    c_waited = np.full(n, -1, dtype=np.int64)
    g_start = g.g_start.astype(np.float64)
    g_end = g.g_end.astype(np.float64)
    g_by = np.full(m, BY_FIXED, dtype=np.int8)
    n_streams = max(len(g.streams), 1)
    last_end = np.full(n_streams, -np.inf)
    last_op = np.full(n_streams, -1, dtype=np.int64)
    dev_of = np.array([s[0] for s in g.streams] or [0], dtype=np.int64)
    i64, f64 = np.int64, np.float64
    dur = np.where(g.g_host_paced, g.g_dur * host, g.g_dur).astype(f64)
    prev, qgap, stream = g.g_prev.astype(i64), g.g_qgap.astype(f64), g.g_stream.astype(i64)
    anchor = float(g.c_start[0]) if n else 0.0
    offset = (g.c_start - (g.c_start[0] if n else 0)).astype(f64)
    # The launch queue, per device: the operation whose end frees each entry, in queued order.
    entries = queue_entries(g.c_queue if g.c_queue is not None else np.diff(g.ops_ptr) > 0,
                            g.ops_ptr, g.ops_idx, g.g_call, g.g_start, g.g_dev)
    # A call that takes a slot finds the entries queued before it (those already on the GPU when
    # the window opens, then one per earlier call that took one): when they are ``depth`` or more,
    # the queue is full and it waits for the entry ``depth`` places back. Which entry that is does
    # not depend on the times: found here once, not by keeping the queue in the loop.
    depth = int(g.queue_depth)
    q_ref_of = np.full(n, -1, dtype=i64)
    for d, (ops_, calls_) in entries.items():
        at = np.flatnonzero(calls_ >= 0)
        full = at[at >= depth]
        q_ref_of[calls_[full]] = ops_[full - depth]
    ready = np.full(n, -np.inf)
    if g.c_ready is not None:
        ready = np.where(np.isnan(g.c_ready), -np.inf, anchor + g.c_ready * host).astype(f64)
    queued = (np.flatnonzero(g.g_call < 0), g.g_call.astype(i64), prev, qgap, dur, stream, g_start,
              g_end, last_end, last_op)
    calls = (anchor, offset, g.c_pred.astype(i64), (g.c_gap * host).astype(f64),
             (g.c_own * host).astype(f64), ready, q_ref_of, float(g.queue_wake_ns),
             g.ops_ptr.astype(i64), g.ops_idx.astype(i64), g.c_wait.astype(i64),
             g.c_wait_arg.astype(i64), g.c_wake.astype(f64), int(Wait.STREAM), int(Wait.DEVICE),
             prev, g.g_lat.astype(f64), qgap, g.g_dep.astype(i64), g.g_dep_delta.astype(f64), dur,
             stream, dev_of, g_start, g_end, g_by, last_end, last_op, c_start, c_end, c_end_by,
             c_waited)
    compiled = _compiled(n + m)
    if compiled is not None:
        try:
            compiled[0](*queued)
            compiled[1](*calls)
        except ImportError:
            # A cached compilation numba cannot load (made for this file under another module's
            # name): compiled code is given up for the process, this replay starts again.
            _give_up_compiling()
            return simulate(g, host)
    else:
        # Interpreted, the same functions run fastest on lists; the times come back into the arrays.
        lists = {id(a): a.tolist() for a in (*queued, *calls) if isinstance(a, np.ndarray)}
        _queued(*[lists.get(id(a), a) for a in queued])
        _calls(*[lists.get(id(a), a) for a in calls])
        for a in (g_start, g_end, g_by, c_start, c_end, c_end_by, c_waited):
            a[:] = lists[id(a)]
    starts, end = _starts(g, c_start, c_end, g_start, g_end, host)
    periods = np.diff(np.append(starts, end))
    return Schedule(c_start, c_end, c_end_by, c_waited, g_start, g_end, g_by, periods, starts, end,
                    host)


# The replay's sequential part, the two functions below, runs compiled by numba once a step is
# large enough to pay for it: the same IEEE double additions and comparisons in the same order as
# the Python they are written in, so the times are those of the interpreted loop, bit for bit
# (tests/test_replay_compiled.py). Every price is a replay; a corpus step of 20k-120k calls took
# 20-120 ms a replay interpreted and 1-5 ms compiled, and a classify asks for tens of them. Below
# COMPILE_FROM calls and operations the interpreted loop is done before numba is imported (0.5 s,
# 100 MB); once it is, every replay of the process runs compiled. Without numba (an install that
# skipped the dependencies) every replay runs interpreted: slower, the same times.
COMPILE_FROM = 30_000
_loops: tuple | None = None
_no_numba = False
_loops_lock = threading.Lock()


def _give_up_compiling() -> None:
    global _loops, _no_numba
    with _loops_lock:
        _loops, _no_numba = None, True


def _compiled(size: int) -> tuple | None:
    """The compiled (_queued, _calls), or None where the interpreted ones are cheaper."""
    global _loops, _no_numba
    if _loops is None and size >= COMPILE_FROM and not _no_numba:
        with _loops_lock:
            if _loops is None and not _no_numba:
                try:
                    from numba import njit  # compiled once per machine: cached beside this module
                except ImportError:
                    _no_numba = True
                    return None
                # boundscheck: an index out of range raises IndexError, as the interpreted loop
                # does, instead of reading past an array (10% of a replay's time)
                def both(**cache) -> tuple:
                    jit = njit(nogil=True, boundscheck=True, **cache)
                    return jit(_queued), jit(_calls)
                try:
                    _loops = both(cache=True)
                except RuntimeError:  # nowhere writable to cache it: compiled in each process
                    _loops = both()
    return _loops


def _queued(queued, g_call, prev, qgap, dur, stream, g_start, g_end, last_end, last_op):
    """Work already queued when the window opens (``queued``, in stream order): the first of each
    stream starts when it did, the others back to back after it as they ran, each at its
    (possibly edited) duration. A GPU-bound step's full launch queue holds several iterations."""
    for op in queued:
        pv = prev[op]
        if pv >= 0 and g_call[pv] < 0:
            g_start[op] = g_end[pv] + qgap[op]
        g_end[op] = g_start[op] + dur[op]
        s = stream[op]
        if g_end[op] > last_end[s]:
            last_end[s] = g_end[op]
            last_op[s] = op


def _calls(anchor, offset, pred, gap, own, ready, q_ref_of, q_wake, ptr, idx, wait, warg, wake,
           WS, WD, prev, lat, qgap, dep, dep_d, dur, stream, dev_of, gs, ge, gb, last_end,
           last_op, cs, ce, c_by, c_wt):
    """One pass over the calls in the order they ran (the CPU chain), each call's operations
    after it; fills the calls' and operations' times and what bound each."""
    neg = -np.inf
    for i in range(len(pred)):
        p = pred[i]
        t = (ce[p] + gap[i]) if p >= 0 else anchor + offset[i]
        if ready[i] > t:
            t = ready[i]
        cs[i] = t
        q_ref = q_ref_of[i]
        q_rel = ge[q_ref] + q_wake if q_ref >= 0 else neg
        issue = t if q_rel <= t else q_rel
        for k in range(ptr[i], ptr[i + 1]):
            op = idx[k]
            s = issue + lat[op]
            by = BY_LAUNCH
            pv = prev[op]
            if pv >= 0:
                r = ge[pv] + qgap[op]
                if r > s:
                    s, by = r, BY_STREAM
            d = dep[op]
            if d >= 0:
                r = ge[d] + dep_d[op]
                if r > s:
                    s, by = r, BY_DEP
            gs[op] = s
            e = s + dur[op]
            ge[op] = e
            gb[op] = by
            st = stream[op]
            if e > last_end[st]:
                last_end[st] = e
                last_op[st] = op
        e = t + own[i]
        if q_rel > e:
            e = q_rel
            c_by[i] = BY_WAIT
            c_wt[i] = q_ref
        w = wait[i]
        if w:
            if w == WS:
                a = warg[i]
                if a >= 0:
                    rel, ref = last_end[a], last_op[a]
                else:
                    rel, ref = neg, -1
            elif w == WD:
                rel, ref = neg, -1
                for st in range(len(last_end)):
                    if dev_of[st] == warg[i] and last_end[st] > rel:
                        rel, ref = last_end[st], last_op[st]
            else:  # WO
                ref = warg[i]
                rel = ge[ref] if ref >= 0 else neg
            r = rel + wake[i]
            if r > e:
                e = r
                c_by[i] = BY_WAIT
                c_wt[i] = ref
        ce[i] = e


# Replays kept by StepGraph.replay_key, least recently asked first: the calibration, the rules,
# the combinations and the trials ask for the same replay again (a fix priced alone, then in each
# combination that holds it; a program priced again at another run's speed). A corpus trace's
# replay keeps 0.1-5 MB; a window of a million kernels about 8 MB.
KEPT_REPLAYS_BYTES = 256 << 20
_kept: OrderedDict[bytes, tuple[Schedule, int]] = OrderedDict()
_kept_bytes = 0
_kept_lock = threading.Lock()


def replay(graph: StepGraph, host: float) -> Schedule:
    """simulate(graph, host), kept: a later replay of the same graph at the same scale returns
    the same Schedule (its arrays read-only)."""
    global _kept_bytes
    key = graph.replay_key(host)
    with _kept_lock:
        hit = _kept.get(key)
        if hit is not None:
            _kept.move_to_end(key)
            return hit[0]
    sched = simulate(graph, host)
    arrays = (sched.c_start, sched.c_end, sched.c_end_by, sched.c_waited, sched.g_start,
              sched.g_end, sched.g_by, sched.periods, sched.starts)
    for a in arrays:
        a.flags.writeable = False  # shared by every caller that asks again
    size = sum(a.nbytes for a in arrays)
    with _kept_lock:
        if key not in _kept:
            _kept[key] = (sched, size)
            _kept_bytes += size
        while _kept_bytes > KEPT_REPLAYS_BYTES and len(_kept) > 1:
            _kept_bytes -= _kept.popitem(last=False)[1][1]
    return sched


def _starts(g: StepGraph, c_start, c_end, g_start, g_end, host: float) -> tuple[np.ndarray, float]:
    """Each iteration's start and the window's end, as the window defines its periods: from the
    first GPU start of the work launched in an iteration to the next one's (GPU-side), or from
    call to call (CPU-side)."""
    n = g.n_calls
    end = max(float(c_end[-1]) if n else -np.inf, float(g_end.max()) if g.n_ops else -np.inf)
    # The CPU time after the last call (the next iteration's preparation) runs at the host's
    # pace, and no earlier than the workers have the next batch ready.
    end = end + g.tail_ns * host if np.isfinite(end) else float(g.end_ns)
    if not np.isnan(g.tail_ready) and n:
        end = max(end, float(g.c_start[0]) + g.tail_ready * host)
    bounds = g.iter_call
    k = len(bounds) - 1
    if k <= 0 or n == 0:
        return np.array([c_start[0] if n else 0.0]), end
    if g.gpu_periods and g.n_ops:
        call_of = g.g_call
        ok = call_of >= 0
        it = np.searchsorted(bounds, call_of[ok], side="right") - 1
        first = np.full(k, np.inf)
        np.minimum.at(first, np.clip(it, 0, k - 1), g_start[ok])
        if np.isfinite(first).all():
            starts = first
        else:
            starts = c_start[np.minimum(bounds[:-1], n - 1)]
    else:
        starts = c_start[np.minimum(bounds[:-1], n - 1)]
    return starts, end
