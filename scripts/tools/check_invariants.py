#!/usr/bin/env python3
"""Rows that break profkit's invariants, for any traces (the test covers the committed ones).

    python scripts/tools/check_invariants.py [TRACE.sqlite ...] [--peaks PEAKS.json]

Every level (range, range innermost, kernel, aten where the trace has it): evidence above 100%
of its roof, an end-to-end speedup above the op's own, shares of a non-overlapping level above
100%. Exit status 1 when any is found. Default traces: every export under traces/ (plain or compressed).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import profkit  # noqa: E402
from profkit.read.compressed import find_traces  # noqa: E402
from profkit.errors import ProfkitError  # noqa: E402

PCT_KEYS = ("pct_of_roof", "pct_of_memory_roof", "pct_of_compute_roof")


def violations(path: Path, peaks=None) -> list[str]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profkit.load(path, peaks=peaks)
        for by, inner in (("range", False), ("range", True), ("kernel", False), ("aten", False)):
            try:
                df = prof.ops(by=by, innermost=inner)
            except ProfkitError:
                continue
            level = by + ("/innermost" if inner else "")
            for name, row in df.iterrows():
                ev = row["evidence"]
                for k in PCT_KEYS:
                    v = row["pct_of_roof"] if k == "pct_of_roof" else ev.get(k)
                    if v is not None and v == v and v > 1.0:
                        out.append(f"{level}: {name[:80]}: {k} {v:.0%} [{row['source']}]")
                if row["expected_end_to_end_speedup"] > row["expected_op_speedup"] + 1e-9:
                    out.append(f"{level}: {name[:80]}: end-to-end speedup above the op's")
            if (by != "range" or inner) and df["share"].sum() > 1.0 + 1e-9:
                out.append(f"{level}: shares sum to {df['share'].sum():.1%}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--peaks", default=None)
    args = ap.parse_args(argv)
    traces = args.traces or find_traces(ROOT / "traces", recursive=True)
    bad = 0
    for t in traces:
        v = violations(t, args.peaks)
        bad += len(v)
        print(f"{t}: {len(v)} violation(s)")
        for line in v:
            print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
