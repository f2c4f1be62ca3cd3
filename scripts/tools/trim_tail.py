"""Shrink a capture by dropping the iterations after the first KEEP of its loop, so it can live in
a repository.

Every CUDA activity and NVTX range that starts after the start of instance KEEP + 2 of the NVTX
range NAME is deleted (instance KEEP + 1 stays whole, the partial iteration profkit leaves out);
NVTX marks stay, being notes about the whole run rather than work of an iteration (the aten
recorder's cost, left when the program ends),
the cut is recorded in PROFKIT_META (``trimmed_after_ns``), and the file is vacuumed. What is
kept is the capture as it ran; the window profkit finds is shorter, so figures read from the
trace change with it: trim before anything is read from it. Only for traces this project
captured itself: never run it on a trace someone else owns.

    python scripts/tools/trim_tail.py TRACE.sqlite NAME KEEP
"""
from __future__ import annotations

import sqlite3
import sys

from trim_setup import delete_rows


def main(path: str, name: str, keep: int) -> None:
    con = sqlite3.connect(path)
    starts = [r[0] for r in con.execute("SELECT start FROM NVTX_EVENTS WHERE text = ? ORDER BY start", (name,))]
    if len(starts) < keep + 2:
        sys.exit(f"trim_tail: {path} has {len(starts)} ranges named {name!r}, not more than {keep + 1}")
    cut = starts[keep + 1]
    # marks (instant events) have no end
    delete_rows(con, 'start >= ? AND "end" IS NOT NULL', cut, "after", "trimmed_after_ns")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
