"""Shrink a capture made with GPU-metrics sampling to a size that can live in a repository.

Sampling covers the whole capture, Python start-up included (10 kHz x 22 metrics = 220k rows
a second). Rows more than MARGIN before the first or after the last GPU activity describe an
idle GPU and are deleted; the file is then vacuumed. Only for traces this project captured
itself: never run it on a trace someone else owns.

    python scripts/tools/trim_gpu_metrics.py TRACE.sqlite
"""
from __future__ import annotations

import sqlite3
import sys

MARGIN_NS = 1_000_000


def main(path: str) -> None:
    con = sqlite3.connect(path)
    lo, hi = con.execute("SELECT min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    before = con.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0]
    con.execute("DELETE FROM GPU_METRICS WHERE timestamp < ? OR timestamp > ?",
                (lo - MARGIN_NS, hi + MARGIN_NS))
    con.commit()
    after = con.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0]
    con.execute("VACUUM")
    con.close()
    print(f"{path}: GPU_METRICS {before} -> {after} rows")


if __name__ == "__main__":
    main(sys.argv[1])
