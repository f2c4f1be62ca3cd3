"""Blank the columns of a compressed capture that profkit never reads, so the project's committed
traces take less room (about 12% of their .xz size).

In ``CUPTI_ACTIVITY_KIND_KERNEL``: the grid id, registers, shared and local memory sizes, launch
type, cache config, context ids and the mangled name (the demangled and short names stay); in
``CUPTI_ACTIVITY_KIND_RUNTIME``: the event class, return value and call-chain id. Each becomes
NULL (0 where the schema forbids NULL). The rows of two tables profkit never reads are dropped: ``TARGET_INFO_SYSTEM_ENV`` (the capturing machine's
environment variables and system settings, which also need not travel with a trace) and
``PROFILER_OVERHEAD`` (nsys's own buffer flushes; the profiler's cost is taken from the
calibration run instead). The tables, their columns and every other value stay, so the file is
still an Nsight Systems export and profkit reads from it exactly what it read before (the
golden tests and the pages' --check say so). The
file is rewritten in place (xz -9e) only when that makes it smaller. Only for traces this project
captured itself: never run it on a trace someone else owns.

    python scripts/tools/slim_trace.py TRACE.sqlite.xz [...]
"""
from __future__ import annotations

import lzma
import sqlite3
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

UNREAD = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("gridId", "registersPerThread", "staticSharedMemory", "dynamicSharedMemory",
                                   "localMemoryPerThread", "localMemoryTotal", "sharedMemoryExecuted",
                                   "sharedMemoryLimitConfig", "launchType", "cacheConfig", "greenContextId",
                                   "contextId", "mangledName"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("eventClass", "returnValue", "callchainId"),
}

EMPTIED = ("TARGET_INFO_SYSTEM_ENV", "PROFILER_OVERHEAD")


def slim(path: str) -> str:
    src = Path(path)
    if not src.name.endswith(".sqlite.xz"):
        return f"{src}: skipped (not a .sqlite.xz)"
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "t.sqlite"
        db.write_bytes(lzma.decompress(src.read_bytes()))
        con = sqlite3.connect(db)
        for table, cols in UNREAD.items():
            notnull = {r[1]: r[3] for r in con.execute(f'PRAGMA table_info("{table}")')}
            sets = [f'"{c}" = {"0" if notnull[c] else "NULL"}' for c in cols if c in notnull]
            if sets:
                con.execute(f'UPDATE "{table}" SET {", ".join(sets)}')
        have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in EMPTIED:
            if table in have:
                con.execute(f'DELETE FROM "{table}"')
        con.commit()
        con.execute("VACUUM")
        con.close()
        out = lzma.compress(db.read_bytes(), preset=9 | lzma.PRESET_EXTREME)
    before = src.stat().st_size
    if len(out) >= before:
        return f"{src}: kept ({before} bytes)"
    src.write_bytes(out)
    return f"{src}: {before} -> {len(out)} bytes"


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    with ProcessPoolExecutor() as ex:
        for line in ex.map(slim, paths):
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
