"""Is someone still writing this SQLite file, or did a writer crash and leave a hot journal?

A trace that nsys is still exporting must not be called damaged (the user only has to wait),
and one whose writer crashed mid-transaction is recoverable: SQLite rolls a hot journal back on
the next open, but only with write access, and profkit never writes to a user's input. So a
hot journal (or a WAL nobody holds open) is recovered in a private snapshot: the file and its
journal are copied into a temporary directory and SQLite recovers the copy there.

Locks are only queried (``F_GETLK``), never taken, so a writer is never blocked by profkit.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional
from urllib.parse import quote

try:
    import fcntl
except ImportError:  # Windows: no POSIX locks to query
    fcntl = None  # type: ignore[assignment]

# SQLite's lock bytes in the database file (os_unix.c): a write lock on any of them means a
# writer holds RESERVED, PENDING or EXCLUSIVE.
PENDING_BYTE = 0x40000000
LOCK_SPAN = 2 + 510            # PENDING, RESERVED, then the SHARED range
# In a WAL's -shm file: the WRITE, CHECKPOINT and RECOVER locks, then the DMS byte that every
# open connection holds.
SHM_WRITER_LOCKS = (120, 3)
SHM_DMS = 128
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
GROWTH_WAIT_S = 0.25           # how long to watch a file for a writer still appending

# struct flock on 64-bit Linux (l_type, l_whence, l_start, l_len, l_pid). Other systems order
# the fields differently; there the lock query is skipped and the other signs (a journal, a
# file still changing) decide.
_FLOCK = "hhqqi4x"
_LOCK_QUERY = (fcntl is not None and sys.platform.startswith("linux")
               and struct.calcsize(_FLOCK) == 32)


def _write_locked(path: Path, start: int, length: int, shared_too: bool = False) -> bool:
    """Whether another process holds a lock on [start, start+length) of ``path`` that would
    block a read lock (a write lock), or any lock at all with ``shared_too``."""
    if not _LOCK_QUERY:
        return False
    want = fcntl.F_WRLCK if shared_too else fcntl.F_RDLCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        req = struct.pack(_FLOCK, want, os.SEEK_SET, start, length, 0)
        res = fcntl.fcntl(fd, fcntl.F_GETLK, req)
        return struct.unpack(_FLOCK, res)[0] != fcntl.F_UNLCK
    except OSError:  # a file system without POSIX locks: no evidence either way
        return False
    finally:
        os.close(fd)


def _nonempty(p: Path) -> bool:
    try:
        return p.stat().st_size > 0
    except OSError:
        return False


def _hot_journal(journal: Path) -> bool:
    """A rollback journal that SQLite would replay: present, non-empty, with a live header
    (a committed journal in PERSIST/TRUNCATE mode has a zeroed or no header)."""
    try:
        with journal.open("rb") as fh:
            return fh.read(8) == JOURNAL_MAGIC
    except OSError:
        return False


def writer_state(path: Path) -> tuple[str, str]:
    """``("live", why)``, ``("crashed", why)`` or ``("none", "")`` for the SQLite file ``path``.

    live: a process holds a write lock on it, or has its WAL open; crashed: a hot journal or a
    WAL with no process behind it (SQLite would recover it on open).
    """
    journal = path.with_name(path.name + "-journal")
    wal = path.with_name(path.name + "-wal")
    shm = path.with_name(path.name + "-shm")
    if _write_locked(path, PENDING_BYTE, LOCK_SPAN):
        return "live", "another process holds a write lock on it"
    if _nonempty(wal):
        if shm.exists() and (_write_locked(shm, *SHM_WRITER_LOCKS)
                             or _write_locked(shm, SHM_DMS, 1, shared_too=True)):
            return "live", f"{wal.name} is open in another process"
        return "crashed", f"{wal.name} was left by a writer that did not finish"
    if _nonempty(journal) and _hot_journal(journal):
        return "crashed", f"hot journal {journal.name} was left by a writer that did not finish"
    return "none", ""


def growing(path: Path, wait: Optional[float] = None) -> bool:
    """Whether ``path`` (or its journal/WAL) changes size or time within ``wait`` seconds."""
    def sig() -> list[tuple[int, int]]:
        out = []
        for p in (path, path.with_name(path.name + "-journal"), path.with_name(path.name + "-wal")):
            try:
                st = p.stat()
                out.append((st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((-1, -1))
        return out

    first = sig()
    time.sleep(GROWTH_WAIT_S if wait is None else wait)
    return sig() != first


def still_written(path: Path, wait: Optional[float] = None) -> Optional[str]:
    """Why ``path`` looks like a file still being written, or None."""
    state, why = writer_state(path)
    if state == "live":
        return why
    wait = GROWTH_WAIT_S if wait is None else wait
    if growing(path, wait):
        return f"it changed within {wait:g} s"
    return None


def still_written_message(path: Path, why: str) -> str:
    return (f"{path}: still being written ({why}); wait for nsys to finish (the export is "
            "complete when nsys exits), then run profkit again")


# --- snapshots of a crashed writer's file ------------------------------------------------------
_SNAPSHOTS: dict[tuple, Path] = {}
_TEMP_DIRS: list[str] = []


def _cleanup() -> None:
    for d in _TEMP_DIRS:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup)


def recovered_snapshot(path: Path) -> Path:
    """A private copy of ``path`` with its hot journal or WAL applied by SQLite (cached per
    process; removed at exit). The input and its journal are only read."""
    parts = [path, path.with_name(path.name + "-journal"), path.with_name(path.name + "-wal")]
    key = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) if p.exists() else str(p)
                for p in parts)
    if key in _SNAPSHOTS and _SNAPSHOTS[key].exists():
        return _SNAPSHOTS[key]
    tmp = tempfile.mkdtemp(prefix="profkit-snapshot-")
    _TEMP_DIRS.append(tmp)
    copy = Path(tmp) / path.name
    for p in parts:
        if p.exists():
            shutil.copyfile(p, Path(tmp) / p.name)
    # Opening the copy read-write lets SQLite roll the journal back (or replay the WAL) there.
    conn = sqlite3.connect(f"file:{quote(str(copy))}?mode=rw", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if (Path(tmp) / (path.name + "-wal")).exists():
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()
    _SNAPSHOTS[key] = copy
    return copy
