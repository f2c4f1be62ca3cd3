"""Shrink a capture whose set-up (torch.compile's compilation, autotuning and CUDA-graph recording)
dwarfs its steady state, so it can live in a repository.

Every CUDA activity and NVTX range that ends more than KEEP_NS before the first instance of the
NVTX range NAME (the loop's iteration range; ``auto``: the start of the window profkit finds) is
deleted, the cut is recorded in PROFKIT_META
(``trimmed_before_ns``), and the file is vacuumed. The steady state is untouched; what profkit
reports as set-up before the window becomes shorter than it ran. Only for traces this project
captured itself: never run it on a trace someone else owns.

    python scripts/tools/trim_setup.py [--check] TRACE.sqlite NAME [KEEP_MS]

KEEP_MS (default 2000): how much of the set-up to keep before the cut point. ``--check``: cut a
copy, and keep the cut only where profkit's judgement of the trace is unchanged by it (``classify
--format json``, less what it says of the set-up before the window: its length and what the file
keeps); otherwise leave the trace as it was, print where the two differ and exit 1. The set-up a
committed capture keeps is what a few of its notes read (a model upload's copies, compilation
before the window), so a cut is only as safe as this check says.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

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


def judgement(path: str) -> dict:
    """profkit's JSON for ``path`` without what a cut of the set-up may change: the set-up's
    length, the rows the file keeps, the file's own name."""
    done = subprocess.run([sys.executable, "-m", "profkit", "classify", path, "--format", "json"],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"trim_setup: profkit cannot judge {path}: "
                 + (done.stderr.strip().splitlines() or ["no output"])[-1])
    d = json.loads(done.stdout)
    d.pop("trace", None)
    if isinstance(d.get("meta"), dict):
        for k in ("trace", "path"):
            d["meta"].pop(k, None)
    for k in ("excluded", "source"):
        d["run"]["window"].pop(k, None)
    return d


def differences(a, b, where: str = "") -> list[str]:
    """The paths at which two JSON values differ (the first few)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {str(a)[:80]} -> {str(b)[:80]}"]


def checked(path: str, name: str, keep_ns: float) -> bool:
    """The cut made on a copy and kept only where the judgement is unchanged (see --check)."""
    before = judgement(path)
    fd, tmp = tempfile.mkstemp(suffix=".sqlite", dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        shutil.copyfile(path, tmp)
        main(tmp, name, keep_ns)
        diff = differences(before, judgement(tmp))
        if diff:
            print(f"trim_setup: {path} left as it was: the cut changes its judgement at "
                  + "; ".join(diff[:5]))
            return False
        os.replace(tmp, path)
        print(f"trim_setup: {path} cut; its judgement is unchanged")
        return True
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--check"]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    if not os.path.isfile(args[0]):
        sys.exit(f"trim_setup: {args[0]}: no such file")
    with open(args[0], "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            sys.exit(f"trim_setup: {args[0]}: not an SQLite file (give the exported .sqlite, "
                     "decompressed: xz -dk TRACE.sqlite.xz)")
    keep = float(args[2]) * 1e6 if len(args) == 3 else KEEP_NS
    if "--check" in sys.argv[1:]:
        sys.exit(0 if checked(args[0], args[1], keep) else 1)
    main(args[0], args[1], keep)
