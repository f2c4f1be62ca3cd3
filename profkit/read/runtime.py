"""The CUDA API table (CUPTI_ACTIVITY_KIND_RUNTIME) read once, as arrays in table order.

A trace of a million kernels holds three million API calls, and four questions were asked of
them, each a scan of the whole table: which calls launched the GPU work (a join on the
correlation id), which calls synchronise or copy (by name), which calls a window holds (by start
time) and when a process's calls begin and end. Reading the five columns these need once, and
answering each question with a numpy mask, costs about as much as the first scan alone.

Only a table whose five columns hold integers everywhere is read this way (``None`` otherwise):
the reader's queries then keep their own answer for damaged rows (a NULL thread id leaves a call
out of the launches; a text start time is an error only where a question reads that row).

The command line starts this read (``prefetch``) before it imports the analysis modules, which
take about half a second: SQLite releases the GIL, so the two run side by side. It is read in
chunks any thread can take (db.RowidChunks): the reader, once its own tables are read, takes the
chunks the prefetching thread has not begun (``help_prefetched``) rather than wait for them.
"""
from __future__ import annotations

import os
import sqlite3
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from profkit.errors import TraceError
from profkit.read import compressed, db, livefile

# The columns read, as int_columns expressions: no coalesce, so that a NULL anywhere makes the
# read fail and the reader's queries answer instead.
COLUMNS = {"start": "a.start", "end": 'a."end"', "globalTid": "a.globalTid",
           "correlationId": "a.correlationId", "nameId": "a.nameId"}


# Keys spanning at most this many values are looked up in a table of flags (64 MiB at most).
TABLE_SPAN = 1 << 26


def isin_ints(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.isin(values, keys)`` for int64 arrays, in linear time where the keys span a range of
    at most TABLE_SPAN (ids are dense), else by binary search in the sorted keys.

    np.isin itself sorts through np.unique whenever the key range exceeds a few times the
    number of values, which for three million calls took over a second."""
    if not len(values) or not len(keys):
        return np.zeros(len(values), dtype=bool)
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo < TABLE_SPAN:
        table = np.zeros(hi - lo + 1, dtype=bool)
        table[keys - lo] = True
        inside = (values >= lo) & (values <= hi)
        out = np.zeros(len(values), dtype=bool)
        out[inside] = table[values[inside] - lo]
        return out
    sorted_keys = np.sort(keys)
    at = np.minimum(np.searchsorted(sorted_keys, values), len(sorted_keys) - 1)
    return sorted_keys[at] == values


@dataclass(frozen=True)
class RuntimeCalls:
    """Every API call: start, end, globalTid, correlationId, nameId (StringIds id), each an int64
    array in the table's rowid order."""
    start: np.ndarray
    end: np.ndarray
    globalTid: np.ndarray
    correlationId: np.ndarray
    nameId: np.ndarray

    def launches(self, correlation_ids: np.ndarray) -> Optional[np.ndarray]:
        """Positions of the calls whose correlation id is among ``correlation_ids`` (those of
        the GPU activities), in table order: the SQL ``correlationId IN (SELECT correlationId
        FROM <activity table>)``.

        None when the answer depends on what the arrays cannot tell: the activities' -1 stands
        for a NULL id (which matches nothing) as well as a stored -1, so a call with id -1 could
        go either way."""
        corr = self.correlationId
        if len(corr) and (corr == -1).any() and (np.asarray(correlation_ids) == -1).any():
            return None
        return np.flatnonzero(isin_ints(corr, np.asarray(correlation_ids, dtype=np.int64)))

    def select(self, name_ids: Optional[list[int]] = None,
               between: Optional[tuple[int, int]] = None) -> np.ndarray:
        """Positions of the calls with one of ``name_ids`` that start in ``between`` (each
        optional), in table order."""
        keep = np.ones(len(self.start), dtype=bool)
        if name_ids is not None:
            keep &= isin_ints(self.nameId, np.asarray(name_ids, dtype=np.int64))
        if between is not None:
            keep &= (self.start >= int(between[0])) & (self.start <= int(between[1]))
        return np.flatnonzero(keep)

    def span(self, pid: Optional[int] = None) -> Optional[tuple[int, int]]:
        """First start and last end of the calls (of process ``pid``: globalTid >> 24)."""
        start, end = self.start, self.end
        if pid is not None:
            mine = np.right_shift(self.globalTid, 24) == pid
            if not mine.all():  # (one process's calls, as most traces: no copies of the columns)
                start, end = start[mine], end[mine]
        return (int(start.min()), int(end.max())) if len(start) else None


def read_calls(conn: sqlite3.Connection, path: str,
               started: Optional[Callable[[db.RowidChunks], None]] = None) -> Optional[RuntimeCalls]:
    """The whole API table of the open export ``conn`` as arrays, or None when the export has
    none, lacks a column, or holds anything but integers in one (then the reader's queries read
    what they need). ``started``: given the chunked read once it begins, for other threads to
    take part in (db.RowidChunks.work)."""
    table = db.resolve_table(db.list_tables(conn), "CUPTI_ACTIVITY_KIND_RUNTIME")
    if not table or not set(COLUMNS) <= db.columns_of(conn, table):
        return None
    try:
        return RuntimeCalls(**db.int_columns(conn, path, table, COLUMNS, started=started))
    except TraceError:
        return None


# Reads started by prefetch(), by the file's identity (path, device, inode, size, mtime), until
# taken; and their chunks, while they are read.
_started: dict[tuple, Future] = {}
_reading: dict[tuple, db.RowidChunks] = {}
_lock = threading.Lock()


def _identity(path: str | Path) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def prefetch(path: str | Path) -> None:
    """Start reading the API table of the export at ``path`` in a background thread, for a
    TraceReader of the same file to take (``take_prefetched``) and, where it runs out of work
    of its own first, to help finish (``help_prefetched``). Only for a plain export that no
    one is writing: a compressed one is decompressed, and a crashed writer's is recovered, by
    the reader itself, once."""
    p = Path(path)
    key = _identity(p)
    try:
        plain = key is not None and p.is_file() and not compressed.is_compressed(p) \
            and livefile.writer_state(p)[0] == "none"
    except OSError:
        plain = False
    if not plain:
        return
    with _lock:
        if key in _started:
            return
        future: Future = Future()
        _started[key] = future

    def reading(chunks: db.RowidChunks) -> None:
        with _lock:
            _reading[key] = chunks

    def read() -> None:
        try:
            conn = db.open_readonly(p)
            try:
                calls = read_calls(conn, str(path), reading)
            finally:
                conn.close()
                with _lock:
                    _reading.pop(key, None)
            future.set_result(calls)
        except BaseException as exc:  # handed to the reader, which reads again and reports it
            future.set_exception(exc)

    # A daemon: a command that fails before reading the trace does not wait for it to finish.
    threading.Thread(target=read, name="profkit-prefetch", daemon=True).start()


def help_prefetched(path: str | Path, conn: sqlite3.Connection) -> None:
    """Read, on ``conn``, the chunks of this file's prefetched API table that its thread has
    not begun: the caller would otherwise wait for them with a core idle."""
    key = _identity(path)
    with _lock:
        chunks = _reading.get(key) if key is not None else None
    if chunks is not None:
        chunks.work(conn)


def take_prefetched(path: str | Path) -> Optional[Future]:
    """The read that ``prefetch`` started for this file (once), or None."""
    key = _identity(path)
    if key is None:
        return None
    with _lock:
        return _started.pop(key, None)
