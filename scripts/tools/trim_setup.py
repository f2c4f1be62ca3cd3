"""Shrink a capture whose set-up (torch.compile's compilation, autotuning and CUDA-graph recording)
dwarfs its steady state, so it can live in a repository.

Every CUDA activity and NVTX range that ends more than KEEP_NS before the first instance of the
NVTX range NAME (the loop's iteration range; ``auto``: the start of the window profkit finds) is
deleted, the cut is recorded in PROFKIT_META
(``trimmed_before_ns``), and the file is vacuumed. The steady state is untouched; what profkit
reports as set-up before the window becomes shorter than it ran. Only for traces this project
captured itself: never run it on a trace someone else owns.

    python scripts/tools/trim_setup.py TRACE.sqlite NAME [KEEP_MS]

KEEP_MS (default 2000): how much of the set-up to keep before the cut point.
"""
from __future__ import annotations

import sqlite3
import sys

KEEP_NS = 2_000_000_000
TABLES = ["CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
          "CUPTI_ACTIVITY_KIND_CUDA_EVENT", "CUDA_GRAPH_NODE_EVENTS", "NVTX_EVENTS"]


def main(path: str, name: str, keep_ns: float = KEEP_NS) -> None:
    if name == "auto":
        import profkit
        first = profkit.load(path).window.start_ns
    con = sqlite3.connect(path)
    if name != "auto":
        first = con.execute("SELECT min(start) FROM NVTX_EVENTS WHERE text = ?", (name,)).fetchone()[0]
    if first is None:
        sys.exit(f"trim_setup: no NVTX range named {name!r} in {path}")
    cut = first - int(keep_ns)
    delete_rows(con, '"end" IS NOT NULL AND "end" < ?', cut, "before", "trimmed_before_ns")


def delete_rows(con: sqlite3.Connection, where: str, cut: int, side: str, key: str,
                skip: tuple[str, ...] = ()) -> None:
    """Delete the rows of every activity table but ``skip`` matching ``where`` (one parameter:
    ``cut``), record the cut in PROFKIT_META under ``key``, vacuum and close."""
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for t in TABLES:
        if t in have and t not in skip:
            cols = {r[1] for r in con.execute(f"PRAGMA table_info({t})")}
            if not {"start", "end"} <= cols:
                # a newer export's CUDA events carry no times (correlation ids only): kept, unread
                print(f"{t}: kept (no start and end columns)")
                continue
            n = con.execute(f"DELETE FROM {t} WHERE {where}", (cut,)).rowcount
            print(f"{t}: {n} rows {side} the cut deleted")
    con.execute("INSERT INTO PROFKIT_META (key, value) VALUES (?, ?)", (key, str(cut)))
    con.commit()
    con.execute("VACUUM")
    con.close()


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) * 1e6 if len(sys.argv) == 4 else KEEP_NS)
