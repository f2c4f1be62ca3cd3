"""The fast paths of the large-trace read and analysis give what the plain ones give.

Each shortcut taken for a million-row trace (a stable sort of one integer key for a lexsort, a
binary search for a merge, a radix sort of op codes for a groupby, all fusions at once for one at
a time, rowid chunks without a count) is checked against the plain computation it replaces, on
random data (fixed seeds, ties and gaps included) and on a committed real trace.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.read import db
from profkit.read.assemble import direct_match, join_calls, time_order
from profkit.read.intervals import busy_union
from profkit.read.trace import Trace
from profkit.run.attribution import _call_order, _order_by
from profkit.run.ops import _median_by_code, _sum_by_code
from profkit.run.summary import _by_device_and_start

TRACES = Path(__file__).resolve().parents[1] / "traces"
rng = np.random.default_rng(20261204)


def _cases(n_cases: int = 200):
    for _ in range(n_cases):
        n = int(rng.integers(1, 300))
        yield n, rng.integers(0, 3, n), rng.integers(0, 40, n), rng.integers(0, 6, n)


def test_sorts_by_one_key_match_lexsort():
    for n, group, start, dur in _cases():
        end = start + dur
        assert np.array_equal(time_order(start, end), np.lexsort((end, start)))
        assert np.array_equal(_call_order(group * (2 ** 40) + 7, start, end),
                              np.lexsort((end, start, group * (2 ** 40) + 7)))
        assert np.array_equal(_by_device_and_start(group, start), np.lexsort((start, group)))
        assert np.array_equal(_order_by(group, start), np.lexsort((start, group)))


def test_busy_union_matches_a_groupby_of_the_frontier():
    for n, group, start, dur in _cases():
        order = np.lexsort((start, group))
        g, s, e = group[order], start[order], (start + dur)[order]
        frontier = pd.Series(e).groupby(g).cummax().to_numpy()
        prev = np.r_[np.iinfo(np.int64).min, frontier[:-1]]
        prev[np.r_[True, g[1:] != g[:-1]]] = np.iinfo(np.int64).min
        want = pd.Series(np.clip(e - np.maximum(s, prev), 0, None)).groupby(g).sum().to_numpy()
        assert np.array_equal(busy_union(g, s, e), want)


def test_sums_and_medians_by_code_match_groupby():
    for n, _, start, dur in _cases():
        code = rng.integers(0, int(rng.integers(1, 30)), n)
        for c in (code, code + 40_000):  # codes that a 16-bit radix sort takes, and not
            pd.testing.assert_series_equal(_sum_by_code(c, start), pd.Series(start).groupby(c).sum())
            pd.testing.assert_series_equal(_median_by_code(c, dur), pd.Series(dur).groupby(c).median(),
                                           check_exact=True)


def test_direct_match_finds_what_the_merge_finds():
    t = Trace(TRACES / "real" / "train_llama.sqlite.xz")
    rc, a = t._runtime, t.activities
    corr = a["correlationId"].to_numpy(np.int64)
    pid = np.right_shift(a["globalPid"].to_numpy(np.int64), 24)
    pos = direct_match(rc.correlationId, np.right_shift(rc.globalTid, 24), corr, pid)
    assert pos is not None and (pos >= 0).sum() == len(a)
    calls = pd.DataFrame({"correlationId": rc.correlationId, "pidkey": np.right_shift(rc.globalTid, 24),
                          "globalTid": rc.globalTid, "api_start": rc.start, "api_end": rc.end})
    merged = pd.DataFrame({"correlationId": corr, "pidkey": pid}).merge(
        calls, how="left", on=["correlationId", "pidkey"], sort=False)
    assert np.array_equal(rc.start[pos], merged["api_start"].to_numpy())
    rows, cols, one_each = join_calls(corr, pid, calls)  # the general path, on the same calls
    assert rows is None and one_each and np.array_equal(cols["api_end"], merged["api_end"].to_numpy())
    # A call repeated in the table (two rows, one correlation id): no binary search, a merge.
    assert direct_match(np.array([1, 1, 2]), np.zeros(3, np.int64), np.array([1, 2]), np.zeros(2, np.int64)) is None
    dup = calls.iloc[[pos[0], pos[0], pos[1]]]  # the first activity's call twice: its row twice
    rows, cols, one_each = join_calls(corr[:2], pid[:2], dup)
    assert rows.tolist() == [0, 0, 1] and one_each is None


@pytest.mark.parametrize("rowids", [[1, 2, 3, 4, 5], [1, 2, 5, 9, 1000], [3, 2 ** 40]])
def test_integer_columns_with_rowid_gaps(tmp_path, rowids):
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (v INTEGER, w INTEGER)")
    conn.executemany("INSERT INTO t (rowid, v, w) VALUES (?, ?, ?)",
                     [(r, 10 * r, -r) for r in rowids])
    conn.commit()
    conn.close()
    ro = db.open_readonly(path)
    got = db.int_columns(ro, str(path), "t", {"v": "a.v", "w": "a.w"}, chunk=2)
    assert got["v"].tolist() == [10 * r for r in rowids] and got["w"].tolist() == [-r for r in rowids]
    odd = db.int_columns(ro, str(path), "t", {"v": "a.v"}, where="a.v % 20 = 10", chunk=2)
    assert odd["v"].tolist() == [10 * r for r in rowids if r % 2]
