"""Interval arithmetic on the trace's ns timeline: unions, coverage and membership.

Sorted sweeps over numpy arrays (no Python loop over rows), shared by every layer above.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of intervals sorted by start: merged starts, ends, and the first member of each."""
    if len(start) == 0:
        e = np.empty(0, dtype=np.int64)
        return e, e, e
    frontier = np.maximum.accumulate(end)
    new = np.ones(len(start), dtype=bool)
    new[1:] = start[1:] > frontier[:-1]
    first = np.nonzero(new)[0]
    last = np.append(first[1:], len(start)) - 1
    return start[first], frontier[last], first


def in_intervals(points: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Whether each point lies inside one of the (merged, sorted) intervals [s, e]."""
    if len(s) == 0:
        return np.zeros(len(points), dtype=bool)
    idx = np.searchsorted(s, points, side="right") - 1
    ok = idx >= 0
    out = np.zeros(len(points), dtype=bool)
    out[ok] = e[idx[ok]] >= points[ok]
    return out


def sorted_union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged [start, end] intervals of unsorted ones."""
    o = np.argsort(starts, kind="stable")
    s, e, _ = merge_intervals(starts[o], ends[o])
    return s, e


def busy_union(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Length of the union of intervals per group; inputs sorted by (group, start)."""
    if len(group) == 0:
        return np.empty(0, dtype=np.int64)
    # Running max of end within each group, shifted by one, is the covered frontier so far.
    new_group = np.ones(len(group), dtype=bool)
    new_group[1:] = group[1:] != group[:-1]
    frontier = _group_cummax(group, new_group, end)
    # The frontier shifted by one row, in place (a million-row group level holds no more copies).
    prev = frontier if frontier.flags.writeable else frontier.copy()
    prev[1:] = prev[:-1]
    prev[0] = np.iinfo(np.int64).min
    prev[new_group] = np.iinfo(np.int64).min
    np.maximum(start, prev, out=prev)
    contrib = np.subtract(end, prev, out=prev)
    np.clip(contrib, 0, None, out=contrib)
    # The groups are sorted: each one's first row is where it changes (no sort to find them).
    return np.add.reduceat(contrib, np.flatnonzero(new_group))


def _group_cummax(group: np.ndarray, new_group: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Running maximum of ``end`` within each group (groups sorted): one running maximum over
    ends lifted by their group's rank times the ends' span, so that no group reaches into the
    next, where that fits in int64."""
    if end.dtype.kind == "i" and len(end):
        lo, span = int(end.min()), int(end.max()) - int(end.min()) + 1
        lift = np.cumsum(new_group, dtype=np.int64)
        lift -= 1  # each row's group rank, then times the span (in place: two arrays in all)
        if int(lift[-1]) * span < 2 ** 62:
            lift *= span
            out = end - lo
            out += lift
            np.maximum.accumulate(out, out=out)
            out -= lift
            out += lo
            return out
    return pd.Series(end).groupby(group).cummax().to_numpy()
