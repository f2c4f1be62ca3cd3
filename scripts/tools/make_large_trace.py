"""Make a large Nsight Systems SQLite trace, in the real nsys schema, by repeating a real one.

    python scripts/tools/make_large_trace.py traces/micro_chain.sqlite.xz /tmp/big.sqlite --kernels 1000000
    python scripts/tools/make_large_trace.py traces/real/train_gpt2.sqlite.xz /tmp/rep.sqlite --copies 200

The source is copied with SQLite's backup API from a read-only connection (it is never
written). Static tables (StringIds, TARGET_INFO_*, META_DATA_*, ENUM_*, ThreadNames, ...)
stay as they are; the time-varying tables (kernels, runtime calls, NVTX events, memcpys,
memsets, synchronizations) are repeated N times in SQL (N from ``--kernels`` or ``--copies``),
copy ``i`` shifted by ``i * (source span + gap)`` ns and with ``correlationId`` offset by
``i * (max id + 1)``, so launches still link to their kernels and ids stay unique per process.
NVTX domain-creation events are kept once (a process creates a domain once). Prints the counts
at the end.
"""
from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Optional
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from profkit.read.compressed import decompressed, is_compressed  # noqa: E402

# Tables whose rows happen in time; repeated if present. Everything else is copied once.
TIME_TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
               "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
               "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"]
NVTX_DOMAIN_CREATE = 75
NVTX_RANGE_TYPES = "59, 60, 70, 71"  # push/pop and start/end ranges (ENUM_NSYS_EVENT_TYPE)


def copy_readonly(src: Path, out: Path) -> None:
    """Copy ``src`` to ``out`` without ever opening ``src`` for writing."""
    if out.exists():
        out.unlink()
    if is_compressed(src):
        src = decompressed(src)
    s = sqlite3.connect(f"file:{quote(str(src.resolve()))}?mode=ro", uri=True)
    d = sqlite3.connect(out)
    s.backup(d)
    s.close()
    d.close()


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def scalar(conn: sqlite3.Connection, sql: str) -> int:
    return conn.execute(sql).fetchone()[0] or 0


def replicate(out: Path, kernels: int, gap_ns: int, copies: Optional[int] = None) -> dict[str, int]:
    """Repeat the time-varying tables of ``out`` until it holds at least ``kernels`` kernels, or
    ``copies`` times in all when given."""
    conn = sqlite3.connect(out, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    tables = [t for t in TIME_TABLES if t in have]
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        sys.exit(f"{out}: source has no CUPTI_ACTIVITY_KIND_KERNEL table")
    src_kernels = scalar(conn, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    if src_kernels == 0:
        sys.exit("source has no kernels")
    t0 = min(scalar(conn, f'SELECT min(start) FROM "{t}"') for t in tables)
    t1 = max(scalar(conn, f'SELECT max(max(start), coalesce(max("end"), 0)) FROM "{t}"') for t in tables)
    period = t1 - t0 + gap_ns
    corr_tables = [t for t in tables if "correlationId" in columns(conn, t)]
    corr_step = max(scalar(conn, f'SELECT max(correlationId) FROM "{t}"') for t in corr_tables) + 1
    copies = max(1, copies if copies is not None else math.ceil(kernels / src_kernels))

    conn.execute("BEGIN")
    for t in tables if copies > 1 else []:
        cols = columns(conn, t)
        exprs = []
        for c in cols:
            if c in ("start", "end"):
                exprs.append(f'"{c}" + c.i * {period}')
            elif c == "correlationId":
                exprs.append(f'"{c}" + c.i * {corr_step}')
            else:
                exprs.append(f'"{c}"')
        names = ", ".join(f'"{c}"' for c in cols)
        where = f"WHERE eventType != {NVTX_DOMAIN_CREATE}" if t == "NVTX_EVENTS" else ""
        conn.execute(f'CREATE TEMP TABLE src AS SELECT * FROM "{t}" {where} ORDER BY rowid')
        # CROSS JOIN keeps the copy counter as the outer loop: rows go in, copy after copy.
        conn.execute(
            f'WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {copies - 1}) '
            f'INSERT INTO "{t}" ({names}) '
            f'SELECT {", ".join(exprs)} FROM c CROSS JOIN temp.src ORDER BY c.i, temp.src.rowid')
        conn.execute("DROP TABLE temp.src")
    conn.execute("COMMIT")

    counts = {"copies": copies, "period_ns": period}
    for t in tables:
        counts[t] = scalar(conn, f'SELECT count(*) FROM "{t}"')
    if "NVTX_EVENTS" in tables:
        counts["nvtx_ranges"] = scalar(
            conn, f"SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN ({NVTX_RANGE_TYPES})")
    conn.close()
    return counts


def build(src: Path, out: Path, kernels: int = 1_000_000, gap_ns: int = 1_000_000,
          copies: Optional[int] = None) -> dict[str, int]:
    """Write ``out``: ``src`` repeated until it holds about ``kernels`` kernels (or ``copies``
    times). Returns counts."""
    if src.resolve() == out.resolve():
        sys.exit("OUT must differ from SRC")
    copy_readonly(src, out)
    return replicate(out, kernels, gap_ns, copies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="real nsys SQLite export to repeat (read only)")
    ap.add_argument("out", type=Path, help="output .sqlite (overwritten)")
    ap.add_argument("--kernels", type=int, default=1_000_000, help="kernels wanted (at least)")
    ap.add_argument("--copies", type=int, default=None, help="copies in all (instead of --kernels)")
    ap.add_argument("--gap-ns", type=int, default=1_000_000, help="idle gap between copies (ns)")
    a = ap.parse_args()
    t = time.perf_counter()
    counts = build(a.src, a.out, a.kernels, a.gap_ns, a.copies)
    for k, v in counts.items():
        print(f"{k:40s} {v:>14,}")
    print(f"{'file size (bytes)':40s} {a.out.stat().st_size:>14,}")
    print(f"built {a.out} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
