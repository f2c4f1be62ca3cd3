"""The user-facing facade: load a trace, get ops with their verdicts as a DataFrame or a report.

    >>> import profkit
    >>> prof = profkit.load("traces/micro_addnorm.sqlite")
    >>> prof.ops(by="range")[["count", "gpu_time_ns", "class", "rung"]]
    >>> prof.report(by="kernel")      # the JSON contract, as a dict
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from profkit import evidence as ev
from profkit import patterns
from profkit.advisor import Suggestion, advise, advise_pair
from profkit.attribution import aten_key
from profkit.classify import classify_op
from profkit.ops import group_ops
from profkit.peaks import Peaks, resolve_peaks
from profkit.trace import Trace

SCHEMA_VERSION = 1
# Above this fraction of the roofline a measured op would beat the hardware: the work counts
# behind it are wrong (timers and peaks are good to a few percent; 1.5x is far outside that).
IMPOSSIBLE_PCT_OF_ROOF = 1.5


class Profile:
    """One trace, its GPU's roofline ceilings, and the analyses over it."""

    def __init__(self, path: str | Path, peaks_file: Optional[str | Path] = None) -> None:
        self.trace = Trace(path)
        self.gpu = self.trace.primary_gpu()
        self.peaks, self.warnings = resolve_peaks(self.gpu, peaks_file)
        names = self.trace.activities["name"].drop_duplicates().tolist()
        self.default_precision = ev.precision_of(names)

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    @property
    def path(self) -> str:
        return self.trace.path

    def ops(self, by: str = "range", innermost: bool = False, top: Optional[int] = None) -> pd.DataFrame:
        """One row per op, sorted by GPU time: times, share, bound class, evidence and next step.

        ``by``: ``range`` (NVTX range name), ``kernel`` (kernel name) or ``aten`` (aten op and
        input sizes, from emit_nvtx). ``innermost``: with ``by="range"``, count each GPU activity
        only for the innermost range around its launch.
        """
        groups = group_ops(self.trace, by=by, innermost=innermost)
        n_open = self.trace.unclosed_ranges if by != "kernel" else 0
        note = (f"{n_open} NVTX range(s) never closed (the program ended or crashed inside them): "
                "they end at the end of the capture")
        if n_open:
            self._warn(note)
        acts = self.trace.activities
        members_by_op = {op: groups.members["act_idx"].to_numpy()[ix]
                         for op, ix in groups.members.groupby("op", sort=False).indices.items()}
        total = self.trace.total_gpu_time_ns
        rows, works = [], {}
        ops = groups.ops if top is None else groups.ops.head(top)
        for name, op in ops.iterrows():
            rec = {"name": name, **op.to_dict()}
            member_acts = acts.take(members_by_op.get(name, np.empty(0, dtype=np.int64)))
            knames = member_acts["name"].drop_duplicates().tolist()
            rec["distinct_kernels"] = len(knames)
            precision = ev.precision_of(knames) or self.default_precision
            calls = int(op["count"])
            work = ev.from_ncu(member_acts, self.trace.ncu, calls)
            if work is None and by == "aten":
                work = ev.from_shapes(str(name), ev.ELEM_BYTES.get(precision or "", 2), precision)
            if work is None:
                work = ev.from_hint(groups.hints.get(name), precision)
            if work is None:
                work = ev.from_copies(member_acts, calls)
            verdict = classify_op(rec, work, self.peaks, knames[:20])
            if (work is not None and work.source is ev.Source.HINTS and verdict.pct_of_roof
                    and verdict.pct_of_roof > IMPOSSIBLE_PCT_OF_ROOF):
                # Faster than the roofline allows: the hint (or the peaks) is wrong, so the
                # verdict cannot be trusted, whatever the source's usual confidence.
                verdict.confidence = "low"
                self._warn(f"op {name}: its FLOP/byte hint means {verdict.pct_of_roof:.1f}x the "
                           f"roofline of {self.peaks.gpu}, which cannot be: check the hint in the "
                           "range name (or --peaks)")
            under_graph = bool(member_acts["graphNodeId"].notna().any()) if len(member_acts) else False
            sug = advise(rec, verdict, work, self.peaks, knames[:20], under_graph, total)
            rec.update({
                "class": verdict.bound.value, "confidence": verdict.confidence,
                "source": verdict.source.value, "reason": verdict.reason,
                "pct_of_roof": verdict.pct_of_roof, "evidence": verdict.evidence,
                "precision": precision, **_suggestion_fields(sug),
            })
            rows.append(rec)
            works[name] = work
        if by == "aten":
            self._apply_pairs(rows, works, total)
        df = pd.DataFrame(rows).set_index("name")
        return df

    def _apply_pairs(self, rows: list[dict], works: dict, total: float) -> None:
        """Producer -> consumer pairs that a bundled kernel fuses get one joint suggestion."""
        by_name = {r["name"]: r for r in rows}
        names = self.trace.ranges_of_level("aten")["name"]
        for pair in patterns.fusable_pairs(names, aten_key):
            prod, cons = by_name.get(pair.producer), by_name.get(pair.consumer)
            if prod is None or cons is None or cons["class"] == "compute" \
                    or prod.get("_paired") or cons.get("_paired"):
                continue
            sp, sc = advise_pair(prod, cons, pair.kernel, pair.count, works.get(pair.producer),
                                 works.get(pair.consumer), self.peaks, total)
            prod.update(_suggestion_fields(sp), _paired=True)
            cons.update(_suggestion_fields(sc), _paired=True)
        for r in rows:
            r.pop("_paired", None)

    def report(self, by: str = "range", innermost: bool = False, top: Optional[int] = None,
               ops: Optional[pd.DataFrame] = None) -> dict:
        """The stable JSON contract (see README): trace, gpu, total GPU time and one entry per op.

        ``ops``: the result of ``self.ops(by, innermost, top)`` if already computed.
        """
        df = self.ops(by=by, innermost=innermost, top=top) if ops is None else ops
        return {
            "schema_version": SCHEMA_VERSION,
            "trace": self.path,
            "nsys_version": self.trace.info.nsys_version,
            "level": by,
            "gpu": gpu_json(self.gpu.name, self.peaks),
            "total_gpu_time_ns": self.trace.total_gpu_time_ns,
            "gpu_busy_ns": self.trace.gpu_busy_ns,
            "warnings": list(self.warnings),
            "ops": [op_json(name, row, by) for name, row in df.iterrows()],
        }


def _suggestion_fields(sug: Suggestion) -> dict:
    return {"rung": sug.rung.value, "action": sug.action,
            "expected_op_speedup": sug.expected_op_speedup,
            "expected_end_to_end_speedup": sug.expected_end_to_end_speedup,
            "basis": sug.basis, "worth_it": sug.worth_it}


def gpu_json(name: str, peaks: Peaks) -> dict:
    return {"name": name, "peaks": {"memory_bandwidth_bytes_per_s": peaks.memory_bandwidth,
                                    "flops_per_s": dict(peaks.flops),
                                    "launch_floor_ns": peaks.launch_floor_ns,
                                    "source": peaks.source}}


def _num(x):
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return x
    if f != f:  # NaN
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def op_json(name: str, row: pd.Series, level: str) -> dict:
    return {
        "name": name, "level": level, "count": int(row["count"]),
        "gpu_time_ns": _num(row["gpu_time_ns"]), "gpu_time_median_ns": _num(row["gpu_time_median_ns"]),
        "gpu_busy_ns": _num(row["busy_ns"]), "first_call_ns": _num(row["first_call_ns"]),
        "share": _num(row["share"]), "cpu_time_ns": _num(row["cpu_time_ns"]),
        "kernels_per_call": _num(row["kernels_per_call"]),
        "class": row["class"], "confidence": row["confidence"],
        "evidence": {"source": row["source"], "reason": row["reason"],
                     **{k: _num(v) for k, v in row["evidence"].items() if k != "source"}},
        "suggestion": {"rung": row["rung"], "action": row["action"],
                       "expected_op_speedup": round(float(row["expected_op_speedup"]), 3),
                       "expected_end_to_end_speedup": round(float(row["expected_end_to_end_speedup"]), 4),
                       "basis": row["basis"], "worth_it": bool(row["worth_it"])},
    }


def load(path: str | Path, peaks: Optional[str | Path] = None) -> Profile:
    """Open an Nsight Systems SQLite export for analysis (read-only; no torch or GPU needed)."""
    return Profile(path, peaks_file=peaks)
