"""The activities frame assembled from arrays: names as codes, launch calls joined, time order.

A trace of a million kernels holds a few hundred kernel names and one launch call per kernel.
The reader reads each table's integer columns as arrays (profkit.read.db); this module names the
rows through a table of their distinct names, finds each row's launch call by one sorted search
and orders the rows by time with one sort, so that the frame is built once, from arrays, rather
than through a frame per table, a concatenation, a merge and a sort of millions of rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

UNNAMED_KERNEL = "<unnamed kernel>"
# Integer keys of names (Trace.name_codes) that are not string ids: a kernel known only by its
# short name, names stored as text, a kernel with neither.
SHORT_ONLY_KEY = -(2 ** 40)
TEXT_KEY = -(2 ** 41)
NO_NAME_KEY = -4


@dataclass
class NameTable:
    """Names of a table's rows: ``uid`` per row, an index into the distinct ones; per distinct
    one its name, its short name and its integer key (one key per name: Trace.name_codes)."""
    uid: np.ndarray    # int64, per row
    name: np.ndarray   # object (str), per distinct name
    short: np.ndarray  # object (str)
    key: np.ndarray    # int64

    @staticmethod
    def concat(tables: list["NameTable"]) -> "NameTable":
        offsets = np.cumsum([0] + [len(t.name) for t in tables])
        return NameTable(np.concatenate([t.uid + o for t, o in zip(tables, offsets)]),
                         np.concatenate([t.name for t in tables]),
                         np.concatenate([t.short for t in tables]),
                         np.concatenate([t.key for t in tables]))

    def take(self, rows: np.ndarray) -> "NameTable":
        return NameTable(self.uid[rows], self.name, self.short, self.key)

    def codes(self, uid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(code per row, distinct names) for the rows ``uid``: the rows' keys numbered in order
        of first appearance, then equal texts under one code, in order of first appearance."""
        codes, _ = pd.factorize(self.key[uid])
        # The first row of each code: where the code passes every code before it.
        first = np.flatnonzero(codes > np.maximum.accumulate(np.r_[-1, codes[:-1]])) if len(codes) else codes
        remap, names = pd.factorize(self.name[uid[first]])
        return remap[codes].astype(np.int64), np.asarray(names, dtype=object)


def kernel_names(name_id: Optional[np.ndarray], short_id: Optional[np.ndarray],
                 full_text: Optional[pd.Series], short_text: Optional[pd.Series],
                 strings: dict[int, str], n: int) -> NameTable:
    """The kernels' names from their StringIds ids (``name_id``, ``short_id``; None when the
    table has no such column) or, in old exports, their text (``full_text``, ``short_text``):
    the full name, else the short one, else UNNAMED_KERNEL; the short name, else the full one.
    The key is the full name's id, else the short name's (SHORT_ONLY_KEY - id), else
    NO_NAME_KEY; names stored as text are keyed by text (TEXT_KEY - their number)."""
    if full_text is not None or short_text is not None:
        return _text_names(name_id, short_id, full_text, short_text, strings, n)
    nid = name_id if name_id is not None else np.full(n, -1, dtype=np.int64)
    sid = short_id if short_id is not None else np.full(n, -1, dtype=np.int64)
    uid, nid_u, sid_u = _pairs(nid, sid)
    full = [strings.get(int(i)) if name_id is not None else None for i in nid_u]
    short = [strings.get(int(i)) if short_id is not None else None for i in sid_u]
    name = [f if f is not None else (s if s is not None else UNNAMED_KERNEL) for f, s in zip(full, short)]
    short = [s if s is not None else f for f, s in zip(name, short)]
    key = np.where(nid_u >= 0, nid_u, np.where(sid_u >= 0, SHORT_ONLY_KEY - sid_u, NO_NAME_KEY))
    return NameTable(uid, np.array(name, dtype=object), np.array(short, dtype=object),
                     key.astype(np.int64))


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (a, b) pairs of two int64 columns: code per row, a and b per distinct pair."""
    if not len(a):
        e = np.empty(0, dtype=np.int64)
        return e, e, e
    lo_a, lo_b = int(a.min()), int(b.min())
    span = int(b.max()) - lo_b + 1
    if (int(a.max()) - lo_a + 1) * span < 2 ** 62:
        uid, keys = pd.factorize((a - lo_a) * span + (b - lo_b))
        keys = np.asarray(keys, dtype=np.int64)
        return uid.astype(np.int64), keys // span + lo_a, keys % span + lo_b
    uid, uniq = pd.factorize(pd.MultiIndex.from_arrays([a, b]))
    return (uid.astype(np.int64), uniq.get_level_values(0).to_numpy(np.int64),
            uniq.get_level_values(1).to_numpy(np.int64))


def _text_names(name_id, short_id, full_text, short_text, strings, n) -> NameTable:
    """kernel_names for an export that stores kernel names as text."""
    from profkit.read.nsys import _lookup
    index = pd.RangeIndex(n)
    name = pd.Series(full_text.to_numpy() if full_text is not None else
                     _lookup(None if name_id is None else pd.Series(name_id), strings, n), index=index)
    short = pd.Series(short_text.to_numpy() if short_text is not None else
                      _lookup(None if short_id is None else pd.Series(short_id), strings, n), index=index)
    name = name.fillna(short).fillna(UNNAMED_KERNEL)
    short = short.fillna(name)
    nid = name_id if name_id is not None else np.full(n, -1, dtype=np.int64)
    sid = short_id if short_id is not None else np.full(n, -1, dtype=np.int64)
    key = np.where(nid >= 0, nid, np.where(sid >= 0, SHORT_ONLY_KEY - sid, NO_NAME_KEY))
    if full_text is not None:  # no ids to key them by
        key = TEXT_KEY - pd.factorize(name)[0]
    key = np.asarray(key, dtype=np.int64)
    uid, uniq = pd.factorize(pd.MultiIndex.from_arrays([key, name.to_numpy(object), short.to_numpy(object)]))
    return NameTable(uid.astype(np.int64), uniq.get_level_values(1).to_numpy(object),
                     uniq.get_level_values(2).to_numpy(object), uniq.get_level_values(0).to_numpy(np.int64))


def text_column(text: np.ndarray, codes: np.ndarray):
    """The column of ``text[codes]`` (a few distinct strings, a million rows) in the dtype pandas
    gives such a column (its string dtype where it has one), taken from the distinct strings
    instead of checking each of a million values."""
    text = np.asarray(text, dtype=object)
    return pd.array(text, dtype=pd.Series(text).dtype).take(np.asarray(codes, dtype=np.int64))


CALL_COLUMNS = ("globalTid", "api_start", "api_end")


def direct_match(c_corr: np.ndarray, c_pid: np.ndarray, corr: np.ndarray, pid: np.ndarray
                 ) -> Optional[np.ndarray]:
    """Each activity's launch call as a position in the API table (its correlation ids
    ``c_corr`` and process keys ``c_pid``), -1 for none, found by a binary search where the
    table allows it: one process (every activity's too) and correlation ids rising row by row,
    as an export writes them. None otherwise (join_calls answers then). A -1 on both sides (a
    NULL id is read as -1) is left to join_calls as well."""
    if not len(c_corr) or not len(corr):
        return None
    p = int(c_pid[0])
    if not ((c_pid == p).all() and (pid == p).all() and (c_corr[1:] > c_corr[:-1]).all()):
        return None
    has_minus_one = c_corr[min(int(np.searchsorted(c_corr, -1)), len(c_corr) - 1)] == -1
    if has_minus_one and (corr == -1).any():
        return None
    at = np.minimum(np.searchsorted(c_corr, corr), len(c_corr) - 1)
    return np.where(c_corr[at] == corr, at, -1)


def calls_at(pos: np.ndarray, start: np.ndarray, end: np.ndarray, tid: np.ndarray
             ) -> tuple[dict[str, np.ndarray], bool]:
    """The columns join_calls gives, from each activity's position in the API table (``pos``,
    -1 for none), and whether no two activities share a call."""
    hit = pos >= 0
    at = np.maximum(pos, 0)
    out = {}
    for c, v in (("globalTid", tid), ("api_start", start), ("api_end", end)):
        out[c] = v[at] if hit.all() else (np.where(hit, v[at], np.nan) if hit.any() else np.full(len(pos), np.nan))
    one_each = not hit.any() or int(np.bincount(pos[hit]).max()) <= 1
    return out, one_each


def join_calls(corr: np.ndarray, pidkey: np.ndarray, calls: pd.DataFrame
               ) -> tuple[Optional[np.ndarray], dict[str, np.ndarray], Optional[bool]]:
    """Each activity's launch call: the row of ``calls`` (correlationId, pidkey and
    CALL_COLUMNS) with its correlation id and process key, as a left join gives it.

    Returns (rows, columns, one each): ``rows`` is None when each activity keeps one row (the
    usual case: a correlation id is one call in a process), else the activity of each row of the
    join (a call repeated in the table repeats its activities, as a merge does). Columns hold
    int64 where every activity found its call, else float64 with NaN for the others. ``one
    each``: whether no two activities share a call (None: not known, after a repeated call)."""
    pos = _unique_match(corr, pidkey, calls["correlationId"].to_numpy(np.int64),
                        calls["pidkey"].to_numpy(np.int64))
    if pos is None:
        left = pd.DataFrame({"correlationId": corr, "pidkey": pidkey, "_row": np.arange(len(corr))})
        m = left.merge(calls, how="left", on=["correlationId", "pidkey"], sort=False)
        return m["_row"].to_numpy(np.int64), {c: m[c].to_numpy() for c in CALL_COLUMNS}, None
    hit = pos >= 0
    # Activities of one call share its row: no row found twice, no call shared (a linear count).
    one_each = not hit.any() or int(np.bincount(pos[hit], minlength=1).max()) <= 1
    out = {}
    for c in CALL_COLUMNS:
        if not hit.any():
            out[c] = np.full(len(corr), np.nan)
            continue
        v = calls[c].to_numpy(np.int64)[np.maximum(pos, 0)]
        out[c] = v if hit.all() else np.where(hit, v, np.nan)
    return None, out, one_each


def _unique_match(corr: np.ndarray, pid: np.ndarray, c_corr: np.ndarray, c_pid: np.ndarray
                  ) -> Optional[np.ndarray]:
    """Per (corr, pid): the position of the one (c_corr, c_pid) equal to it, -1 for none; None
    when a pair repeats among the latter (or the keys do not fit one integer)."""
    if not len(c_corr) or not len(corr):
        return np.full(len(corr), -1, dtype=np.int64)
    pids = np.sort(pd.unique(np.concatenate([pd.unique(pid), pd.unique(c_pid)])))
    lo = min(int(corr.min()), int(c_corr.min()))
    span = max(int(corr.max()), int(c_corr.max())) - lo + 1
    if len(pids) * span >= 2 ** 62:
        return None
    key = np.searchsorted(pids, pid) * span + (corr - lo)
    c_key = np.searchsorted(pids, c_pid) * span + (c_corr - lo)
    order = np.argsort(c_key, kind="stable")
    sorted_key = c_key[order]
    if (sorted_key[1:] == sorted_key[:-1]).any():
        return None
    at = np.minimum(np.searchsorted(sorted_key, key), len(sorted_key) - 1)
    return np.where(sorted_key[at] == key, order[at], -1)


def time_order(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The stable order by (start, end), as a stable sort by both: one stable sort by start
    (the tables come nearly in time order already), by both only where equal starts need it."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    tie = s[1:] == s[:-1]
    if tie.any() and (e[1:][tie] < e[:-1][tie]).any():
        return np.lexsort((end, start))
    return order
