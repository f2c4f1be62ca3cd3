"""Check a `profkit capture --aten` trace: aten ranges per thread, records, backward coverage.

    python scripts/tools/check_recorder_trace.py TRACE.sqlite

The main thread is the one that opened the `train_step` ranges; the autograd engine's device
thread(s) run backward, so a recorder trace must have aten ranges (aten::mm among them) there.
Exit status 1 when it has none. Needs no torch.
"""
from __future__ import annotations

import collections
import sqlite3
import sys


def main(path: str) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cols = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
    text = ("COALESCE(e.text, s.value)" if "textId" in cols else "e.text")
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in cols else ""
    rows = con.execute(f"SELECT e.globalTid, {text} FROM NVTX_EVENTS e {join} "
                       "WHERE e.eventType IN (59, 70)").fetchall()
    steps = collections.Counter(t for t, n in rows if n == "train_step")
    main_tid = steps.most_common(1)[0][0] if steps else None
    per = collections.defaultdict(collections.Counter)
    recorded = 0
    for tid, name in rows:
        if name and name.startswith("aten::"):
            per[tid][name.split(",", 1)[0]] += 1
            recorded += ", pk = " in name
    total = sum(sum(c.values()) for c in per.values())
    other = {tid: c for tid, c in per.items() if tid != main_tid}
    n_other = sum(sum(c.values()) for c in other.values())
    mm_other = sum(c.get("aten::mm", 0) for c in other.values())
    print(f"{total} aten ranges, {recorded} with a profkit record; main thread {main_tid}: "
          f"{sum(per.get(main_tid, {}).values())}; other threads ({len(other)}): {n_other}, "
          f"aten::mm there: {mm_other}")
    for tid, c in other.items():
        print(f"  thread {tid}: {c.most_common(8)}")
    return 0 if mm_other > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else 2)
