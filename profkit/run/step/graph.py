"""The step graph: the judged window's CPU and GPU work as a dependency graph that can be replayed.

Nodes are the CUDA API calls of the busiest process (one chain of CPU work, in the order the
calls ran) and the GPU operations they launched (kernels, copies, memsets, per stream). Each node
keeps what the trace measured as parameters of its dependencies, so that replaying the graph
unmodified reproduces the trace (profkit.run.step.simulate):

* a call starts ``gap`` after its CPU predecessor ends: the CPU time between two calls (Python,
  the framework, data preparation). The predecessor is the call that ended last before it
  started, on any thread of the process, so the hand-off between PyTorch's main thread and its
  autograd thread (the main thread waits in ``backward()`` while the other launches) is an edge;
* a call ends ``own`` after it starts, or, when it waits for the GPU, ``wake`` after the GPU work
  it waits for ends: a stream or device synchronisation, a device-to-host or pageable copy,
  ``cudaFree`` (waits for the device), an allocation that synchronised;
* a call that puts work on the GPU takes a slot of the device's launch queue, which holds
  ``queue_depth`` entries (1,022 on the H200, measured from the launches that found it full): a
  call that finds it full returns ``queue_wake`` after the entry ``queue_depth`` places earlier
  ended. A GPU-bound step's CPU spends most of its time there; when the GPU gets faster, so does
  the CPU;
* a GPU operation starts at the later of ``lat`` after its launch call starts, ``qgap`` after the
  previous operation of its stream ends, and ``dep_delta`` after an operation of another stream it
  waited for ends: the event wait the trace names (``cudaStreamWaitEvent``, matched to the
  ``cudaEventRecord`` it waits for by CUPTI's event and synchronization records: the last
  operation launched on the recording stream before the record), else one inferred from the
  timeline (an operation held past its own constraints that started right after another
  stream's ended). A wait the timeline cannot show (the launch came after the event was already
  reached, as in a host-bound step) still holds once an edit removes the host's time: a packed
  LSTM's cuDNN side streams, their waits unnamed, overlapped in a replay of CUDA graphs and
  promised an iteration shorter than its kernels' own time.

Work already on the GPU when the window opens (launched before it) is kept at its measured times.
"""
from __future__ import annotations

import hashlib
import re
import weakref
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Optional

import numpy as np
import pandas as pd

from profkit.read.nsys import match_names
from profkit.run.summary import _kernel_family
from profkit.run.window import LIBRARY_RANGE_RE, Window, main_threads, _primary_pid


class CallKind(IntEnum):
    """What a CUDA API call does, for the model (closed set)."""
    LAUNCH = 0        # a kernel launch
    GRAPH_LAUNCH = 1  # a CUDA graph replay
    SYNC = 2          # stream/device/event synchronize
    COPY = 3          # a memcpy (blocking or not: see the wait)
    MEMSET = 4
    ALLOC = 5         # cudaMalloc and the driver's allocation calls
    FREE = 6          # cudaFree and friends
    EVENT = 7         # event record/query, stream wait event
    OTHER = 8


class Wait(IntEnum):
    """What GPU work a call waits for."""
    NONE = 0
    STREAM = 1   # every earlier operation of one stream
    DEVICE = 2   # every earlier operation of the device
    OP = 3       # one operation (its own copy; the operation a full launch queue waited on)


CALL_KINDS = [
    (CallKind.GRAPH_LAUNCH, re.compile(r"^cu(da)?GraphLaunch")),
    (CallKind.LAUNCH, re.compile(r"^cu(da)?Launch|^cudaLaunch")),
    (CallKind.SYNC, re.compile(r"^cu(da)?(Device|Ctx|Stream|Event)Synchronize|^cudaThreadSynchronize")),
    (CallKind.COPY, re.compile(r"^cu(da)?Memcpy")),
    (CallKind.MEMSET, re.compile(r"^cu(da)?Memset")),
    (CallKind.FREE, re.compile(r"^cu(da)?(Free|MemFree|MemRelease|MemUnmap|MemAddressFree|FreeHost|"
                               r"HostUnregister|MemPoolTrim)")),
    (CallKind.ALLOC, re.compile(r"^cu(da)?(Malloc|MemAlloc|MemCreate|MemMap|MemSetAccess|"
                                r"MemAddressReserve|HostAlloc|MallocHost|HostRegister|MemHostAlloc)")),
    (CallKind.EVENT, re.compile(r"^cu(da)?(Event|StreamWaitEvent)")),
]
DEVICE_SYNC_RE = re.compile(r"^cu(da)?(DeviceSynchronize|CtxSynchronize|ThreadSynchronize|EventSynchronize)")
STREAM_SYNC_RE = re.compile(r"^cu(da)?StreamSynchronize")
# A synchronous memcpy (no Async): the legacy default stream waits for the device.
SYNC_COPY_RE = re.compile(r"^cu(da)?Memcpy(?!.*Async)")
FREE_WAITS_RE = re.compile(r"^cu(da)?Free(_v\d+)?$|^cuMemFree")  # cudaFree waits for the device
PAGEABLE, PINNED = 0, 1  # ENUM_CUDA_MEM_KIND
D2H, H2D = 2, 1          # copyKind

# Below these the measured delay is the hardware's own; above, something else held the work.
TOLERANCE_NS = 2_000
BLOCKED_FACTOR = 10.0     # a call this many times its name's median (and >= BLOCKED_MIN_NS) waited
BLOCKED_MIN_NS = 50_000
DEFAULT_LAT_NS = 3_000.0  # launch call start -> kernel start when nothing else held it
DEFAULT_QGAP_NS = 1_000.0  # previous kernel's end -> next kernel's start when queued
LAT_SAMPLE = 20           # launches clear of their stream that make a stream's typical latency
DEFAULT_WAKE_NS = 5_000.0  # GPU work done -> the waiting call returns
# Measured on the H200 (driver 580.159.04, traces of 2026-12-01): a launch blocks once 1,022
# calls' work is outstanding on the device, and returns 6-17 us after the oldest of them ends.
# Used when the trace never fills the queue (its depth cannot be read from it then).
DEFAULT_QUEUE_DEPTH = 1_022
QUEUE_FIT_NS = 50_000      # a full-queue launch returns within this of the release it waited for
DEFAULT_QUEUE_WAKE_NS = 8_000.0  # ... and this after it, typically (measured 6-17 us)
# A launch queue holds hundreds of entries: a host-bound step, whose GPU finishes each kernel
# before the next launch, has a few outstanding at most, and its launches returning after the
# previous kernel ended says nothing of the queue's depth.
MIN_QUEUE_DEPTH = 64
# An operation held past its own constraints waited for the latest-ending operation of another
# stream launched before it, within this: cuDNN's eight side streams of grouped convolutions
# start 1-10 us after each other's ends (launched later: not what they waited for) and 10-20 us
# after the event of the main stream that released them.
DEP_FIT_NS = 50_000
DEPTH_SLACK = 3            # places below the depth a held call's release may be (several streams)


# The fields a transformation may change (profkit.run.step.transform and the rules' edits): a
# copy of the graph copies these and shares the rest.
EDITABLE = frozenset({"c_gap", "c_own", "c_wait", "c_wake", "c_queue", "c_ready", "g_dur", "g_qgap",
                      "g_host_paced", "tail_ns", "tail_ready"})
# ... and those the replay never reads (names and labels; notes added as the model is built).
NOT_REPLAYED = frozenset({"window", "call_names", "op_names", "range_names", "notes"})


@dataclass
class StepGraph:
    """The window's work as arrays (calls: ``c_*``, in the order they ran; GPU operations:
    ``g_*``). Times are ns on the trace's timeline; see the module docstring for the edges."""
    window: Window
    call_names: np.ndarray       # distinct API names
    c_start: np.ndarray
    c_end: np.ndarray
    c_name: np.ndarray           # index into call_names
    c_kind: np.ndarray           # CallKind
    c_tid: np.ndarray
    c_pred: np.ndarray           # CPU predecessor (index) or -1
    c_gap: np.ndarray            # ns of CPU work between the predecessor's end and this start
    c_own: np.ndarray            # ns of the call's own CPU time
    c_wait: np.ndarray           # Wait
    c_wait_arg: np.ndarray       # stream index (STREAM), device (DEVICE) or op index (OP)
    c_wake: np.ndarray           # ns from the awaited work's end to the call's return
    c_range: np.ndarray          # index into range_names: the innermost user range open at the call
    c_gap_range: np.ndarray      # the same at the middle of the CPU time before the call
    range_names: list[str]
    op_names: np.ndarray
    g_start: np.ndarray
    g_end: np.ndarray
    g_dur: np.ndarray
    g_stream: np.ndarray         # index into streams
    g_dev: np.ndarray
    g_call: np.ndarray           # the launching call, -1 for work launched before the window
    g_prev: np.ndarray           # previous operation of the stream, -1 for none
    g_lat: np.ndarray
    g_qgap: np.ndarray
    g_dep: np.ndarray            # operation of another stream it waited for, -1 for none
    g_dep_delta: np.ndarray
    g_family: np.ndarray         # index into FAMILIES (compute, memory, launch, communication)
    g_name: np.ndarray           # index into op_names
    g_corr: np.ndarray           # correlation id (with g_start, the key of the trace's activity)
    g_bytes: np.ndarray          # bytes of a copy or memset (NaN for kernels)
    g_kind: np.ndarray           # 0 kernel, 1 memcpy, 2 memset
    g_host_paced: np.ndarray     # a copy from or to pageable memory: the CPU stages it, so it runs at the host's speed
    streams: list[tuple[int, int]]
    ops_ptr: np.ndarray          # CSR: the operations call i launched are ops_idx[ops_ptr[i]:ops_ptr[i+1]]
    ops_idx: np.ndarray
    iter_call: np.ndarray        # first call of each iteration, then len(calls)
    measured_periods: np.ndarray  # the window's measured iteration periods (ns)
    gpu_periods: bool            # periods are GPU-side (first GPU start to the next)
    end_ns: int                  # the window's end
    notes: list[str] = field(default_factory=list)
    # CPU work (ns, scaled like every CPU duration) that other processes must have finished, from
    # the window's start, before a call may start; NaN for none. Set by load_in_workers (data
    # prepared by DataLoader workers): None in a graph built from a trace.
    c_ready: Optional[np.ndarray] = None
    # Launch queue: whether a call takes a slot of it (it put work on the GPU; a CUDA graph's
    # replayed launches take none but the first), its depth and wake-up (see the module docstring).
    c_queue: Optional[np.ndarray] = None
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    queue_wake_ns: float = DEFAULT_QUEUE_WAKE_NS
    # The CPU time after the window's last call and operation, up to its end (the next batch's
    # loading, when the loop prepares data between steps), scaled like every CPU duration; the
    # range open in the middle of it; and, set by load_in_workers, when (ns of CPU from the
    # window's start) the workers have the batch after the window ready.
    tail_ns: float = 0.0
    tail_range: int = -1
    tail_ready: float = float("nan")
    # Host time (ns, as profiled) that profkit's aten recorder added in the window: the cost per
    # op it measured when it started, times the ops it recorded there; 0 without the recorder.
    recorded_ns: float = 0.0

    @property
    def n_calls(self) -> int:
        return len(self.c_start)

    @property
    def n_ops(self) -> int:
        return len(self.g_start)

    def launched_by(self, calls) -> np.ndarray:
        """The operations the ``calls`` launched, call by call."""
        calls = np.asarray(calls, dtype=np.int64)
        lo, n = self.ops_ptr[calls], self.ops_ptr[calls + 1] - self.ops_ptr[calls]
        # each call's slice of ops_idx, in the calls' order: one index array, no slice per call
        at = np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
        return self.ops_idx[at].astype(np.int64, copy=False)

    def copy(self) -> "StepGraph":
        """A copy whose editable arrays (EDITABLE) a transformation may change. The others, the
        trace's structure, are shared with this graph and made read-only in both: an edit that
        wrote to one would change every copy, so it fails instead."""
        self.freeze()
        return StepGraph(**{k: (v.copy() if k in EDITABLE and isinstance(v, np.ndarray) else
                                (list(v) if isinstance(v, list) else v))
                            for k, v in self.__dict__.items()})

    def freeze(self) -> "StepGraph":
        """Make the trace's structure (every array but the EDITABLE ones) read-only."""
        for k, v in self.__dict__.items():
            if isinstance(v, np.ndarray) and k not in EDITABLE:
                v.flags.writeable = False
        return self

    def replay_key(self, host: float) -> bytes:
        """A digest of what a replay at ``host`` depends on: equal keys give equal replays
        (profkit.run.step.simulate.replay). A read-only array (the structure a copy shares) is
        digested once, however many edited copies share it."""
        digest = hashlib.blake2b(repr(float(host)).encode(), digest_size=20)
        for k, v in self.__dict__.items():
            if k in NOT_REPLAYED:
                continue
            if isinstance(v, np.ndarray):
                digest.update(k.encode())
                digest.update(_frozen_digest(v) if not v.flags.writeable else _digest(v))
            else:
                digest.update(f"{k}={v!r};".encode())
        return digest.digest()


def _digest(a: np.ndarray) -> bytes:
    d = hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode(), digest_size=20)
    d.update(np.ascontiguousarray(a).data)
    return d.digest()


_FROZEN: dict[int, tuple[weakref.ref, bytes]] = {}


def _frozen_digest(a: np.ndarray) -> bytes:
    """The digest of a read-only array, kept while the array lives (it cannot change)."""
    hit = _FROZEN.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    d = _digest(a)
    key = id(a)
    _FROZEN[key] = (weakref.ref(a, lambda _r, k=key: _FROZEN.pop(k, None)), d)
    return d


def call_kinds(names: np.ndarray) -> np.ndarray:
    """CallKind per distinct API name."""
    out = np.full(len(names), int(CallKind.OTHER), dtype=np.int8)
    for i, n in enumerate(names):
        for kind, rx in CALL_KINDS:
            if rx.match(str(n)):
                out[i] = int(kind)
                break
    return out


# The model replays at most this many consecutive iterations, from the middle of the window: a
# steady state repeats itself, and every fix is priced by a few dozen replays.
MAX_ITERATIONS = 12
MAX_CALLS = 150_000       # ... and no more CUDA calls than this (a window of a million kernels)


# An iteration at either end of the window that took this many times the median period is not
# the steady state: a warm-up the set-up cut left in (a speculative decoder's second generation,
# 352 ms against 110; a static-cache decode's first modelled token, 9.9x), or a drain at the end.
# Modelled, it set the mean every price is taken on, and which iterations held it depended on how
# many the capture kept (the decoder's graph price 3.90x with 14 generations, 2.82x with 13).
EDGE_OUTLIER = 2.0
MIN_STEADY = 3


def steady_span(window: Window) -> tuple[int, int]:
    """The window's iterations [lo, hi) once those at either end that took EDGE_OUTLIER times the
    median period or more are left out (at least MIN_STEADY kept)."""
    per = np.asarray(window.periods_ns, dtype=np.float64)
    lo, hi = 0, len(per)
    if hi <= MIN_STEADY:
        return lo, hi
    med = float(np.median(per))
    while hi - lo > MIN_STEADY and per[lo] >= EDGE_OUTLIER * med:
        lo += 1
    while hi - lo > MIN_STEADY and per[hi - 1] >= EDGE_OUTLIER * med:
        hi -= 1
    return lo, hi


def modelled(window: Window, most: int = MAX_ITERATIONS) -> Window:
    """The ``most`` iterations in the middle of ``window``'s steady span (steady_span; the window
    itself when it has no more and no outlier at its ends)."""
    k = len(window.iteration_ns)
    lo, hi = steady_span(window)
    if hi - lo == k and k <= most:
        return window
    n = min(most, hi - lo)
    s = lo + (hi - lo - n) // 2
    starts = window.iteration_bounds_ns
    gpu = window.gpu_period_ns[s:s + n] if len(window.gpu_period_ns) == k else []
    return replace(window, start_ns=int(starts[s]), end_ns=int(starts[s + n]), iterations=n,
                   iteration_ns=list(window.iteration_ns[s:s + n]), gpu_period_ns=list(gpu),
                   source=f"{window.source}; iterations {s}..{s + n - 1} of it modelled")


def build(trace, window: Window, launch_floor_ns: float = 1_000.0) -> StepGraph:
    """The step graph of ``window`` in ``trace`` (the full trace, not a windowed view): of its
    iterations, the MAX_ITERATIONS in the middle."""
    window = modelled(window)
    pid = _primary_pid(trace)
    w0, w1 = int(window.start_ns), int(window.end_ns)
    calls = trace.api_calls_between(w0, w1)
    notes = []
    if len(calls) > MAX_CALLS:
        # A very long window: model the iterations (or, with one, the stretch) that the first
        # MAX_CALLS calls cover; a steady state repeats itself.
        cut = int(np.sort(calls["start"].to_numpy(np.int64))[MAX_CALLS])
        k = len(window.iteration_ns)
        if k > 1:
            starts = window.iteration_bounds_ns
            keep = min(max(int(np.searchsorted(starts, cut, side="right")) - 1, 1), k)
            gpu = window.gpu_period_ns[:keep] if len(window.gpu_period_ns) == k else []
            window = replace(window, iteration_ns=list(window.iteration_ns[:keep]),
                             gpu_period_ns=list(gpu), end_ns=int(starts[keep]), iterations=keep)
        else:
            window = replace(window, end_ns=cut, iteration_ns=[], gpu_period_ns=[])
        w1 = int(window.end_ns)
        calls = calls[calls["start"] <= w1]
        notes.append(f"the step model covers the first {len(calls)} CUDA calls of the window "
                     f"({(w1 - w0) / max(int(window.end_ns) - w0, 1):.0%} of it)")
    ctid = calls["globalTid"].to_numpy(np.int64)
    cst = calls["start"].to_numpy(np.int64)
    sel = (np.right_shift(ctid, 24) == pid) & (cst >= w0) & (cst <= w1) if pid is not None else \
        (cst >= w0) & (cst <= w1)
    calls = calls[sel]
    order = np.lexsort((calls["end"].to_numpy(np.int64), calls["start"].to_numpy(np.int64)))
    calls = calls.iloc[order].reset_index(drop=True)
    n = len(calls)
    if n == 0:
        # No CPU side to replay: a trace without the CUDA API table (captured without CUDA
        # tracing, or damaged), or a window whose calls another process made.
        raise ValueError("the window holds no CUDA API call of the program: capture with "
                         "`nsys profile -t cuda` or `profkit capture`")
    c_start = calls["start"].to_numpy(np.int64)
    c_end = calls["end"].to_numpy(np.int64)
    c_tid = calls["globalTid"].to_numpy(np.int64)
    codes, names = pd.factorize(calls["name"].astype(str))
    names = np.asarray(names, dtype=object)
    kinds_by_name = call_kinds(names)
    c_kind = kinds_by_name[codes] if n else np.empty(0, np.int8)

    # CPU predecessor: the call that ended last before this one started (any thread).
    end_order = np.argsort(c_end, kind="stable")
    k = np.searchsorted(c_end[end_order], c_start, side="right") - 1
    c_pred = np.where(k >= 0, end_order[np.maximum(k, 0)], -1)
    # A call cannot precede itself; ties of zero-length calls are broken by order.
    c_pred = np.where(c_pred >= np.arange(n), -1, c_pred)
    c_gap = np.where(c_pred >= 0, c_start - c_end[np.maximum(c_pred, 0)], 0).astype(np.float64)
    c_gap = np.maximum(c_gap, 0.0)

    # GPU operations of the window's calls, and the ones still running when it opens.
    acts = trace.activities
    a_pid = np.right_shift(acts["globalPid"].to_numpy(np.int64), 24)
    corr_to_call = pd.Series(np.arange(n), index=calls["correlationId"].to_numpy(np.int64))
    corr_to_call = corr_to_call[~corr_to_call.index.duplicated()]
    mine = (a_pid == pid) if pid is not None else np.ones(len(acts), bool)
    a_corr = acts["correlationId"].to_numpy(np.int64)
    call_of = corr_to_call.reindex(a_corr).to_numpy()
    in_win = mine & ~np.isnan(call_of)
    a_start = acts["start"].to_numpy(np.int64)
    a_end = acts["end"].to_numpy(np.int64)
    carry = mine & ~in_win & (a_end > w0) & (a_start <= w1) & \
        (acts["api_start"].fillna(-1).to_numpy() < w0)
    keep = in_win | carry
    ops = acts[keep]
    g_call = np.where(in_win[keep], call_of[keep], -1).astype(np.int64)
    g_start = ops["start"].to_numpy(np.int64)
    g_end = ops["end"].to_numpy(np.int64)
    dev = ops["deviceId"].to_numpy(np.int64)
    stream_keys = list(zip(dev.tolist(), ops["streamId"].to_numpy(np.int64).tolist()))
    s_codes, s_uniq = pd.factorize(pd.Series(stream_keys, dtype=object))
    streams = [tuple(x) for x in s_uniq]
    g_stream = s_codes.astype(np.int64)
    # Order: by stream, then start (FIFO per stream).
    o = np.lexsort((g_end, g_start, g_stream))
    g_call, g_start, g_end, dev, g_stream = g_call[o], g_start[o], g_end[o], dev[o], g_stream[o]
    ops = ops.iloc[o]
    m = len(g_start)
    g_dur = (g_end - g_start).astype(np.float64)
    g_prev = np.arange(m) - 1
    g_prev[(g_prev < 0) | (np.r_[True, g_stream[1:] != g_stream[:-1]])] = -1
    kind_map = {"kernel": 0, "memcpy": 1, "memset": 2}
    g_kind = ops["kind"].astype(str).map(kind_map).to_numpy(np.int8)
    ncodes, op_names = pd.factorize(ops["name"].astype(str))
    op_names = np.asarray(op_names, dtype=object)
    g_family = _kernel_family(ncodes, op_names, g_kind == 0, g_dur, launch_floor_ns).astype(np.int8)

    # Launch latency and queue gap: the measured delay of the binding constraint, the typical
    # value (median) of the other, never above what was measured.
    c_s = np.where(g_call >= 0, c_start[np.maximum(g_call, 0)], 0).astype(np.float64)
    c_e = np.where(g_call >= 0, c_end[np.maximum(g_call, 0)], 0).astype(np.float64)
    p_end = np.where(g_prev >= 0, g_end[np.maximum(g_prev, 0)], -np.inf).astype(np.float64)
    launch_delay = g_start - c_s
    queue_delay = g_start - p_end
    has_call = g_call >= 0
    # The cross-stream waits the trace names (event records): exact, found first, so that an
    # operation they held is not taken for a slow launch below
    g_dep = np.full(m, -1, dtype=np.int64)
    g_dep_delta = np.zeros(m)
    if len(streams) > 1:
        _event_waits(trace, calls, names, codes, corr_to_call, g_call, g_start, g_end, g_stream, streams,
                     pid, g_dep, g_dep_delta)
    held_by_event = (g_dep >= 0) & (g_end[np.maximum(g_dep, 0)] > c_s)
    clear_launch = has_call & ((g_prev < 0) | (p_end < c_s)) & ~held_by_event
    clear_queue = has_call & (g_prev >= 0) & (p_end > c_e)
    # The typical launch latency, from the stream that launched the most: another stream's
    # operations clear of their own stream may still wait for an event of the busy one (cuDNN's
    # side streams of grouped convolutions in a GPU-bound step: 12 ms after their launch). Where
    # that stream has fewer than LAT_SAMPLE launches clear of it (and of the waits the trace
    # names), all streams' are taken: a packed LSTM's busiest stream was a cuDNN side stream with
    # five, 17 ms each (each held by an event wait), and every operation of the step took that
    # for its launch latency, so no edit could start one sooner.
    main = np.bincount(g_stream[has_call], minlength=1).argmax() if has_call.any() else 0
    sample = clear_launch & (launch_delay >= 0)
    if int((sample & (g_stream == main)).sum()) >= LAT_SAMPLE:
        sample &= g_stream == main
    lat_med = _median(launch_delay[sample], DEFAULT_LAT_NS)
    qgap_med = _median(queue_delay[clear_queue & (queue_delay >= 0)], DEFAULT_QGAP_NS)
    launch_bound = has_call & ((g_prev < 0) | (c_s + lat_med >= p_end + qgap_med))
    g_lat = np.where(launch_bound, launch_delay, np.minimum(lat_med, launch_delay))
    g_qgap = np.where(launch_bound, np.minimum(qgap_med, queue_delay), queue_delay)
    g_lat = np.maximum(np.nan_to_num(g_lat, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
    g_qgap = np.maximum(np.nan_to_num(g_qgap, nan=0.0, posinf=0.0, neginf=0.0), 0.0)

    # Cross-stream waits the trace does not name: an operation held well past both of its own
    # constraints, that started right after an operation of another stream (launched earlier)
    # ended, waited for that one.
    if len(streams) > 1:
        own_ready = np.maximum(c_s + np.where(launch_bound, lat_med, g_lat),
                               p_end + np.where(launch_bound, g_qgap, qgap_med))
        late = g_start - own_ready > 5 * TOLERANCE_NS
        # the operations a wait held, named or inferred below: their own constraints then hold
        # at their typical values
        bound = held_by_event & late
        held = has_call & (g_dep < 0) & late
        if held.any():
            eo = np.argsort(g_end, kind="stable")
            ends = g_end[eo]
            for i in np.flatnonzero(held):
                j = np.searchsorted(ends, g_start[i], side="right") - 1
                while j >= 0 and g_start[i] - ends[j] <= DEP_FIT_NS:
                    d = eo[j]
                    if g_stream[d] != g_stream[i] and (g_call[d] < g_call[i]):
                        g_dep[i] = d
                        g_dep_delta[i] = float(g_start[i] - g_end[d])
                        bound[i] = True
                        break
                    j -= 1
        g_lat[bound] = np.minimum(lat_med, np.maximum(launch_delay[bound], 0.0))
        g_qgap[bound] = np.where(g_prev[bound] >= 0, np.minimum(qgap_med, np.maximum(queue_delay[bound], 0.0)),
                                 0.0)

    # The operations each call launched, in stream order.
    ci = g_call[g_call >= 0]
    gi = np.flatnonzero(g_call >= 0)
    oo = np.lexsort((g_start[gi], ci))
    ops_idx = gi[oo]
    ops_ptr = np.searchsorted(ci[oo], np.arange(n + 1), side="left").astype(np.int64)

    g_host_paced = _pageable_ops(trace, ops, g_kind)
    c_queue = np.diff(ops_ptr) > 0
    depth, q_wake, q_blocked = launch_queue(c_start, c_end, c_queue, ops_ptr, ops_idx, g_call,
                                            g_start, g_end, dev)
    c_wait, c_wait_arg, c_wake, c_own = _waits(trace, calls, names, codes, c_kind, c_start, c_end,
                                               g_call, g_start, g_end, g_stream, dev, streams,
                                               ops, ops_ptr, ops_idx, q_blocked)
    gap_mid = np.where(c_pred >= 0, (c_start + c_end[np.maximum(c_pred, 0)]) // 2, c_start)
    last = max(int(c_end[-1]) if n else w0, int(g_end.max()) if len(g_end) else w0)
    tail_ns = float(max(w1 - last, 0))
    range_names, (c_range, c_gap_range, t_range) = _call_ranges(
        trace, [c_start, gap_mid, np.array([(last + w1) // 2], dtype=np.int64)])
    iter_call, periods, gpu_side = _iterations(window, c_start, n)
    return StepGraph(window=window, call_names=names, c_start=c_start, c_end=c_end,
                     c_name=codes.astype(np.int64), c_kind=c_kind, c_tid=c_tid, c_pred=c_pred,
                     c_gap=c_gap, c_own=c_own, c_wait=c_wait, c_wait_arg=c_wait_arg, c_wake=c_wake,
                     c_range=c_range, c_gap_range=c_gap_range, range_names=range_names,
                     op_names=op_names,
                     g_start=g_start, g_end=g_end, g_dur=g_dur, g_stream=g_stream, g_dev=dev,
                     g_call=g_call, g_prev=g_prev, g_lat=g_lat, g_qgap=g_qgap, g_dep=g_dep,
                     g_dep_delta=g_dep_delta, g_family=g_family, g_name=ncodes.astype(np.int64),
                     g_corr=ops["correlationId"].to_numpy(np.int64),
                     g_bytes=ops["bytes"].to_numpy(np.float64),
                     g_kind=g_kind, g_host_paced=g_host_paced, streams=streams, ops_ptr=ops_ptr, ops_idx=ops_idx,
                     iter_call=iter_call, measured_periods=periods, gpu_periods=gpu_side,
                     end_ns=w1, notes=notes, c_queue=c_queue, queue_depth=depth,
                     queue_wake_ns=q_wake, tail_ns=tail_ns, tail_range=int(t_range[0]),
                     recorded_ns=_recorder_ns(trace, pid, w0, w1)).freeze()


def _recorder_ns(trace, pid: Optional[int], w0: int, w1: int) -> float:
    """The host time profkit's aten recorder added between ``w0`` and ``w1`` in process ``pid``:
    its measured cost per op (Trace.recorder_cost_ns) times the ops it recorded there."""
    cost = float(getattr(trace, "recorder_cost_ns", 0.0) or 0.0)
    if cost <= 0:
        return 0.0
    r = trace.ranges_of_level("aten")
    if r.empty:
        return 0.0
    st = r["start"].to_numpy(np.int64)
    sel = (st >= w0) & (st <= w1)
    if pid is not None:
        sel &= np.right_shift(r["globalTid"].to_numpy(np.int64), 24) == pid
    return float(sel.sum()) * cost


def queue_entries(c_queue: np.ndarray, ops_ptr: np.ndarray, ops_idx: np.ndarray,
                  g_call: np.ndarray, g_start: np.ndarray, g_dev: np.ndarray
                  ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per device, the launch queue's entries in the order they were queued: the operations
    already on the GPU when the window opens (by start), then the calls that take a slot, in
    order; as (operations whose end frees the slot: the call's last one, call or -1)."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    pre = np.flatnonzero(g_call < 0)
    pre = pre[np.argsort(g_start[pre], kind="stable")]
    calls = np.flatnonzero(c_queue & (np.diff(ops_ptr) > 0))
    last = ops_idx[ops_ptr[calls + 1] - 1] if len(calls) else np.empty(0, np.int64)
    first = ops_idx[ops_ptr[calls]] if len(calls) else np.empty(0, np.int64)
    for d in np.unique(g_dev):
        p, c = pre[g_dev[pre] == d], g_dev[first] == d
        out[int(d)] = (np.concatenate([p, last[c]]).astype(np.int64),
                       np.concatenate([np.full(len(p), -1), calls[c]]).astype(np.int64))
    return out


def launch_queue(c_start, c_end, c_queue, ops_ptr, ops_idx, g_call, g_start, g_end, dev
                 ) -> tuple[int, float, np.ndarray]:
    """The launch queue's depth, the wake-up of a call it held, and per call the end of the
    entry whose completion let it return when it found the queue full (NaN where it did not).

    The depth is the distance, in entries queued, from a call the full queue held back to the
    entry whose end let it return (_held_distance); each call that returned within DEPTH_SLACK
    places of it is a held one. A trace that never fills the queue says nothing of its depth:
    deeper than the most entries ever outstanding, at least DEFAULT_QUEUE_DEPTH."""
    n = len(c_start)
    release = np.full(n, np.nan)
    best, fits, wakes = 0, [], []
    per_dev = queue_entries(c_queue, ops_ptr, ops_idx, g_call, g_start, dev)
    for d, (ent_op, ent_call) in per_dev.items():
        ends = g_end[ent_op].astype(np.float64)
        rank = np.flatnonzero(ent_call >= 0)
        calls = ent_call[rank]
        if not len(calls):
            continue
        done = np.searchsorted(np.sort(ends), c_start[calls], side="right")
        most = int((rank - done).max())
        if most <= 0:
            continue
        depth = _held_distance(rank, calls, ends, c_start, c_end)
        if depth < MIN_QUEUE_DEPTH:
            fits.append(most + 1)  # never filled: deeper than the most seen outstanding
            continue
        # A call held by the full queue returns right after the entry `depth` places back ends;
        # with several streams in the queue the distance varies by an entry or two (the side
        # streams' work between): the latest release within DEPTH_SLACK places is the one.
        held = np.zeros(len(calls), bool)
        rel = np.full(len(calls), np.nan)
        for dd in range(depth, max(depth - DEPTH_SLACK, 0), -1):
            r = rank - dd
            ok = (r >= 0) & ~held
            cand = np.full(len(calls), np.nan)
            cand[ok] = ends[r[ok]]
            fit = ok & (cand > c_start[calls]) & (c_end[calls] >= cand) & \
                (c_end[calls] - cand <= QUEUE_FIT_NS)
            rel[fit], held[fit] = cand[fit], True
        best = max(best, depth)
        release[calls[held]] = rel[held]
        wakes.append(c_end[calls[held]] - rel[held])
    depth = best or max([DEFAULT_QUEUE_DEPTH] + fits)
    wake = float(np.median(np.concatenate(wakes))) if wakes else DEFAULT_QUEUE_WAKE_NS
    return depth, wake, release


def _held_distance(rank: np.ndarray, calls: np.ndarray, ends: np.ndarray, c_start: np.ndarray,
                   c_end: np.ndarray) -> int:
    """How many entries back the entry is whose end let a call held by a full launch queue
    return (0: the queue never held one). Read from the calls that took far longer than the
    device's typical one: for each, the last entry queued before it that ended while it ran,
    within QUEUE_FIT_NS of its return. A full queue gives most of them one distance (1,022 on
    the H200 with one stream; 1,134 with cuDNN's eight side streams of grouped convolutions in
    the queue); a host-bound step's few long calls give scattered ones."""
    dur = c_end[calls] - c_start[calls]
    long = np.flatnonzero(dur > max(2.0 * float(np.median(dur)), 20_000.0))
    order = np.argsort(ends, kind="stable")
    sorted_ends = ends[order]
    dists = []
    for i in long:
        r, ci = int(rank[i]), int(calls[i])
        # entries that ended in (start, end] of the call, within QUEUE_FIT_NS of its end
        lo = np.searchsorted(sorted_ends, max(c_start[ci], c_end[ci] - QUEUE_FIT_NS), side="right")
        hi = np.searchsorted(sorted_ends, c_end[ci], side="right")
        cand = order[lo:hi]
        cand = cand[cand < r]
        if len(cand):
            dists.append(r - int(cand[np.argmax(ends[cand])]))
    if len(dists) < 3:
        return 0
    vals, counts = np.unique(np.asarray(dists), return_counts=True)
    top = int(counts.max())
    mode = int(vals[np.argmax(counts)])
    # the cluster's deepest distance that many calls share (1,022 beside 1,021)
    deep = vals[(vals >= mode) & (vals < mode + DEPTH_SLACK) & (counts * 10 >= top)]
    depth = int(deep.max())
    near = int(counts[(vals <= depth) & (vals > depth - DEPTH_SLACK)].sum())
    return depth if 2 * near > len(dists) else 0


def _pageable_ops(trace, ops: pd.DataFrame, g_kind: np.ndarray) -> np.ndarray:
    """Which operations are copies from or to pageable host memory."""
    out = np.zeros(len(ops), dtype=bool)
    kinds = trace.copy_kinds
    if not len(kinds) or not (g_kind == 1).any():
        return out
    k = kinds.drop_duplicates(["correlationId", "start"])
    pageable = (k["srcKind"].to_numpy() == PAGEABLE) | (k["dstKind"].to_numpy() == PAGEABLE)
    key = set(zip(k["correlationId"].to_numpy(np.int64)[pageable].tolist(),
                  k["start"].to_numpy(np.int64)[pageable].tolist()))
    corr = ops["correlationId"].to_numpy(np.int64)
    st = ops["start"].to_numpy(np.int64)
    for i in np.flatnonzero(g_kind == 1):
        out[i] = (int(corr[i]), int(st[i])) in key
    return out


WAIT_EVENT_RE = re.compile(r"^cu(da)?StreamWaitEvent")
EVENT_WAIT_NS = 5 * TOLERANCE_NS   # the most a satisfied event wait delays the next operation


def _event_waits(trace, calls, names, codes, corr_to_call, g_call, g_start, g_end, g_stream, streams,
                 pid, g_dep, g_dep_delta) -> None:
    """The cross-stream waits the trace names, into ``g_dep``/``g_dep_delta`` (see the module
    docstring): each ``cudaStreamWaitEvent`` call's stream and event recording (CUPTI's
    synchronization record), the stream and call that recorded it (its event record); the first
    operation launched on the waiting stream after the wait depends on the last one launched on
    the recording stream before the record. Where an operation waits for several, the one that
    ended last in the trace is kept (one dependency an operation). Its delay is what the trace
    shows, at most EVENT_WAIT_NS: a longer gap was the launch's or the stream's, not the wait's.
    ``corr_to_call``: each correlation id's call (build's)."""
    waits = np.flatnonzero(match_names(pd.Series(names, dtype=object), WAIT_EVENT_RE)[codes])
    syncs, recs = trace.sync_streams, trace.event_records
    if not len(waits) or not len(syncs) or not len(recs) or "eventSyncId" not in syncs:
        return
    mine = (lambda df: df[df["pidkey"] == pid]) if pid is not None else (lambda df: df)
    syncs, recs = mine(syncs), mine(recs)
    corr = calls["correlationId"].to_numpy(np.int64)
    # each wait call's (waiting stream, event recording), then that recording's (stream, call)
    sync_of = syncs.drop_duplicates("correlationId").set_index("correlationId")
    row = sync_of.reindex(corr[waits])
    ev = row["eventSyncId"].to_numpy(np.float64)
    rec_of = recs[recs["eventSyncId"] >= 0].drop_duplicates("eventSyncId").set_index("eventSyncId")
    rec = rec_of.reindex(np.where(np.isnan(ev), -1, ev).astype(np.int64))
    r = corr_to_call.reindex(rec["correlationId"].fillna(-1).to_numpy(np.int64)).to_numpy(np.float64)
    index_of: dict[int, int] = {}
    for i, (_, sid) in enumerate(streams):
        index_of.setdefault(int(sid), i)
    src = rec["streamId"].map(index_of).to_numpy(np.float64)
    dst = row["streamId"].map(index_of).to_numpy(np.float64)
    ok = ~(np.isnan(r) | np.isnan(src) | np.isnan(dst)) & (src != dst) & (ev >= 0)
    waits, r, src, dst = waits[ok], r[ok].astype(np.int64), src[ok].astype(np.int64), dst[ok].astype(np.int64)
    # per stream, its operations launched in the window, in launch order (FIFO: their calls rise):
    # the last launched before the record, the first launched after the wait
    launched = g_call >= 0
    d = np.full(len(waits), -1, dtype=np.int64)
    x = np.full(len(waits), -1, dtype=np.int64)
    for k in np.unique(np.r_[src, dst]):
        on = np.flatnonzero((g_stream == k) & launched)
        on = on[np.argsort(g_call[on], kind="stable")]
        if not len(on):
            continue
        at = src == k
        i = np.searchsorted(g_call[on], r[at], side="left") - 1
        d[at] = np.where(i >= 0, on[np.maximum(i, 0)], -1)
        at = dst == k
        j = np.searchsorted(g_call[on], waits[at], side="right")
        x[at] = np.where(j < len(on), on[np.minimum(j, len(on) - 1)], -1)
    for dd, xx in zip(d.tolist(), x.tolist()):
        if dd < 0 or xx < 0 or (g_dep[xx] >= 0 and g_end[g_dep[xx]] >= g_end[dd]):
            continue
        g_dep[xx] = dd
        g_dep_delta[xx] = float(min(max(g_start[xx] - g_end[dd], 0), EVENT_WAIT_NS))


def _median(x: np.ndarray, default: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else default


def _waits(trace, calls, names, codes, c_kind, c_start, c_end, g_call, g_start, g_end, g_stream,
           dev, streams, ops, ops_ptr, ops_idx, q_release=None):
    """Per call: what GPU work it waits for, its own CPU time and its wake-up delay.
    ``q_release``: for the calls that found the launch queue full, the end of the entry that let
    them return (launch_queue); their own time is what the call costs when it does not wait."""
    n = len(c_start)
    dur = (c_end - c_start).astype(np.float64)
    wait = np.zeros(n, dtype=np.int8)
    arg = np.full(n, -1, dtype=np.int64)
    stream_index = {s: i for i, s in enumerate(streams)}
    main_dev = int(pd.Series(dev).mode().iat[0]) if len(dev) else 0
    default_stream = (int(pd.Series(g_stream).mode().iat[0]) if len(g_stream) else -1)

    # Stream of each stream synchronize (CUPTI's synchronization records).
    syncs = trace.sync_streams
    sync_stream = {}
    if len(syncs):
        pid = np.right_shift(c_tid_of(calls), 24)
        key = pd.MultiIndex.from_arrays([syncs["pidkey"].to_numpy(np.int64),
                                         syncs["correlationId"].to_numpy(np.int64)])
        st = pd.Series(syncs["streamId"].to_numpy(np.int64), index=key)
        st = st[~st.index.duplicated()]
        look = pd.MultiIndex.from_arrays([pid, calls["correlationId"].to_numpy(np.int64)])
        found = st.reindex(look).to_numpy()
        for i in np.flatnonzero(~np.isnan(found)):
            sync_stream[i] = int(found[i])

    is_dev_sync = match_names(pd.Series(names, dtype=object), DEVICE_SYNC_RE)[codes] if n else np.zeros(0, bool)
    is_stream_sync = match_names(pd.Series(names, dtype=object), STREAM_SYNC_RE)[codes] if n else np.zeros(0, bool)
    is_sync_copy = match_names(pd.Series(names, dtype=object), SYNC_COPY_RE)[codes] if n else np.zeros(0, bool)
    is_free_wait = match_names(pd.Series(names, dtype=object), FREE_WAITS_RE)[codes] if n else np.zeros(0, bool)

    wait[is_dev_sync | is_free_wait | is_sync_copy] = int(Wait.DEVICE)
    arg[is_dev_sync | is_free_wait | is_sync_copy] = main_dev
    for i in np.flatnonzero(is_stream_sync):
        s = sync_stream.get(int(i))
        idx = stream_index.get((main_dev, s)) if s is not None else None
        if idx is None:
            idx = default_stream
        wait[i], arg[i] = int(Wait.STREAM), idx

    # Copies that block the CPU: device-to-host, and anything from or to pageable memory.
    kinds = trace.copy_kinds
    if len(kinds) and n:
        copies = np.flatnonzero(c_kind == int(CallKind.COPY))
        copies = copies[(ops_ptr[copies + 1] > ops_ptr[copies]) & (wait[copies] != int(Wait.DEVICE))]
        kk = kinds.drop_duplicates("correlationId").set_index("correlationId")
        r = kk.reindex(calls["correlationId"].to_numpy(np.int64)[copies])  # NaN: no memcpy record
        blocking = ((r["copyKind"] == D2H) | (r["srcKind"] == PAGEABLE) | (r["dstKind"] == PAGEABLE)).to_numpy()
        sel = copies[blocking]
        wait[sel], arg[sel] = int(Wait.OP), ops_idx[ops_ptr[sel]]

    # Observed waits: the end of the awaited work, for the calls known to wait: the latest end on
    # the stream (or the device's streams) among the operations launched before the call (and
    # those carried into the window), found per stream by a running maximum in launch order.
    awaited = np.full(n, -np.inf)
    op_wait = np.flatnonzero(wait == int(Wait.OP))
    awaited[op_wait] = g_end[arg[op_wait]]
    waiting = np.flatnonzero((wait == int(Wait.STREAM)) | (wait == int(Wait.DEVICE)))
    if len(waiting):
        dev_of_stream = np.array([st[0] for st in streams] or [0])
        by_stream = np.full((max(len(streams), 1), len(waiting)), -np.inf)
        for k in range(by_stream.shape[0]):
            on = np.flatnonzero(g_stream == k)
            if not len(on):
                continue
            on = on[np.argsort(g_call[on], kind="stable")]
            before = np.searchsorted(g_call[on], waiting, side="left")  # launched by a call < i
            latest = np.maximum.accumulate(g_end[on])
            by_stream[k] = np.where(before > 0, latest[np.maximum(before - 1, 0)], -np.inf)
        w, a = wait[waiting], arg[waiting]
        on_stream = np.flatnonzero((w == int(Wait.STREAM)) & (a >= 0))  # (no stream: -inf, as set)
        awaited[waiting[on_stream]] = by_stream[a[on_stream], on_stream]
        dev_rows = np.flatnonzero(w == int(Wait.DEVICE))
        for d in np.unique(a[dev_rows]):
            rows = dev_rows[a[dev_rows] == d]
            streams_of_d = np.flatnonzero(dev_of_stream == d)
            if len(streams_of_d):
                awaited[waiting[rows]] = by_stream[np.ix_(streams_of_d, rows)].max(axis=0)

    # Calls of other kinds that measured far longer than usual and returned right after a GPU
    # operation ended: a full launch queue, an allocation that synchronised.
    queued = ~np.isnan(q_release) if q_release is not None else np.zeros(n, bool)
    med = pd.Series(np.where(queued, np.nan, dur)).groupby(codes).median().to_numpy() if n else np.zeros(0)
    med = np.where(np.isnan(med), 0.0, med)
    long = (wait == int(Wait.NONE)) & ~queued & \
        (dur > np.maximum(BLOCKED_FACTOR * med[codes], BLOCKED_MIN_NS)) if n else np.zeros(0, bool)
    if long.any() and len(g_end):
        eo = np.argsort(g_end, kind="stable")
        ends = g_end[eo]
        for i in np.flatnonzero(long):
            j = np.searchsorted(ends, c_end[i], side="right") - 1
            if j >= 0 and c_end[i] - ends[j] <= 5 * TOLERANCE_NS and ends[j] > c_start[i]:
                g = eo[j]
                if g_call[g] < i:
                    wait[i], arg[i], awaited[i] = int(Wait.OP), g, ends[j]

    blocked = (wait != int(Wait.NONE)) & (awaited > c_start)
    wake_obs = c_end - awaited
    wake_med = _median(wake_obs[blocked & (wake_obs >= 0)], DEFAULT_WAKE_NS)
    # Own CPU time of a call that waited: what the same API costs when it does not wait.
    unblocked_med = pd.Series(np.where(blocked | queued, np.nan, dur)).groupby(codes).median()
    base = unblocked_med.reindex(np.arange(len(names))).to_numpy()[codes] if n else np.zeros(0)
    base = np.where(np.isnan(base), np.minimum(dur, DEFAULT_WAKE_NS), base)
    own = np.where(blocked | queued, np.minimum(dur, base), dur)
    wake = np.where(blocked, np.maximum(wake_obs, 0.0),
                    np.clip(np.where(np.isfinite(wake_obs), c_end - awaited, wake_med), 0.0, wake_med))
    wake = np.where(wait == int(Wait.NONE), 0.0, wake)
    return wait, arg, wake.astype(np.float64), own.astype(np.float64)


def c_tid_of(calls: pd.DataFrame) -> np.ndarray:
    return calls["globalTid"].to_numpy(np.int64)


def _call_ranges(trace, times: list[np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """For each array of times: the innermost user NVTX range open on the main thread at each
    (work launched from helper threads counts for the main thread's ranges, as in attribution).
    Ranges that libraries open themselves (CUB, cuBLAS, cuDNN, NCCL) are not the user's: a call
    inside one counts for the user's range around it."""
    user = trace.user_ranges
    user = user[~match_names(trace.range_codes_of(user), LIBRARY_RANGE_RE)]
    if user.empty or not len(times[0]):
        return ["(no range)"], [np.zeros(len(t), dtype=np.int64) for t in times]
    mains = main_threads(user)
    tids = set(mains.values())
    r = user[user["globalTid"].isin(tids)].sort_values("start", kind="stable")
    st, en = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
    # The trace's name codes renumbered in order of appearance, as factorising the names would.
    trace_code, trace_names = trace.range_codes_of(r)
    ncode, present = pd.factorize(trace_code)
    names = [str(x) for x in trace_names[present]] + ["(no range)"]
    return names, [_innermost(st, en, ncode, t, len(names) - 1) for t in times]


def _innermost(st: np.ndarray, en: np.ndarray, code: np.ndarray, times: np.ndarray,
               none: int) -> np.ndarray:
    """Per time: the code of the latest-starting range (sorted by start) that contains it."""
    out = np.full(len(times), none, dtype=np.int64)
    if not len(times):
        return out
    # Only the ranges that overlap the times can hold one: a long trace's others are skipped.
    near = (st <= times.max()) & (en >= times.min())
    st, en, code = st[near], en[near], code[near]
    order = np.argsort(times, kind="stable")
    stack: list[int] = []
    j = 0
    for i in order:
        t = times[i]
        while j < len(st) and st[j] <= t:
            stack.append(j)
            j += 1
        while stack and en[stack[-1]] < t:
            stack.pop()
        k = len(stack) - 1
        while k >= 0 and en[stack[k]] < t:  # an inner range that ended below the top
            k -= 1
        if k >= 0:
            out[i] = code[stack[k]]
    return out


def _iterations(window: Window, c_start: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """The first call of each of the window's iterations (then n), and its measured periods."""
    periods = np.asarray(window.periods_ns, dtype=np.float64)
    if not window.iteration_ns or not n:
        return np.array([0, n], dtype=np.int64), np.array([float(window.wall_ns)]), False
    starts = window.iteration_bounds_ns[:-1]
    first = np.searchsorted(c_start, starts, side="left")
    gpu_side = len(window.gpu_period_ns) == len(window.iteration_ns)
    return np.concatenate([first, [n]]).astype(np.int64), periods, gpu_side
