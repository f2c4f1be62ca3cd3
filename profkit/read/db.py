"""The export as an SQLite database: opened read-only, integer columns read as numpy arrays.

Free of pandas on purpose: the command line starts reading a trace here while the analysis
modules are still being imported (profkit.read.runtime.prefetch).
"""
from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import quote

import numpy as np

from profkit.errors import TraceError
from profkit.read import compressed, livefile

SQLITE_MAGIC = b"SQLite format 3\x00"
REEXPORT = "export the trace again with `nsys export --type sqlite`"


def _decode(raw: bytes) -> str:
    """Text as stored; bytes that are not UTF-8 are replaced, never raised (damaged names)."""
    return raw.decode("utf-8", errors="replace")


def _unreadable(p: Path, message: str) -> TraceError:
    """``message`` (the file looks damaged), unless the file is still being written: then the
    answer is to wait, not to export again."""
    why = livefile.still_written(p)
    return TraceError(livefile.still_written_message(p, why) if why else message)


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Open ``path`` read-only, with checks that give one clear message for each bad input.

    Opened with ``mode=ro&immutable=1``: SQLite takes no lock and writes nothing beside the
    file. A compressed export (``.gz``, ``.xz``, ``.bz2``, ``.zst``) is read from its decompressed
    copy in profkit's cache (profkit.read.compressed). A file that a live writer holds is refused with "still being written"; one whose
    writer crashed (a hot journal) is read from a recovered private snapshot (profkit.read.livefile).
    """
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file; pass the .sqlite that `nsys export --type sqlite` wrote")
    if not p.is_file():
        raise TraceError(f"{p}: not a file; pass an .sqlite trace exported by Nsight Systems")
    if p.stat().st_size == 0:
        raise _unreadable(p, f"{p}: empty file (0 bytes); {REEXPORT}")
    packed = compressed.is_compressed(p)
    # A compressed export is read from its decompressed copy in the cache; messages name the input.
    target = compressed.decompressed(p) if packed else p
    try:
        with target.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if head != SQLITE_MAGIC:
        hint = (" (it looks like an .nsys-rep: run `nsys export --type sqlite` on it first)"
                if p.suffix in (".nsys-rep", ".qdrep", ".qdstrm") else
                "; export one with `nsys export --type sqlite report.nsys-rep`")
        what = "does not hold an SQLite file once decompressed" if packed else "not an SQLite file"
        raise TraceError(f"{p}: {what}{hint}")
    state, why = ("none", "") if packed else livefile.writer_state(p)
    if state == "live":
        raise TraceError(livefile.still_written_message(p, why))
    if state == "crashed":
        try:
            target = livefile.recovered_snapshot(p)
        except (OSError, sqlite3.Error) as exc:
            raise TraceError(f"{p}: {why}, and recovering it failed ({exc}); {REEXPORT}") from None
    uri = f"file:{quote(str(target.resolve()))}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.text_factory = _decode
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise _unreadable(p, f"{p}: damaged or truncated SQLite file ({exc}); {REEXPORT}") from None
    except UnicodeError:  # SQLite's own message quoted bytes of a damaged schema
        raise _unreadable(p, f"{p}: damaged or truncated SQLite file (the schema does not "
                             f"decode); {REEXPORT}") from None
    return conn


def damaged(path: str | Path, detail: str) -> TraceError:
    """The error for a file that cannot be read as it is: ``detail`` says where it is broken."""
    return _unreadable(Path(path), f"{path}: damaged export: {detail}; {REEXPORT}")


def list_tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def resolve_table(tables: list[str], base: str) -> Optional[str]:
    """``base`` itself, or its newest versioned form (``base_V3`` over ``base_V2``)."""
    best, best_v = (base, 0) if base in tables else (None, -1)
    pat = re.compile(re.escape(base) + r"_V(\d+)$")
    for t in tables:
        m = pat.match(t)
        if m and int(m.group(1)) > best_v:
            best, best_v = t, int(m.group(1))
    return best


def columns_of(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}


_LAST_INT = re.compile(rb"-?[0-9]+")


def parse_ints(text: object, n: int) -> Optional[np.ndarray]:
    """The ``n`` integers of a comma-separated ``group_concat`` text, or None when it holds
    anything else (an empty item for a NULL, text, a real such as ``1.5``, a blob).

    The checks are what make a wrong value impossible rather than unlikely: exactly ``n - 1``
    commas give ``n`` items; numpy stops at the first item that is not an integer and returns
    fewer values, except at the last item, which is checked whole. (A blob whose bytes spell an
    integer in ASCII digits reads as that integer.)"""
    if n == 0:
        return np.empty(0, dtype=np.int64) if text is None else None
    if isinstance(text, str):
        text = text.encode("utf-8", errors="replace")
    if not isinstance(text, bytes) or not text.isascii() or text.count(b",") != n - 1:
        return None
    if not _LAST_INT.fullmatch(text, text.rfind(b",") + 1):
        return None
    try:
        values = np.fromstring(text, dtype=np.int64, sep=",")
    except (ValueError, DeprecationWarning):  # DeprecationWarning: raised where warnings are errors
        return None
    return values if len(values) == n else None


def int_columns(conn: sqlite3.Connection, path: str, table: str, exprs: dict[str, str],
                where: str = "", chunk: int = 250_000,
                rowids: Optional[tuple[int, int]] = None,
                started: Optional[Callable[["RowidChunks"], None]] = None) -> dict[str, np.ndarray]:
    """Integer columns of ``table`` as numpy arrays, without a Python object per value.

    SQLite concatenates each column into one text per chunk of rows and numpy parses it:
    several times faster than fetching rows for million-row tables. A value that is not an
    integer (NULL, text, a real, a blob: a damaged export) makes :func:`bad_column` name the
    column in a :class:`TraceError`; NULLs the caller accepts must be mapped to a sentinel
    (``coalesce(x, -1)``). ``rowids``: only the rows whose rowid is in [lo, hi], found through
    the table's b-tree instead of a scan of every row. ``started``: given the chunked read
    (RowidChunks) once it begins, for other threads to take part in; not called where the rowids
    span too wide a range to be read that way.
    """
    # Two queries: SQLite finds a min() or a max() of the rowid in the b-tree alone, but
    # scans the whole table for both at once.
    lo = conn.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
    hi = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
    if rowids is not None and lo is not None:
        lo, hi = max(lo, int(rowids[0])), min(hi, int(rowids[1]))
    if lo is None or lo > hi:
        return {k: np.empty(0, dtype=np.int64) for k in exprs}
    if hi - lo + 1 <= STRIDE_SPAN:
        chunks = RowidChunks(path, table, exprs, lo, hi, where, chunk)
        if started is not None:
            started(chunks)
        return chunks.result(conn)
    # The texts as bytes, not decoded into a second copy (a 1M-row table gives 100 MB of them).
    conn.text_factory = bytes
    try:
        return _int_chunks(conn, path, table, exprs, where, chunk, lo, hi, rowids is not None)
    finally:
        conn.text_factory = _decode


# Rowid spans up to this are read in chunks of rowid values (RowidChunks); wider ones, in chunks
# of the rows there are.
STRIDE_SPAN = 2 ** 27


def _int_chunks(conn: sqlite3.Connection, path: str, table: str, exprs: dict[str, str],
                where: str, chunk: int, lo: int, hi: int, part: bool = False) -> dict[str, np.ndarray]:
    sel, cond = _select(exprs), (f" AND ({where})" if where else "")
    first = lo
    # A damaged b-tree can make the seeks below go backwards or never end: each chunk must
    # move forward, and there cannot be more chunks than the table's rows need.
    span = hi - lo + 1
    rows = conn.execute(f'SELECT count(*) FROM "{table}" WHERE rowid BETWEEN ? AND ?', (lo, hi)).fetchone()[0] \
        if part else conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    # Rowids 1..n without a gap (as exports write them): the chunks' bounds are known without
    # seeking them, which reads every page once more.
    dense = rows == span
    chunks_left = rows // chunk + 2
    # Each column filled chunk by chunk into one array of the rows counted (no list of chunks
    # concatenated at the end, which held every column twice at once).
    out = _Columns(exprs, rows)
    while first is not None:
        chunks_left -= 1
        if chunks_left < 0:
            raise damaged(path, f"{table}: its rows cannot be read in order")
        if dense:
            last = min(first + chunk - 1, hi)
        else:
            # Chunks of ``chunk`` existing rows, not of rowid values: a damaged file can hold
            # rowids far apart (1 and 2**62), which a stride over the range would walk forever.
            last = conn.execute(
                f'SELECT rowid FROM "{table}" WHERE rowid >= ? ORDER BY rowid LIMIT 1 OFFSET ?',
                (first, chunk - 1)).fetchone()
            last = hi if last is None else min(last[0], hi)
        row = conn.execute(
            f'SELECT count(*), {sel} FROM "{table}" AS a WHERE a.rowid BETWEEN ? AND ?{cond}',
            (first, last)).fetchone()
        nxt = (last + 1 if last < hi else None) if dense else conn.execute(
            f'SELECT min(rowid) FROM "{table}" WHERE rowid > ? AND rowid <= ?', (last, hi)).fetchone()[0]
        if last < first or (nxt is not None and nxt <= last):
            raise damaged(path, f"{table}: its rows cannot be read in order")
        first = nxt
        n = row[0]
        for key, text in zip(exprs, row[1:]):
            values = parse_ints(text, n)
            if values is None:
                raise bad_column(conn, path, table, exprs[key], where)
            out.add(key, values)
        out.rows_done(n)
    return out.arrays()


def _select(exprs: dict[str, str]) -> str:
    # NULL as an empty item, so that it cannot go unseen (group_concat skips NULLs). The
    # type of each value is checked on the text (parse_ints) rather than with typeof() in
    # SQL, which cost a third of the query.
    return ", ".join(f"group_concat(coalesce({e}, ''))" for e in exprs.values())


class RowidChunks:
    """An ``int_columns`` read of the rowids [lo, hi] in chunks of ``chunk`` rowid values, which
    any number of threads can take part in, each with its own connection (``work``).

    Each chunk fills the part of span-sized arrays its rowids would take: no count of the rows
    first (which reads every page once more), and a chunk's place does not depend on which
    thread read the chunks before it. Rows a gap in the rowids or the WHERE leaves out are
    closed up at the end (``result``). A thread that needs the arrays while another reads
    them takes the chunks nobody has begun instead of waiting for them."""

    def __init__(self, path: str, table: str, exprs: dict[str, str], lo: int, hi: int,
                 where: str = "", chunk: int = 250_000) -> None:
        self.path, self.table, self.exprs, self.where, self.lo = path, table, exprs, where, lo
        self.sql = (f'SELECT count(*), {_select(exprs)} FROM "{table}" AS a WHERE a.rowid BETWEEN ? AND ?'
                    + (f" AND ({where})" if where else ""))
        self.bounds = [(a, min(a + chunk - 1, hi)) for a in range(lo, hi + 1, chunk)]
        self.arrays = {k: np.empty(hi - lo + 1, dtype=np.int64) for k in exprs}
        self.rows: list[Optional[int]] = [None] * len(self.bounds)
        self.taken = 0
        self.error: Optional[BaseException] = None
        self.bad_expr: Optional[str] = None
        self.cond = threading.Condition()

    def work(self, conn: sqlite3.Connection) -> None:
        """Read chunks nobody has taken yet on ``conn`` until none is left (or one fails)."""
        factory, conn.text_factory = conn.text_factory, bytes  # texts as bytes, not decoded again
        try:
            while True:
                with self.cond:
                    if self.error is not None or self.taken == len(self.bounds):
                        return
                    i, self.taken = self.taken, self.taken + 1
                first, last = self.bounds[i]
                row = conn.execute(self.sql, (first, last)).fetchone()
                n, at = row[0], first - self.lo
                for key, text in zip(self.exprs, row[1:]):
                    values = parse_ints(text, n)
                    if values is None:
                        self.bad_expr = self.exprs[key]
                        raise ValueError(key)
                    self.arrays[key][at:at + n] = values
                with self.cond:
                    self.rows[i] = n
                    self.cond.notify_all()
        except BaseException as exc:
            with self.cond:
                self.error = self.error or exc
                self.cond.notify_all()
        finally:
            conn.text_factory = factory

    def result(self, conn: sqlite3.Connection) -> dict[str, np.ndarray]:
        """The columns, once every chunk is read (those left, read here on ``conn``); a value
        that is not an integer raises the error that names its column."""
        self.work(conn)
        with self.cond:
            self.cond.wait_for(lambda: self.error is not None or None not in self.rows)
            error = self.error
        if error is not None:
            if self.bad_expr is not None:
                raise bad_column(conn, self.path, self.table, self.bad_expr, self.where)
            raise error
        out = self.arrays
        if any(n != b - a + 1 for n, (a, b) in zip(self.rows, self.bounds)):
            at = 0  # close up the rows left out, in place (each part moves towards the front)
            for n, (a, _) in zip(self.rows, self.bounds):
                for arr in out.values():
                    arr[at:at + n] = arr[a - self.lo:a - self.lo + n]
                at += n
            out = {k: arr[:at].copy() for k, arr in out.items()}
        return out


class _Columns:
    """Integer columns filled chunk by chunk: into arrays of the ``rows`` expected, or, should a
    damaged file hold more, into a list of chunks joined at the end."""

    def __init__(self, keys, rows: int) -> None:
        self.full = {k: np.empty(max(rows, 0), dtype=np.int64) for k in keys}
        self.extra: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        self.at = 0

    def add(self, key: str, values: np.ndarray) -> None:
        arr = self.full[key]
        fit = max(min(len(values), len(arr) - self.at), 0)
        arr[self.at:self.at + fit] = values[:fit]
        if fit < len(values):
            self.extra[key].append(values[fit:])

    def rows_done(self, n: int) -> None:
        self.at = min(self.at + n, len(next(iter(self.full.values()), ())))

    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for k, arr in self.full.items():
            # Rows a WHERE left out leave the end unfilled: a copy of the filled part.
            arr = arr if self.at == len(arr) else arr[:self.at].copy()
            out[k] = np.concatenate([arr, *self.extra[k]]) if self.extra[k] else arr
        return out


def bad_column(conn: sqlite3.Connection, path: str, table: str, expr: str, where: str = "") -> TraceError:
    """The one-line error for a column that holds something other than integers."""
    m = re.search(r'a\."?([A-Za-z_][A-Za-z0-9_]*)"?', expr)
    col = m.group(1) if m else expr
    cond = f"WHERE {where}" if where else ""
    what = "values that are not integers"
    if m:
        nulls, texts, reals, blobs = conn.execute(
            f'SELECT sum("{col}" IS NULL), sum(typeof("{col}") = \'text\'), '
            f'sum(typeof("{col}") = \'real\'), sum(typeof("{col}") = \'blob\') '
            f'FROM "{table}" AS a {cond}').fetchone()
        kinds = [f"{n} {label}" for n, label in ((nulls, "NULL"), (texts, "text"),
                                                 (reals, "real"), (blobs, "blob")) if n]
        if kinds:
            what = ", ".join(kinds) + " where integers are expected"
    return damaged(path, f"{table}.{col} holds {what}")
