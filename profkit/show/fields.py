"""The JSON report's fields (docs/classify.md): an op's row, the GPU and its peaks, a suggestion;
numbers as JSON holds them (integers where whole, null for NaN)."""
from __future__ import annotations

import pandas as pd

from profkit.judge.advisor import Suggestion
from profkit.read.peaks import Peaks


def suggestion_fields(sug: Suggestion) -> dict:
    return {"rung": sug.rung.value, "action": sug.action,
            "expected_op_speedup": sug.expected_op_speedup,
            "expected_end_to_end_speedup": sug.expected_end_to_end_speedup,
            "expected_gpu_time_speedup": sug.expected_gpu_time_speedup,
            "basis": sug.basis, "worth_it": sug.worth_it}


def gpu_json(name: str, peaks: Peaks) -> dict:
    return {"name": name, "peaks": {"memory_bandwidth_bytes_per_s": peaks.memory_bandwidth,
                                    "flops_per_s": dict(peaks.flops),
                                    "launch_floor_ns": peaks.launch_floor_ns,
                                    "source": peaks.source}}


def num(x):
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
        "gpu_time_ns": num(row["gpu_time_ns"]), "gpu_time_median_ns": num(row["gpu_time_median_ns"]),
        "gpu_busy_ns": num(row["busy_ns"]), "gpu_busy_median_ns": num(row["busy_median_ns"]),
        "first_call_ns": num(row["first_call_ns"]),
        "share": num(row["share"]), "cpu_time_ns": num(row["cpu_time_ns"]),
        "kernels_per_call": num(row["kernels_per_call"]),
        "class": row["class"], "confidence": row["confidence"],
        "evidence": {"source": row["source"], "reason": row["reason"],
                     **{k: num(v) for k, v in row["evidence"].items() if k != "source"}},
        "suggestion": {"rung": row["rung"], "action": row["action"],
                       "expected_op_speedup": round(float(row["expected_op_speedup"]), 3),
                       "expected_end_to_end_speedup": round(float(row["expected_end_to_end_speedup"]), 4),
                       "expected_gpu_time_speedup": round(float(row["expected_gpu_time_speedup"]), 4),
                       "basis": row["basis"], "worth_it": bool(row["worth_it"])},
    }
