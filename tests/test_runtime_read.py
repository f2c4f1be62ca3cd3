"""The API table read once (profkit.read.runtime) answers as the per-question SQL queries did,
and the integer-column reader refuses anything that is not an integer."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.errors import TraceError
from profkit.read import db
from profkit.read.db import parse_ints
from profkit.read.nsys import TraceReader
from profkit.read.runtime import isin_ints
from profkit.read.trace import Trace
from profkit.run.summary import SYNC_OR_COPY_RE
from synth import PID, TID, make_trace, plain

TRACES = Path(__file__).resolve().parent.parent / "traces"


@pytest.mark.parametrize("text,n,expected", [
    ("1,2,3", 3, [1, 2, 3]),
    ("-1,-9223372036854775808,9223372036854775807", 3, [-1, -2 ** 63, 2 ** 63 - 1]),
    (None, 0, []),
    ("1,2.5,3", 3, None),      # a real in the middle
    ("1,2,3.0", 3, None),      # ... or last
    ("1,,3", 3, None),         # a NULL (int_columns turns it into an empty item)
    ("1,2,", 3, None),
    ("", 1, None),
    ("1,2x,3", 2, None),       # text with a comma count that happens to fit
    ("1,2,3abc", 3, None),
    ("1,3-4,5", 3, None),
    ("1,2,3", 2, None),
    ("1,2,Inf", 3, None),
    ("1,\u00e9", 2, None),
])
def test_parse_ints_takes_integers_only(text, n, expected):
    got = parse_ints(text, n)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.tolist() == expected


def test_isin_ints_matches_numpy():
    rng = np.random.default_rng(3)
    for span in (5, 1000, 10 ** 9, 2 ** 62):
        v = rng.integers(-span, span, 5000)
        k = np.concatenate([rng.integers(-span, span, 300), v[:40]])
        assert (isin_ints(v, k) == np.isin(v, k)).all()
    assert not isin_ints(np.array([1, 2]), np.empty(0, dtype=np.int64)).any()


def _sql_answers(path: Path, runtime) -> dict:
    """Launch join and API-call answers of a reader given ``runtime`` (None: the SQL queries)."""
    r = TraceReader(path)
    try:
        acts = r.activities()
        if runtime is None:
            r.runtime = None
        ids = [i for i, n in r.strings().items() if SYNC_OR_COPY_RE.match(n)]
        lo, hi = int(acts["start"].min()), int(acts["start"].quantile(0.5))
        pids = {int(p) >> 24 for p in acts["globalPid"]} | {None}
        return {"acts": acts, "sync": r.api_calls(ids), "between": r.api_calls(between=(lo, hi)),
                "all": r.api_calls(), "span": {p: r.api_span(p) for p in pids}}
    finally:
        r.close()


@pytest.mark.parametrize("name", ["micro_addnorm.sqlite.xz", "micro_memcpy.sqlite.xz"])
def test_arrays_answer_as_the_queries_did(name):
    path = plain(TRACES / name)
    r = TraceReader(path)
    assert r.runtime_calls() is not None
    r.close()
    fast, slow = _sql_answers(path, "arrays"), _sql_answers(path, None)
    for key in ("acts", "sync", "between", "all"):
        pd.testing.assert_frame_equal(fast[key], slow[key])
    assert fast["span"] == slow["span"]
    assert len(fast["sync"]) and len(fast["between"])


def test_a_null_thread_id_falls_back_to_the_queries(tmp_path):
    """A call with no thread id is no launch (the SQL join's ``globalTid IS NOT NULL``): the
    arrays cannot say so, so the table is not read whole and the queries answer."""
    runtime = [(110, 120, 1), (210, 220, 2)]
    kernels = [(200, 300, 1, 1), (300, 400, 2, 1)]
    path = make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime,
                      nvtx=[(0, 1000, "step", TID)])
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = NULL WHERE correlationId = 2")
    con.close()
    r = TraceReader(path)
    assert r.runtime_calls() is None
    r.close()
    acts = Trace(path).activities
    assert acts["api_start"].isna().tolist() == [False, True]


def test_an_ambiguous_minus_one_falls_back_to_the_queries(tmp_path):
    """The activities' -1 stands for a NULL correlation id, which matches no call: a call with
    id -1 is then left to SQL, which tells a NULL from a stored -1."""
    kernels = [(200, 300, 1, 1), (300, 400, None, 1)]
    runtime = [(110, 120, 1), (210, 220, -1)]
    path = make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime,
                      nvtx=[(0, 1000, "step", TID)])
    r = TraceReader(path)
    rc = r.runtime_calls()
    assert rc is not None and rc.launches(np.array([1, -1])) is None
    r.close()
    acts = Trace(path).activities
    assert acts["api_start"].isna().tolist() == [False, True]
    assert acts["globalPid"].tolist() == [PID, PID]


def test_a_prefetched_read_is_taken_once(tmp_path):
    from profkit.read import runtime
    path = tmp_path / "t.sqlite"
    path.write_bytes(plain(TRACES / "micro_addnorm.sqlite.xz").read_bytes())
    runtime.prefetch(path)
    r = TraceReader(path)
    try:
        started = runtime._started.get(runtime._identity(path))
        assert started is not None
        taken = r.runtime_calls()
        assert runtime.take_prefetched(path) is None  # taken once
        again = r.runtime_calls()                      # read here
    finally:
        r.close()
    assert started.done() and started.result() is taken
    for col in ("start", "end", "globalTid", "correlationId", "nameId"):
        assert (getattr(taken, col) == getattr(again, col)).all()


def _table(path, rows):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (v, w)")
    conn.executemany("INSERT INTO t (rowid, v, w) VALUES (?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return db.open_readonly(path)


@pytest.mark.parametrize("rowids", [list(range(1, 41)), [1, 2, 5, 9, 10, 11, 17, 30, 31, 40]])
def test_a_chunked_read_shared_by_two_threads_gives_the_rows_in_order(tmp_path, rowids):
    """Two connections take the chunks between them in whatever order they come: each chunk
    lands where its rowids put it, and the gaps are closed up."""
    rng = np.random.default_rng(7)
    rows = [(r, int(v), -r) for r, v in zip(rowids, rng.integers(-10**12, 10**12, len(rowids)))]
    conn = _table(tmp_path / "t.sqlite", rows)
    read = db.RowidChunks(str(tmp_path / "t.sqlite"), "t", {"v": "a.v", "w": "a.w"}, rowids[0], rowids[-1],
                          chunk=3)
    factories = []

    def help_read() -> None:
        other = db.open_readonly(tmp_path / "t.sqlite")
        read.work(other)
        factories.append(other.text_factory)
        other.close()

    helper = threading.Thread(target=help_read)
    helper.start()
    got = read.result(conn)
    helper.join()
    assert got["v"].tolist() == [v for _, v, _ in rows] and got["w"].tolist() == [-r for r in rowids]
    assert conn.text_factory is db._decode and factories == [db._decode]
    odd = db.RowidChunks(str(tmp_path / "t.sqlite"), "t", {"v": "a.v"}, rowids[0], rowids[-1],
                         where="a.w % 2 = 0", chunk=4).result(conn)
    assert odd["v"].tolist() == [v for r, v, _ in rows if r % 2 == 0]


def test_a_chunked_read_names_a_column_that_is_not_integers(tmp_path):
    conn = _table(tmp_path / "t.sqlite", [(r, r, "x" if r == 7 else r) for r in range(1, 11)])
    read = db.RowidChunks(str(tmp_path / "t.sqlite"), "t", {"v": "a.v", "w": "a.w"}, 1, 10, chunk=3)
    with pytest.raises(TraceError, match=r"t\.w holds 1 text where integers are expected"):
        read.result(conn)


def test_the_reader_helps_finish_a_prefetched_read(tmp_path):
    """Chunks the prefetching thread has not begun are read on the reader's own connection."""
    from profkit.read import runtime
    path = tmp_path / "t.sqlite"
    path.write_bytes(plain(TRACES / "micro_addnorm.sqlite.xz").read_bytes())
    r = TraceReader(path)
    try:
        want = runtime.read_calls(r.conn, str(path))
        key = runtime._identity(path)
        table = db.resolve_table(db.list_tables(r.conn), "CUPTI_ACTIVITY_KIND_RUNTIME")
        lo, hi = r.conn.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        chunks = db.RowidChunks(str(path), table, runtime.COLUMNS, lo, hi, chunk=50)
        runtime._reading[key] = chunks  # as a prefetch that has not read a chunk yet
        runtime.help_prefetched(path, r.conn)
        assert chunks.taken == len(chunks.bounds) and None not in chunks.rows
        got = chunks.result(r.conn)
    finally:
        runtime._reading.pop(runtime._identity(path), None)
        r.close()
    for col in runtime.COLUMNS:
        assert (got[col] == getattr(want, col)).all()


def test_no_prefetch_for_a_compressed_or_missing_trace(tmp_path):
    from profkit.read import runtime
    runtime.prefetch(TRACES / "micro_addnorm.sqlite.xz")  # decompressed by the reader, once
    runtime.prefetch(tmp_path / "missing.sqlite")
    assert runtime.take_prefetched(TRACES / "micro_addnorm.sqlite.xz") is None
    assert runtime.take_prefetched(tmp_path / "missing.sqlite") is None


def test_the_command_line_imports_no_pandas_before_a_command_runs():
    """profkit classify reads the API table while pandas and the analysis modules load: that
    needs `import profkit.cli` to stay free of them."""
    import subprocess
    import sys
    code = "import sys, profkit.cli; print(sorted({'pandas', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"
