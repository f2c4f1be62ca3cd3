"""Work counts (FLOPs, bytes, precision) per op call, from the best source the trace offers.

Order, best first: ncu counters merged into the trace, aten op shapes, FLOP/byte hints in the
range name, the exact bytes of memcpy/memset, and — when none applies — nothing: the classifier
then reads the timeline alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

from profkit.hints import Hint
from profkit.model import Source

_PRECISION_PATTERNS = [
    ("fp8", re.compile(r"e4m3|e5m2|fp8|Float8", re.I)),
    ("bf16", re.compile(r"bf16|BFloat16|bfloat16", re.I)),
    ("fp16", re.compile(r"\bHalf\b|fp16|f16f16|__half|c10::Half", re.I)),
    ("tf32", re.compile(r"tf32", re.I)),
    ("fp64", re.compile(r"\bdouble\b|dgemm|f64", re.I)),
    ("fp32", re.compile(r"\bfloat\b|sgemm|f32f32|_fp32", re.I)),
]
ELEM_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp64": 8}


@dataclass
class Work:
    """What one call of an op does, and where that number came from."""
    source: Source
    flops: Optional[float] = None      # per call
    bytes: Optional[float] = None      # per call
    precision: Optional[str] = None
    detail: str = ""
    dram_pct: Optional[float] = None   # ncu only: time-weighted DRAM throughput, % of peak
    sm_pct: Optional[float] = None     # ncu only: time-weighted SM throughput, % of peak
    time_ns: Optional[float] = None    # per call, the GPU time the counts were measured over
    host_link: bool = False            # bytes cross PCIe/C2C, not HBM: the HBM roof does not apply


def precision_of(names: list[str]) -> Optional[str]:
    """The precision the kernel names point to (majority vote), or None."""
    votes: dict[str, int] = {}
    for n in names:
        for prec, pat in _PRECISION_PATTERNS:
            if pat.search(n):
                votes[prec] = votes.get(prec, 0) + 1
                break
    return max(votes, key=votes.__getitem__) if votes else None


def from_ncu(member_acts: pd.DataFrame, ncu: pd.DataFrame, calls: int) -> Optional[Work]:
    """Counters of the op's kernels that the ncu pass profiled (matched by device and start)."""
    if ncu.empty or member_acts.empty:
        return None
    m = member_acts.merge(ncu, left_on=["globalPid", "deviceId", "start"],
                          right_on=["globalPid", "deviceId", "kernel_start"], how="inner")
    if m.empty:
        return None
    flops = m[["flops_fp64", "flops_fp32", "flops_fp16", "flops_tensor"]].fillna(0).sum()
    dram = (m["dram_bytes_read"].fillna(0) + m["dram_bytes_write"].fillna(0)).sum()
    dur = (m["end"] - m["start"]).astype(float)
    covered = float(dur.sum())
    if covered <= 0:
        return None
    # Scale to one call: the profiled kernels are a sample of the op's kernels.
    total_dur = float((member_acts["end"] - member_acts["start"]).sum())
    scale = total_dur / covered / max(calls, 1)
    if flops["flops_tensor"] > 0:
        prec = m["tensor_precision"].dropna()
        precision = prec.mode().iat[0] if len(prec) else None
    else:
        precision = max(("fp64", "fp32", "fp16"),
                        key=lambda p: flops[f"flops_{p}"]) if flops.sum() > 0 else None
    w = lambda col: float(np.average(m[col].fillna(0), weights=dur)) if m[col].notna().any() else None
    return Work(Source.NCU, flops=float(flops.sum()) * scale, bytes=float(dram) * scale,
                precision=precision, dram_pct=w("dram_throughput_pct"), sm_pct=w("sm_throughput_pct"),
                time_ns=total_dur / max(calls, 1),
                detail=f"{len(m)} of {len(member_acts)} kernels profiled by ncu")


def from_hint(hint: Optional[Hint], default_precision: Optional[str]) -> Optional[Work]:
    if hint is None or (hint.flops is None and hint.bytes is None):
        return None
    return Work(Source.HINTS, flops=hint.flops, bytes=hint.bytes,
                precision=hint.precision or default_precision, detail="hint in the NVTX range name")


def from_copies(member_acts: pd.DataFrame, calls: int) -> Optional[Work]:
    """memcpy/memset ops: their bytes are in the trace. A device-to-device copy reads and writes."""
    if member_acts.empty or not member_acts["kind"].isin(["memcpy", "memset"]).all():
        return None
    factor = np.where(member_acts["name"].str.contains("Device-to-Device"), 2.0, 1.0)
    b = float((member_acts["bytes"].astype(float).fillna(0) * factor).sum())
    host = bool(member_acts["name"].str.contains("Host").any())
    return Work(Source.COPY, flops=0.0, bytes=b / max(calls, 1), precision=None, host_link=host,
                detail="bytes of the copies" + (" over the host link" if host else ""))


def from_shapes(op_key: str, elem_bytes: int, precision: Optional[str]) -> Optional[Work]:
    """FLOPs and bytes from an aten op's input sizes (`aten::mm [[m, k], [k, n]]`)."""
    try:
        from profkit import flops as flop_model
    except ImportError:  # pragma: no cover - the model ships with profkit
        return None
    call = flop_model.parse_aten_range(op_key.replace(" [", ", sizes = [", 1))
    if call is None:
        return None
    cost = flop_model.estimate(call.op, call.sizes, elem_bytes=elem_bytes)
    if cost is None:
        return None
    return Work(Source.SHAPES, flops=float(cost.flops), bytes=float(cost.bytes),
                precision=precision, detail=f"{cost.kind}: {cost.formula}")
