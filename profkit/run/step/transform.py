"""Graph edits: what a fix changes in the step, as a change to a copy of the step graph.

Each edit takes a StepGraph and returns an edited copy; the model prices it by replaying both at
the calibrated CPU scale (profkit.run.step.model.StepModel.speedup). They are Daydream's
primitives — select nodes, shrink or remove them, remove a dependency — composed into the fixes
the rules propose:

* ``drop_waits``: calls no longer wait for the GPU (a value kept on the GPU, no ``.item()``);
* ``remove_calls``: calls gone with their own CPU time and the short dispatch before them (an
  allocation the caching allocator serves, a launch a fused kernel makes unnecessary);
* ``scale_ops``: GPU operations take ``1/factor`` of their time (a faster kernel, another
  precision); ``factor=inf`` removes their time (a fused-away kernel);
* ``pin_copies``: pageable copies become pinned: they run at the measured pinned bandwidth,
  no longer at the host's pace, and their calls no longer wait;
* ``load_in_workers``: the CPU time before the selected calls (data loading) moves to ``k``
  worker processes that run beside the step: the main process no longer spends it, and waits
  only when the workers, producing a batch every ``1/k`` of its loading time, are not ready;
* ``cuda_graph``: the launches of a region replayed as one graph: their CPU cost goes, the
  operations follow each other at a graph's node gap, and, when the whole step is captured, the
  Python between the launches goes too.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from profkit.run.step.graph import EDITABLE, CallKind, StepGraph, Wait

# Host gaps shorter than this before a removed launch are the per-op dispatch (framework code
# between two launches) that goes with it; longer ones are the program's own Python and stay.
DISPATCH_GAP_NS = 50_000.0
# Measured on the H200 from the committed graphed captures (nsys --cuda-graph-trace=node): the
# kernels of one replayed CUDA graph start a median 0.26 us (micro_graph, 190 gaps), 0.29 us
# (graphed_encoder_infer, 2,560) and 0.42 us (generate_llama_graphs, 12,220) after the previous
# one ends, 0.6 us at the 90th percentile; each keeps its own time, so a graph of thousands of
# tiny dependent kernels still runs them one after another. 0.5 us is kept. A graph launch costs
# the CPU about 10 us plus 0.1 us a node.
GRAPH_NODE_GAP_NS = 500.0
GRAPH_LAUNCH_NS = 10_000.0
GRAPH_NODE_NS = 100.0
# Pinned host<->device bandwidth of an H200's PCIe Gen5 x16 link when the trace has no pinned
# copy of its own to measure it from: 55 GB/s measured for 19 MB host-to-device copies from
# pinned memory (the capture resnet18_pageable__pinned, 2026-12-02: traces/README.md); the same copies
# from pageable memory ran at 7.4-7.7 GB/s.
PINNED_BYTES_PER_S = 55e9


def drop_waits(g: StepGraph, calls: np.ndarray) -> StepGraph:
    """The selected calls no longer wait for the GPU (a sync kept off the step's path: the value
    is read later, or never); their own CPU time stays."""
    out = g.copy()
    sel = np.asarray(calls)
    out.c_wait[sel] = int(Wait.NONE)
    out.c_wake[sel] = 0.0
    return out


def remove_calls(g: StepGraph, calls: np.ndarray, dispatch_gap_ns: float = DISPATCH_GAP_NS) -> StepGraph:
    """The selected calls take no CPU time and wait for nothing; the CPU time before each goes
    too when shorter than ``dispatch_gap_ns`` (the dispatch that made the call). GPU work they
    launched stays (remove it with scale_ops)."""
    out = g.copy()
    sel = np.zeros(g.n_calls, dtype=bool)
    sel[np.asarray(calls, dtype=np.int64)] = True
    out.c_own[sel] = 0.0
    out.c_wait[sel] = int(Wait.NONE)
    out.c_wake[sel] = 0.0
    if out.c_queue is not None:
        out.c_queue[sel] = False  # a call that is not made takes no slot of the launch queue
    short = sel & (out.c_gap < dispatch_gap_ns)
    out.c_gap[short] = 0.0
    return out


def scale_ops(g: StepGraph, ops: np.ndarray, factor: float, drop_launches: bool = False,
              own_dispatch: bool = True) -> StepGraph:
    """The selected GPU operations run ``factor`` times faster (``inf``: they take no time and
    their queue gap goes too). ``drop_launches``: their launch calls go as well (remove_calls),
    when no other operation of the same call stays; with ``own_dispatch`` (each operation was a
    framework call of its own, such as a cast) the driver queries right before each launch and
    the dispatch before them go too (with_lead_calls), without it (kernels a library launches
    inside a call that stays, such as cuDNN's layout transposes around a convolution) they stay."""
    out = g.copy()
    sel = np.zeros(g.n_ops, dtype=bool)
    sel[np.asarray(ops, dtype=np.int64)] = True
    if np.isinf(factor):
        out.g_dur[sel] = 0.0
        out.g_qgap[sel] = 0.0
    else:
        out.g_dur[sel] = out.g_dur[sel] / max(factor, 1e-9)
    if drop_launches:
        calls = np.unique(g.g_call[sel & (g.g_call >= 0)])
        keep = np.zeros(g.n_calls, dtype=bool)
        keep[g.g_call[~sel & (g.g_call >= 0)]] = True
        calls = calls[~keep[calls]]
        out = remove_calls(out, with_lead_calls(g, calls) if own_dispatch else calls)
    return out


# Host-only calls a launch makes right before it (cuKernelGetName before cudaLaunchKernel,
# cuKernelGetFunction before cuLaunchKernel) that are looked for before a removed launch
MAX_LEAD_CALLS = 2
# Calls that put work on the GPU: a driver query or cudaStreamIsCapturing (before each copy) may
# come right before them
ISSUING = [int(CallKind.LAUNCH), int(CallKind.GRAPH_LAUNCH), int(CallKind.COPY), int(CallKind.MEMSET)]


def with_lead_calls(g: StepGraph, calls: np.ndarray) -> np.ndarray:
    """``calls`` and, before each launch, copy or memset among them, the host-only calls (kind
    OTHER) its thread made right before it: in the captures of PyTorch 2.13, each kernel launch is
    preceded by a driver query (cuKernelGetName, cuKernelGetFunction) and each copy by
    cudaStreamIsCapturing, and the dispatch that made the call is the CPU time before that query
    (a median 24-26 us before a launch in item_loss_small_train; the launch's own gap is 0.3 us).
    A call that goes takes them and that dispatch with it."""
    calls = np.asarray(calls, dtype=np.int64)
    sel = np.zeros(g.n_calls, dtype=bool)
    sel[calls] = True
    cur = calls[np.isin(g.c_kind[calls], ISSUING)]
    for _ in range(MAX_LEAD_CALLS):
        pred = g.c_pred[cur]
        ok = pred >= 0
        cur, pred = cur[ok], pred[ok]
        lead = pred[(g.c_kind[pred] == int(CallKind.OTHER)) & (g.c_tid[pred] == g.c_tid[cur]) & ~sel[pred]]
        if not len(lead):
            break
        sel[lead] = True
        cur = lead
    return np.flatnonzero(sel)


def replace_ops(g: StepGraph, groups: list[np.ndarray], new_ns: np.ndarray) -> StepGraph:
    """Each group of operations becomes one operation of ``new_ns`` (the group's first keeps the
    time, the others take none and their launches go): a fusion."""
    out = g.copy()
    flat = np.concatenate(groups).astype(np.int64) if len(groups) else np.empty(0, dtype=np.int64)
    if len(flat) and len(groups) == len(new_ns) and (np.diff(np.sort(flat)) != 0).all():
        return _replace_disjoint(g, out, groups, flat, new_ns)
    drop: list[int] = []
    for ops, ns in zip(groups, new_ns):
        ops = np.asarray(ops, dtype=np.int64)
        if not len(ops):
            continue
        first = ops[np.argmin(g.g_start[ops])]
        rest = ops[ops != first]
        out.g_dur[first] = float(ns)
        out.g_dur[rest] = 0.0
        out.g_qgap[rest] = 0.0
        drop.extend(rest.tolist())
    return _drop_launches(g, out, np.asarray(drop, dtype=np.int64))


def _replace_disjoint(g: StepGraph, out: StepGraph, groups: list[np.ndarray], flat: np.ndarray,
                      new_ns) -> StepGraph:
    """replace_ops for groups that share no operation, all at once: a fusion of every run of
    small kernels in a dozen iterations is thousands of groups."""
    sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
    gid = np.repeat(np.arange(len(groups)), sizes)
    # Each group's first operation: the earliest start, the first listed among equal ones (argmin).
    order = np.lexsort((np.arange(len(flat)), g.g_start[flat], gid))
    heads = np.r_[True, gid[order][1:] != gid[order][:-1]]
    first = np.zeros(len(flat), dtype=bool)
    first[order[heads]] = True
    ns = np.asarray(new_ns, dtype=np.float64)
    out.g_dur[flat[first]] = ns[gid[first]]
    rest = flat[~first]
    out.g_dur[rest] = 0.0
    out.g_qgap[rest] = 0.0
    return _drop_launches(g, out, rest)


def _drop_launches(g: StepGraph, out: StepGraph, drop: np.ndarray) -> StepGraph:
    """The launches of the operations ``drop`` go (remove_calls), unless a call also launched an
    operation that stays."""
    if not len(drop):
        return out
    calls = np.unique(g.g_call[drop][g.g_call[drop] >= 0])
    kept = np.ones(g.n_ops, dtype=bool)
    kept[drop] = False
    has_kept = np.zeros(g.n_calls, dtype=bool)
    has_kept[g.g_call[kept & (g.g_call >= 0)]] = True
    return remove_calls(out, with_lead_calls(g, calls[~has_kept[calls]]))


def blend(g: StepGraph, edited: StepGraph, alpha: float) -> StepGraph:
    """``edited`` (an edit of ``g``) taken ``alpha`` of the way from ``g``: every duration moves
    from ``g``'s by ``alpha`` times the edit's change (``alpha`` above 1 goes further, no time
    below 0); what is not a duration (a wait dropped, a call no longer queued, work moved to
    DataLoader workers where ``g`` had none) is the edit's for any ``alpha`` above 0. Used to
    scale a fix's edit to the gain a trial measured (profkit.judge.combine.with_trials)."""
    if alpha <= 0:
        return g.copy()
    out = edited.copy()
    for name in EDITABLE:  # the rest is the trace's structure, which no edit changes
        new, old = edited.__dict__.get(name), g.__dict__.get(name)
        if isinstance(new, np.ndarray) and isinstance(old, np.ndarray) and new.dtype.kind == "f" \
                and old.shape == new.shape:
            both = np.isfinite(old) & np.isfinite(new)
            mixed = np.where(both, np.maximum(old + alpha * (new - old), 0.0), new)
            setattr(out, name, mixed)
        elif isinstance(new, float) and isinstance(old, float) and np.isfinite(new) and np.isfinite(old):
            setattr(out, name, max(old + alpha * (new - old), 0.0))
    return out


def add_cpu(g: StepGraph, ops: np.ndarray, ns: float) -> StepGraph:
    """The call that launched each of ``ops`` takes ``ns`` more CPU time for it (work added right
    before the launch, such as autocast's casts of a kernel's operands)."""
    out = g.copy()
    calls = g.g_call[np.asarray(ops, dtype=np.int64)]
    np.add.at(out.c_own, calls[calls >= 0], ns)
    return out


def drop_cpu(g: StepGraph, calls: np.ndarray) -> StepGraph:
    """The selected calls are not made: no CPU time of their own, no wait, and all the CPU time
    before each goes too, however long (a loop body's or a recomputation's Python, a compilation
    before a module load), unlike remove_calls, which keeps gaps longer than a dispatch."""
    return scale_cpu(remove_calls(g, calls), calls, 0.0) if len(calls) else g


def scale_cpu(g: StepGraph, calls: np.ndarray, factor: float, own: bool = True) -> StepGraph:
    """The CPU time of ``calls`` (the host gap before each, and with ``own`` each one's own time)
    times ``factor``: Python that runs faster, such as a fused optimizer step's in place of
    foreach's."""
    out = g.copy()
    calls = np.asarray(calls, dtype=np.int64)
    out.c_gap[calls] = g.c_gap[calls] * factor
    if own:
        out.c_own[calls] = g.c_own[calls] * factor
    return out


def pin_copies(g: StepGraph, ops: np.ndarray, bytes_: np.ndarray,
               bandwidth: Optional[float] = None, non_blocking: bool = True) -> StepGraph:
    """Pageable copies become pinned: each runs ``bytes / bandwidth`` (the pinned bandwidth the
    trace measured, else PINNED_BYTES_PER_S) and no longer at the host's pace; with
    ``non_blocking`` its call no longer waits for it, nor does a stream synchronisation that
    directly follows the call (PyTorch's blocking host-to-device copy is the copy and that
    sync; ``.to(device, non_blocking=True)`` from pinned memory issues the copy alone)."""
    out = g.copy()
    ops = np.asarray(ops, dtype=np.int64)
    bw = bandwidth or PINNED_BYTES_PER_S
    out.g_dur[ops] = np.minimum(out.g_dur[ops], np.asarray(bytes_, dtype=np.float64) / bw * 1e9)
    out.g_host_paced[ops] = False
    if non_blocking:
        calls = g.g_call[ops]
        calls = calls[calls >= 0]
        waits_on_copy = calls[(g.c_wait[calls] == int(Wait.OP))]
        out.c_wait[waits_on_copy] = int(Wait.NONE)
        out.c_wake[waits_on_copy] = 0.0
        is_copy = np.zeros(g.n_calls, dtype=bool)
        is_copy[calls] = True
        sync = _right_after(g, is_copy) & (g.c_kind == int(CallKind.SYNC)) & (g.c_wait == int(Wait.STREAM))
        out.c_wait[sync] = int(Wait.NONE)
        out.c_wake[sync] = 0.0
    return out


def reduce_before_copy(g: StepGraph, ops: np.ndarray, reduce_ns: np.ndarray, result_ns: float,
                       consumer_ns: float) -> StepGraph:
    """Device-to-host copies of whole tensors replaced by a reduction on the GPU and a copy of its
    small result (argmax or metric counts computed where the data is): each copy's operation takes
    ``reduce_ns`` (the reduction reading the tensor once) plus ``result_ns`` (the small copy), no
    longer at the host's pace; its call still waits for it (the result is read); and the CPU time
    right after the call, up to the next CUDA call of its thread, which was the host's work on the
    copied data, drops to ``consumer_ns`` (the program's dispatch between two calls)."""
    out = g.copy()
    ops = np.asarray(ops, dtype=np.int64)
    out.g_dur[ops] = np.asarray(reduce_ns, dtype=np.float64) + result_ns
    out.g_host_paced[ops] = False
    seen, consumer = _reads_and_consumer(g, ops)
    out.c_gap[consumer] = np.minimum(out.c_gap[consumer], consumer_ns)
    if g.n_calls and seen[g.n_calls - 1]:
        # the window's last call reads a copy: the host's work on it runs to the window's end
        # (a window cut right after it), the tail its consumer
        out.tail_ns = min(out.tail_ns, consumer_ns)
    return out


def reads_after(g: StepGraph, ops: np.ndarray) -> np.ndarray:
    """The calls of the device-to-host copies ``ops`` and the host's reads right after each (the
    sync of a blocking copy, more small copies and syncs) up to its consumer: the calls that wait
    for the GPU before the host works on the data."""
    reads, _ = _reads_and_consumer(g, ops)
    return np.flatnonzero(reads)


def _reads_and_consumer(g: StepGraph, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per call: the copies' calls and the reads that follow them; per call: the consumer, the
    first call after those reads, whose CPU gap is the host's work on the copied data)."""
    calls = g.g_call[np.asarray(ops, dtype=np.int64)]
    calls = calls[calls >= 0]
    is_copy = np.zeros(g.n_calls, dtype=bool)
    is_copy[calls] = True
    # The host often reads a few more small results right after (PyTorch's blocking copy is the
    # copy call and a stream synchronisation; then labels, a loss: more device-to-host copies and
    # syncs) before it works on them: its work on the copied data is the CPU time before the
    # first call after those reads, not before the next read.
    reads = _host_reads(g)
    same_thread = g.c_tid == g.c_tid[np.maximum(g.c_pred, 0)]
    consumer = np.zeros(g.n_calls, dtype=bool)
    seen = is_copy.copy()
    cur = is_copy
    for _ in range(MAX_READS_AFTER):
        nxt = _right_after(g, cur) & same_thread
        consumer |= nxt & ~reads
        cur = nxt & reads & ~seen
        seen |= cur
        if not cur.any():
            break
    return seen, consumer


# Small reads after a large device-to-host copy that its consumer is looked for past
MAX_READS_AFTER = 8


def _host_reads(g: StepGraph) -> np.ndarray:
    """Per call: a synchronisation or a device-to-host copy (the host reading results), or a
    bookkeeping call right before one (PyTorch asks cudaStreamIsCapturing before each copy)."""
    reads = g.c_kind == int(CallKind.SYNC)
    copy = g.c_kind == int(CallKind.COPY)
    if copy.any() and len(g.op_names):
        d2h = np.zeros(g.n_calls, dtype=bool)
        ops = np.flatnonzero(g.g_call >= 0)
        d2h[g.g_call[ops]] = _device_to_host(g)[g.g_name[ops]]
        reads |= copy & d2h
    has_pred = g.c_pred >= 0
    before_read = np.zeros(g.n_calls, dtype=bool)
    before_read[g.c_pred[has_pred & reads]] = True
    return reads | (before_read & (g.c_kind == int(CallKind.OTHER)))


def load_in_workers(g: StepGraph, calls: np.ndarray, workers: float, tail: bool = False) -> StepGraph:
    """The CPU time before the selected calls (one batch's loading each, in program order) is
    done by ``workers`` processes beside the main one: the main process's gap goes, and the call
    waits until the workers have produced that batch. They share the loading evenly and start
    with the window (no batches prefetched before it), so the k-th batch is ready once the
    loading of the first k batches, divided by ``workers``, is done: the step runs at the pace
    of the slower of the main process and the workers. ``tail``: the CPU time after the
    window's last call is the next batch's loading too (a loop that prepares each batch after
    the step before it), and goes to the workers the same way."""
    out = g.copy()
    sel = np.sort(np.asarray(calls, dtype=np.int64))
    ready = np.full(g.n_calls, np.nan) if g.c_ready is None else g.c_ready.copy()
    done = np.cumsum(g.c_gap[sel]) / max(workers, 1e-9)
    ready[sel] = done
    out.c_gap[sel] = 0.0
    out.c_ready = ready
    if tail:
        out.tail_ready = (float(done[-1]) if len(done) else 0.0) + g.tail_ns / max(workers, 1e-9)
        out.tail_ns = 0.0
    return out


def synchronising(g: StepGraph) -> np.ndarray:
    """Per call: whether it is a synchronisation or a copy the host waits for (.item(), a
    device-to-host copy, a blocking copy): what no CUDA graph holds and where Dynamo breaks its
    graph."""
    return (g.c_kind == int(CallKind.SYNC)) | ((g.c_kind == int(CallKind.COPY)) & (g.c_wait != int(Wait.NONE)))


def graphable(g: StepGraph, calls: np.ndarray) -> list[str]:
    """Why the selected calls cannot be captured in a CUDA graph (empty when they can): a
    synchronisation, an allocation or free, or a pageable copy inside the region."""
    sel = np.asarray(calls, dtype=np.int64)
    why = []
    kind = g.c_kind[sel]
    names = g.call_names[g.c_name[sel]] if len(sel) else np.empty(0, object)
    sync = synchronising(g)[sel]
    if sync.any():
        why.append(f"{int(sync.sum())} synchronising call(s) ({_names(names[sync])})")
    alloc = (kind == int(CallKind.ALLOC)) | (kind == int(CallKind.FREE))
    if alloc.any():
        why.append(f"{int(alloc.sum())} allocation/free call(s) ({_names(names[alloc])})")
    ops = g.launched_by(sel)
    if len(ops) and g.g_host_paced[ops].any():
        why.append(f"{int(g.g_host_paced[ops].sum())} pageable copy(ies)")
    return why


def _names(names: np.ndarray) -> str:
    import re
    uniq = sorted({re.sub(r"_v\d+$", "", str(n)) for n in names})
    return ", ".join(uniq[:3]) + (", ..." if len(uniq) > 3 else "")


def cuda_graph(g: StepGraph, calls: np.ndarray, whole_step: bool = False,
               keep_gaps: Optional[np.ndarray] = None) -> StepGraph:
    """The launches among ``calls`` replayed as CUDA graphs: the launch calls' CPU time and the
    dispatch before them go (all the CPU time between the region's calls with ``whole_step``:
    nothing of the step runs as Python any more), one graph launch per iteration (or
    ``keep_gaps``: calls whose CPU time before them stays even so: the Python between captured
    pieces) costs GRAPH_LAUNCH_NS plus GRAPH_NODE_NS a node, and the operations follow each
    other GRAPH_NODE_GAP_NS apart."""
    out = g.copy()
    sel = np.zeros(g.n_calls, dtype=bool)
    sel[np.asarray(calls, dtype=np.int64)] = True
    launches = sel & np.isin(g.c_kind, [int(CallKind.LAUNCH), int(CallKind.MEMSET), int(CallKind.COPY),
                                        int(CallKind.EVENT), int(CallKind.OTHER)])
    launches &= g.c_wait == int(Wait.NONE)
    out.c_own[launches] = 0.0
    gaps = launches if not whole_step else sel
    gaps = gaps & ((g.c_gap < DISPATCH_GAP_NS) | whole_step)
    if keep_gaps is not None:
        gaps[np.asarray(keep_gaps, dtype=np.int64)] = False
    out.c_gap[gaps] = 0.0
    # The graph launch: charged to the first launch of each iteration in the region.
    it = np.searchsorted(g.iter_call, np.flatnonzero(launches), side="right") - 1
    firsts = np.flatnonzero(launches)[np.r_[True, it[1:] != it[:-1]]] if launches.any() else np.empty(0, np.int64)
    nodes = np.where(launches, np.diff(g.ops_ptr), 0).astype(np.float64)
    per_it_nodes = np.bincount(it, weights=nodes[launches], minlength=len(g.iter_call)) if launches.any() else np.zeros(0)
    for f, k in zip(firsts, np.unique(it)):
        out.c_own[f] = GRAPH_LAUNCH_NS + GRAPH_NODE_NS * float(per_it_nodes[k])
    if out.c_queue is not None:  # the graph launch takes one slot of the launch queue
        out.c_queue[launches] = False
        out.c_queue[firsts] = True
    # Operations of the region: back to back on the GPU.
    ops = g.ops_idx[np.repeat(launches, np.diff(g.ops_ptr))]  # the launches' operations, in order
    if len(ops):
        out.g_qgap[ops] = np.minimum(out.g_qgap[ops], GRAPH_NODE_GAP_NS)
    return out


def ops_named(g: StepGraph, names) -> np.ndarray:
    """Indices of the window's operations (not those carried in from before it) whose kernel name
    is one of ``names``."""
    wanted = {str(n) for n in names}
    hit = np.array([str(n) in wanted for n in g.op_names], dtype=bool)
    return np.flatnonzero(hit[g.g_name] & (g.g_call >= 0)) if len(hit) else np.empty(0, np.int64)


def keep_values(g: StepGraph, calls: np.ndarray) -> StepGraph:
    """The values the selected sync calls waited for stay on the GPU and what used them on the
    host becomes GPU work (``torch.where`` on a comparison, a multiply by the ratio): each sync
    goes (its CPU time, its wait, the dispatch before it); each device-to-host copy that fetched
    a value stays as a call that no longer waits, its small GPU operation standing for the kernel
    that now consumes the value. Removing the copies too (remove_syncs) priced a hand-written
    LAMB's trust ratios kept on the GPU at 1.14x; it measured 0.98x (torch.where and a multiply
    a parameter, issued where the reads had been)."""
    sel, copies = _fetches(g, calls)
    return drop_waits(remove_calls(g, np.flatnonzero(sel & ~copies)), np.flatnonzero(copies))


def _fetches(g: StepGraph, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per call: one of the selected sync calls; per call: a device-to-host copy that fetched a
    value they waited for: a selected copy, or the copy right before a selected stream sync)."""
    sel = np.zeros(g.n_calls, dtype=bool)
    sel[np.asarray(calls, dtype=np.int64)] = True
    is_copy = g.c_kind == int(CallKind.COPY)
    after_copy = sel & (g.c_kind == int(CallKind.SYNC)) & _right_after(g, is_copy)
    copies = sel & is_copy
    copies[g.c_pred[after_copy]] = True
    return sel, copies


def remove_syncs(g: StepGraph, calls: np.ndarray, batch: Optional[np.ndarray] = None) -> StepGraph:
    """The values the selected sync calls waited for stay on the GPU: each call goes (its CPU
    time, its wait, the dispatch before it), and so does the device-to-host copy that fetched
    the value (``.item()`` is a copy call, then a stream sync, on the same thread): the copy's
    call, its dispatch and its GPU operation. The Python around them stays.

    ``batch``: among them, calls whose values are computed one by one in a loop (one per
    parameter, per layer) and then kept together on the GPU (``torch._foreach_norm`` and
    ``torch.stack``): the kernel launched right before each of their copies joins the others of
    its iteration in one kernel (their time summed), and every other call of the loop's body
    (between its first value and its last, on its thread and in its range) goes with its
    dispatch, its memsets' GPU work too."""
    sel, copies = _fetches(g, calls)
    out = g
    if batch is not None and len(batch):
        out = _batch_producers(g, copies, np.asarray(batch, dtype=np.int64))
    ops = g.ops_idx[np.repeat(copies, np.diff(g.ops_ptr))]  # the copies' operations
    ops = ops[_device_to_host(g)[g.g_name[ops]]] if len(ops) else ops
    out = scale_ops(out, ops, np.inf, drop_launches=True) if len(ops) else out
    return remove_calls(out, np.flatnonzero(sel))


def _batch_producers(g: StepGraph, copies: np.ndarray, batch: np.ndarray) -> StepGraph:
    """The kernels launched right before the copies that fetch the ``batch`` syncs' values, one
    fused kernel per iteration (replace_ops)."""
    # The copy that fetched each batched value: the sync's predecessor, or the call itself.
    fetch = np.where(g.c_kind[batch] == int(CallKind.SYNC), g.c_pred[batch], batch)
    fetch = fetch[(fetch >= 0) & copies[np.maximum(fetch, 0)]]
    prod = g.c_pred[fetch]
    prod = np.unique(prod[(prod >= 0) & (g.c_kind[np.maximum(prod, 0)] == int(CallKind.LAUNCH))])
    if len(prod) < 2:
        return g
    it = np.searchsorted(g.iter_call, prod, side="right") - 1
    groups, ns, body = [], [], []
    for k in np.unique(it):
        mine = prod[it == k]
        ops = g.launched_by(mine)
        if len(ops) >= 2:
            groups.append(ops)
            ns.append(float(g.g_dur[ops].sum()))
            # The loop's body between its first value and its last, on its thread and in its
            # range: each item's dispatch (the kernel-name look-up, the memset of a reduction
            # buffer, the Python of the loop) is replaced by one call for all of them.
            reads = batch[np.searchsorted(g.iter_call, batch, side="right") - 1 == k]
            lo, hi = int(mine.min()), int(reads.max()) if len(reads) else int(mine.max())
            span = np.arange(lo + 1, hi + 1)
            body.append(span[(g.c_tid[span] == g.c_tid[lo]) & (g.c_range[span] == g.c_range[lo])])
    if not groups:
        return g
    out = replace_ops(g, groups, np.asarray(ns))
    body_calls = np.setdiff1d(np.concatenate(body), g.g_call[[grp[np.argmin(g.g_start[grp])] for grp in groups]])
    memsets = g.ops_idx[np.repeat(np.isin(np.arange(g.n_calls), body_calls)
                                  & (g.c_kind == int(CallKind.MEMSET)), np.diff(g.ops_ptr))]
    out = scale_ops(out, memsets, np.inf) if len(memsets) else out
    return remove_calls(out, body_calls)


def _right_after(g: StepGraph, mask: np.ndarray) -> np.ndarray:
    """Per call: whether the call just before it on its thread is one of ``mask`` (per call)."""
    return (g.c_pred >= 0) & mask[np.maximum(g.c_pred, 0)]


def _device_to_host(g: StepGraph) -> np.ndarray:
    """Per operation name: whether it is a device-to-host copy."""
    return np.array(["Device-to-Host" in str(n) for n in g.op_names], dtype=bool)


def sync_calls(g: StepGraph) -> np.ndarray:
    """The calls that wait for the GPU in a sync or a device-to-host copy (not a free, an
    allocation or a pageable host-to-device copy: other rules' business)."""
    waits = g.c_wait != int(Wait.NONE)
    sync = waits & (g.c_kind == int(CallKind.SYNC))
    copy = waits & (g.c_kind == int(CallKind.COPY)) & (g.c_wait == int(Wait.OP))
    if copy.any():
        arg = np.maximum(g.c_wait_arg, 0)
        copy &= _device_to_host(g)[g.g_name[arg]] if len(g.op_names) else False
    return np.flatnonzero(sync | copy)
