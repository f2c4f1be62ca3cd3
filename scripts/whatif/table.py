"""``table``: a ``measure`` or ``interleave`` output (OUTDIR/measured.json) as a table.

``table`` prints, per program and variant, the median iteration time over the reps, the
speedup over the baseline (baseline median / variant median), the spread (slowest / fastest
rep) and whether the fix was expected to pay; then the runs skipped for lack of budget and the
failures, each with the last lines of its stderr.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def table_rows(measured: dict) -> list[dict]:
    rows = []
    for pname, prog in measured.get("programs", {}).items():
        vs = prog.get("variants", {})
        base = vs.get("baseline", {}).get("median_ns") or []
        base_med = statistics.median(base) if base else None
        for vname, v in vs.items():
            meds = v.get("median_ns") or []
            med = statistics.median(meds) if meds else None
            rows.append({
                "program": pname, "variant": vname,
                "ms": med / 1e6 if med else None,
                "speedup": base_med / med if (med and base_med) else None,
                "spread": max(meds) / min(meds) if meds else None,
                "reps": len(meds), "failed": len(v.get("failures") or []),
                "pays": v.get("pays"), "baseline": vname == "baseline",
            })
    return rows


def cmd_table(args: argparse.Namespace) -> None:
    measured = json.loads(Path(args.measured).read_text())
    rows = table_rows(measured)
    head = ("program", "variant", "step ms", "speedup", "spread", "reps", "expected")
    fmt = "{:<24} {:<26} {:>9} {:>8} {:>7} {:>6}  {}"
    print(fmt.format(*head))
    print(fmt.format(*("-" * len(h) for h in head)))
    exp = {True: "pays", False: "no gain", None: "?"}
    for r in rows:
        print(fmt.format(
            r["program"], r["variant"],
            f"{r['ms']:.3f}" if r["ms"] is not None else "-",
            f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-",
            f"{r['spread']:.3f}" if r["spread"] is not None else "-",
            f"{r['reps']}" + (f"+{r['failed']}F" if r["failed"] else ""),
            "" if r["baseline"] else exp.get(r["pays"], "?")))
    if measured.get("skipped"):
        print(f"\n{len(measured['skipped'])} run(s) skipped for lack of budget")
    for pname, prog in measured.get("programs", {}).items():
        for vname, v in prog.get("variants", {}).items():
            for f in v.get("failures") or []:
                print(f"\nFAILED {pname} {vname} rep {f['rep']}: {f['reason']}")
                tail = (f.get("stderr_tail") or "").splitlines()[-3:]
                for line in tail:
                    print(f"    {line}")
