"""nsys GPU-metrics samples as evidence: measured DRAM, tensor and SM activity per op, no replay.

Each op gets the samples (profkit.read.gpu_metrics) that overlap its kernels' GPU intervals,
weighted by the overlap, so a sample half inside an op counts half. The samples are device-wide:
work of other streams that runs at the same time is mixed in, which the evidence says. An op
whose kernels fill less than MIN_PURITY of the samples they touch (kernels much shorter than the
sample period) gets no reading: the numbers would be its neighbours'.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from profkit.judge.evidence import Work
from profkit.model import Source
from profkit.read.gpu_metrics import GpuMetrics, overlap_weights

# Below this many sample-periods of overlap an op's reading is mostly noise from its neighbours.
MIN_SAMPLE_PERIODS = 2.0
# Share of the touched samples' time that must belong to the op: a 10 us kernel inside a 100 us
# sample reads its neighbours' activity, not its own.
MIN_PURITY = 0.5


def from_gpu_metrics(member_acts: pd.DataFrame, gm: Optional[GpuMetrics], calls: int,
                     memory_bandwidth: float):
    """Work with measured DRAM% (read + write: they share one peak), tensor% and SM% for the op,
    from the samples overlapping its kernels; None without enough overlap."""
    if gm is None or member_acts.empty:
        return None
    k = member_acts[member_acts["kind"] == "kernel"]
    if k.empty:
        return None
    dev = int(k["deviceId"].mode().iat[0])
    s = gm.device(dev)
    ts = s["timestamp"].to_numpy(dtype=float)
    w = overlap_weights(ts, gm.period_ns, k["start"].to_numpy(), k["end"].to_numpy())
    total = float(w.sum())
    if total < MIN_SAMPLE_PERIODS * gm.period_ns:
        return None
    purity = total / (float((w > 0).sum()) * gm.period_ns)
    if purity < MIN_PURITY:
        return None

    def mean(col: str) -> Optional[float]:
        if col not in s:
            return None
        v = s[col].to_numpy(dtype=float)
        ok = ~np.isnan(v) & (w > 0)
        return float(np.average(v[ok], weights=w[ok])) if ok.any() else None

    rd, wr = mean("dram_read"), mean("dram_write")
    dram = None if rd is None and wr is None else min((rd or 0.0) + (wr or 0.0), 100.0)
    tensor = mean("tensor")
    issue, active = mean("sm_issue"), mean("sm_active")
    sm = issue if issue is not None else active
    busy = float((k["end"] - k["start"]).sum()) / max(calls, 1)
    work = Work(Source.GPU_METRICS, flops=None,
                bytes=(dram / 100.0 * memory_bandwidth * busy / 1e9) if dram is not None else None,
                precision=None, dram_pct=dram, sm_pct=sm, tensor_pct=tensor, bytes_basis="dram",
                detail=(f"nsys GPU metrics: {total / gm.period_ns:.0f} sample periods at "
                        f"{1e9 / gm.period_ns:.0f} Hz over the op's kernels (device-wide: "
                        "concurrent work is mixed in); bytes = DRAM% x the bandwidth roof x busy time"))
    work.notes["gpu_metrics_purity"] = purity
    if active is not None:
        work.notes["gpu_metrics_sms_active_pct"] = active
    return work
