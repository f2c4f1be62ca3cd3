"""Attribute GPU activity to ops: project NVTX ranges onto the GPU, group kernels by name.

Stateless functions over the reader's frames. The projection follows Nsight Systems'
``nvtx_gpu_proj_*`` reports: a GPU activity belongs to every range, open on the CPU thread that
made its launch call, that fully contains that call; the projected span of one range instance
runs from the start of its first GPU activity to the end of its last. CUDA graph replays work
the same way: every node kernel carries the correlation id of its ``cudaGraphLaunch``.

All heavy work is sorted sweeps over numpy arrays: no Python loop over rows, only over threads.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np
import pandas as pd

from profkit.read import aten_record
from profkit.read.intervals import busy_union
from profkit.run.window import main_threads

# emit_nvtx writes "aten::addmm, seq = 3, op_id = 7, sizes = [[...]], input_op_ids = [...]"
_ATEN_RE = re.compile(r"^(?P<op>aten::[A-Za-z0-9_.]+)(?P<rest>,.*)?$")
_SIZES_RE = re.compile(r"sizes = (\[.*?\]\])|sizes = (\[\])")


def aten_key(name: str) -> str:
    """Group key for an aten range: op name and input sizes (op_id and seq differ per call); a
    range of profkit's recorder adds its record (types, arguments), so a bf16 and an fp32 call
    of one shape are two ops."""
    recorded = aten_record.group_key(name)
    if recorded is not None:
        return recorded
    m = _ATEN_RE.match(name)
    if not m:
        return name
    s = _SIZES_RE.search(m.group("rest") or "")
    if s:
        return f"{m.group('op')} {s.group(1) or s.group(2)}"
    return m.group("op")


def _slices_to_pairs(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand half-open slices [lo, hi) into (slice index, position) pairs."""
    lengths = np.clip(hi - lo, 0, None)
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(lo)), lengths)
    if total == 0:
        return owner, np.empty(0, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(total)
    pos -= np.repeat(starts - lo, lengths)  # (in place: millions of pairs, one array more)
    return owner, pos


def range_activity_pairs(ranges: pd.DataFrame, acts: pd.DataFrame) -> pd.DataFrame:
    """Every (range row, activity row) such that the range contains the activity's launch call.

    Returns a frame with integer columns ``range_idx`` and ``act_idx`` (index labels of the inputs).
    Activities without a launch call (no runtime table, or correlation lost) belong to no range.
    """
    # Only the three columns the match reads: the activities frame has fifteen and a million rows.
    has_call = acts["api_start"].notna().to_numpy()
    cols = ["globalTid", "api_start", "api_end"]
    linked = acts[cols] if has_call.all() else acts.loc[has_call, cols]
    out_r, out_a = [], []
    if linked.empty or ranges.empty:
        return pd.DataFrame({"range_idx": np.empty(0, np.int64), "act_idx": np.empty(0, np.int64)})
    api_tid = linked["globalTid"].to_numpy(np.int64)
    api_start = linked["api_start"].to_numpy(np.int64)
    api_end = linked["api_end"].to_numpy(np.int64)
    act_index = linked.index.to_numpy(np.int64)
    order = _call_order(api_tid, api_start, api_end)
    api_tid, api_start, api_end, act_index = (api_tid[order], api_start[order], api_end[order],
                                              act_index[order])
    tids, first = np.unique(api_tid, return_index=True)
    bounds = dict(zip(tids.tolist(), zip(first.tolist(), np.append(first[1:], len(api_tid)).tolist())))
    r_tid = ranges["globalTid"].to_numpy(np.int64)
    r_start = ranges["start"].to_numpy(np.int64)
    r_end = ranges["end"].to_numpy(np.int64)
    r_index = ranges.index.to_numpy(np.int64)
    for tid in np.unique(r_tid):
        if tid not in bounds:
            continue
        a0, a1 = bounds[tid]
        s, e = api_start[a0:a1], api_end[a0:a1]
        # Calls on one thread follow each other, so their ends are sorted too; the running
        # maximum keeps the search right if a runtime call ever nests inside another.
        e_max = np.maximum.accumulate(e)
        sel = np.nonzero(r_tid == tid)[0]
        lo = np.searchsorted(s, r_start[sel], side="left")
        hi = np.searchsorted(e_max, r_end[sel], side="right")
        owner, pos = _slices_to_pairs(lo, hi)
        out_r.append(r_index[sel][owner])
        out_a.append(act_index[a0:a1][pos])
    if not out_r:
        return pd.DataFrame({"range_idx": np.empty(0, np.int64), "act_idx": np.empty(0, np.int64)})
    join = lambda parts: parts[0] if len(parts) == 1 else np.concatenate(parts)  # noqa: E731
    return pd.DataFrame({"range_idx": join(out_r), "act_idx": join(out_a)}, copy=False)


def _call_order(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((end, start, tid))``: launch calls by thread, start and end, with one stable
    sort of a (thread, start) key where it fits (activities come nearly in launch order, which
    that sort exploits), by all three only where equal keys need their ends ordered."""
    tcode, tids = pd.factorize(tid, sort=True)
    lo = int(start.min()) if len(start) else 0
    span = int(start.max()) - lo + 1 if len(start) else 1
    if len(tids) * span >= 2 ** 62:
        return np.lexsort((end, start, tid))
    key = tcode.astype(np.int64) * span + (start - lo)
    order = np.argsort(key, kind="stable")
    k, e = key[order], end[order]
    tie = k[1:] == k[:-1]
    if tie.any() and (e[1:][tie] < e[:-1][tie]).any():
        return np.lexsort((end, start, tid))
    return order


def add_cross_thread_pairs(pairs: pd.DataFrame, ranges: pd.DataFrame, acts: pd.DataFrame,
                           mains: dict[int, int], distinct: bool = False) -> pd.DataFrame:
    """Also give work launched from a helper thread to the main thread's ranges open then.

    PyTorch's autograd engine launches backward kernels from its own thread while the main
    thread waits inside `backward`; per-thread projection leaves `backward` nearly empty. Each
    activity launched from a thread other than its process's main thread (``mains``: pid ->
    thread) is matched, as if launched there, against the main thread's ranges.

    ``distinct``: ``pairs`` is range_activity_pairs of these ``ranges`` and ``acts``, whose
    index labels are unique: its rows are distinct, each pairs an activity with a range of the
    activity's own thread, and the added ones pair helper-thread work with main-thread ranges,
    so no row can repeat and the check for repeats (a hash of millions of rows) is skipped.
    """
    if not mains or acts.empty or ranges.empty:
        return pairs
    tid = acts["globalTid"]
    main_of = np.right_shift(tid.fillna(0).to_numpy(np.int64), 24)
    main_tid = pd.Series(main_of).map(mains).to_numpy()
    helper = acts["api_start"].notna().to_numpy() & ~pd.isna(main_tid) & (tid.to_numpy() != main_tid)
    if not helper.any():
        return pairs
    moved = acts.loc[helper, ["api_start", "api_end"]].assign(globalTid=main_tid[helper].astype(np.int64))
    on_main = ranges[ranges["globalTid"].isin(list(mains.values()))]
    extra = range_activity_pairs(on_main, moved)
    if extra.empty:
        return pairs
    out = pd.concat([pairs, extra], ignore_index=True)
    if distinct:
        return out
    return out.drop_duplicates(["range_idx", "act_idx"]).reset_index(drop=True)


def innermost_only(pairs: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Keep, for each activity, only the innermost containing range (latest start, then shortest)."""
    if pairs.empty:
        return pairs
    p = pairs.assign(r_start=ranges["start"].to_numpy()[pairs["range_idx"].to_numpy()],
                     r_len=(ranges["end"] - ranges["start"]).to_numpy()[pairs["range_idx"].to_numpy()])
    p = p.sort_values(["act_idx", "r_start", "r_len"], ascending=[True, False, True], kind="stable")
    return p.drop_duplicates("act_idx")[["range_idx", "act_idx"]].reset_index(drop=True)


def range_instances(ranges: pd.DataFrame, acts: pd.DataFrame, pairs: pd.DataFrame,
                    one_per_call: Optional[bool] = None) -> pd.DataFrame:
    """One row per range instance that launched GPU work.

    Columns: range_idx, name, cpu_start, cpu_time_ns, gpu_start, gpu_end, span_ns, busy_ns,
    gpu_sum_ns, longest_ns (its longest activity), n_acts, n_ops (distinct launch calls, as nsys's
    "GPU Ops"). ``one_per_call``:
    whether no two of ``acts`` share a launch call (Trace.one_activity_per_call; None: checked).
    """
    if pairs.empty:
        return pd.DataFrame(columns=["range_idx", "name", "cpu_start", "cpu_time_ns", "gpu_start",
                                     "gpu_end", "span_ns", "busy_ns", "gpu_sum_ns", "longest_ns", "n_acts",
                                     "n_ops"])
    ai = pairs["act_idx"].to_numpy()
    ri = pairs["range_idx"].to_numpy(np.int64)
    s_all = acts["start"].to_numpy()
    s, e = s_all[ai], acts["end"].to_numpy()[ai]
    # Pairs by (range, GPU start), ties in the order given (a stable sort), as arrays: a range
    # level holds millions of pairs.
    order = _order_by(ri, s)
    ri = ri[order]  # one column at a time: each unsorted copy goes before the next is made
    s = s[order]
    e = e[order]
    first = np.flatnonzero(np.r_[True, ri[1:] != ri[:-1]])
    inst = pd.DataFrame({
        "range_idx": ri[first],
        "gpu_start": np.minimum.reduceat(s, first), "gpu_end": np.maximum.reduceat(e, first),
        "gpu_sum_ns": np.add.reduceat(e - s, first), "longest_ns": np.maximum.reduceat(e - s, first),
        "n_acts": np.diff(np.append(first, len(ri))).astype(np.int64),
        "n_ops": _distinct_calls(ri, lambda: ai[order], acts, first, one_per_call),
    })
    del order
    inst["busy_ns"] = busy_union(ri, s, e)
    inst["span_ns"] = inst["gpu_end"] - inst["gpu_start"]
    r = ranges.loc[inst["range_idx"]]
    inst["name"] = r["name"].to_numpy()
    inst["cpu_start"] = r["start"].to_numpy()
    inst["cpu_time_ns"] = (r["end"] - r["start"]).to_numpy()
    return inst[["range_idx", "name", "cpu_start", "cpu_time_ns", "gpu_start", "gpu_end", "span_ns",
                 "busy_ns", "gpu_sum_ns", "longest_ns", "n_acts", "n_ops"]]


def _order_by(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The stable order by (group, value) of non-negative int64 groups: one integer key where
    it fits (pairs come nearly in that order already, which a stable sort of one key exploits)."""
    if not len(group):
        return np.empty(0, dtype=np.int64)
    lo, span = int(value.min()), int(value.max()) - int(value.min()) + 1
    if int(group.min()) >= 0 and (int(group.max()) + 1) * span < 2 ** 62:
        return np.argsort(group * span + (value - lo), kind="stable")
    return np.lexsort((value, group))


def _distinct_calls(ri: np.ndarray, sorted_acts, acts: pd.DataFrame, first: np.ndarray,
                    one_per_call: Optional[bool] = None) -> np.ndarray:
    """Per range (pairs sorted by range, ``first`` its first rows): how many distinct launch
    calls (correlation id and process) its activities came from (``sorted_acts()``: their
    positions, in the pairs' order; made only where needed)."""
    if one_per_call if one_per_call is not None else _one_activity_per_call(acts):
        return np.diff(np.append(first, len(ri))).astype(np.int64)
    ai = sorted_acts()
    corr = acts["correlationId"].to_numpy(np.int64)[ai]
    pid = acts["globalPid"].to_numpy(np.int64)[ai]
    pcode, puniq = pd.factorize(pid)
    lo, span = (int(corr.min()), int(corr.max()) - int(corr.min()) + 1) if len(corr) else (0, 1)
    calls = len(puniq) * span
    if calls * (int(ri.max()) + 1) >= 2 ** 62:
        p = pd.DataFrame({"r": ri, "c": corr, "p": pid}).drop_duplicates()
        return p.groupby("r").size().to_numpy(np.int64)
    # One integer key per (range, call), sorted (a stable sort of a key that mostly comes in
    # order): a range's rows stay where they were, and its distinct keys are where the key changes.
    key = np.sort(ri * calls + pcode.astype(np.int64) * span + (corr - lo), kind="stable")
    new = np.r_[True, key[1:] != key[:-1]]
    return np.add.reduceat(new.astype(np.int64), first)


def _one_activity_per_call(acts: pd.DataFrame) -> bool:
    """Whether no two activities with a launch call share it (correlation id and process): then
    a range's distinct calls are its activities, counted without a sort of its pairs."""
    linked = acts["api_start"].notna().to_numpy()
    return not pd.DataFrame({"c": acts["correlationId"].to_numpy(np.int64)[linked],
                             "p": acts["globalPid"].to_numpy(np.int64)[linked]}).duplicated().any()


def kernel_instances(acts: pd.DataFrame) -> pd.DataFrame:
    """Activities as op instances of the `kernel` level: one instance per activity."""
    dur = (acts["end"] - acts["start"]).to_numpy()
    cpu = (acts["api_end"] - acts["api_start"]).fillna(0).to_numpy()
    return pd.DataFrame({
        "range_idx": acts.index.to_numpy(), "name": acts["name"].to_numpy(),
        "cpu_start": acts["api_start"].to_numpy(), "cpu_time_ns": cpu,
        "gpu_start": acts["start"].to_numpy(), "gpu_end": acts["end"].to_numpy(),
        "span_ns": dur, "busy_ns": dur, "gpu_sum_ns": dur, "longest_ns": dur, "n_acts": 1, "n_ops": 1,
    })


def activity_pairs(trace, level: str, innermost: bool = False) -> pd.DataFrame:
    """(range_idx, act_idx) membership of ``trace``'s GPU activities in its `range` or `aten`
    ranges (cached on the trace). With the trace's ``process`` attribution, work launched from
    a helper thread also counts for the ranges open on the process's main thread."""
    key = (level, innermost)
    cache = trace.__dict__.setdefault("_pairs", {})
    if key not in cache:
        ranges = trace.ranges_of_level(level)
        pairs = range_activity_pairs(ranges, trace.activities)
        if level == "range" and trace.attribution == "process":
            acts = trace.activities
            pairs = add_cross_thread_pairs(pairs, ranges, acts, main_threads(ranges),
                                           distinct=ranges.index.is_unique and acts.index.is_unique)
        if innermost:
            pairs = innermost_only(pairs, trace.ranges)
        cache[key] = pairs
    return cache[key]
