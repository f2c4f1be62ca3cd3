"""nsys GPU-metrics samples (``profkit capture --gpu-metrics``), read and pivoted per device.

The export holds ``TARGET_INFO_GPU_METRICS`` (metric names per GPU type) and ``GPU_METRICS``
(``timestamp, typeId, metricId, value``). Metrics are looked up by name: metric ids differ
between GPU types and nsys versions. A sample at ``t`` describes ``[t, t + 1/f)``.

Cost: one row per metric per sample. A 10 s ResNet-50 capture at 20 kHz gave 4.3 M rows and a
143 MB SQLite on an H200; the default 10 kHz halves that (about 0.2 M rows and 7 MB per second
of capture), and resolves ops of 0.1 ms and longer.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

DEFAULT_FREQUENCY_HZ = 10_000

# metric -> name pattern (nsys writes e.g. "DRAM Read Bandwidth [Throughput %]")
METRIC_PATTERNS = {
    "dram_read": re.compile(r"^DRAM Read Bandwidth", re.I),
    "dram_write": re.compile(r"^DRAM Write Bandwidth", re.I),
    "tensor": re.compile(r"^Tensor (?:Active|Pipe)", re.I),
    "sm_issue": re.compile(r"^SM Issue", re.I),
    "sm_active": re.compile(r"^SMs? Active", re.I),
}


@dataclass
class GpuMetrics:
    """Samples pivoted to one row per (device, timestamp): percent columns of METRIC_PATTERNS."""
    samples: pd.DataFrame
    period_ns: float
    names: dict[str, str]   # our key -> nsys metric name found

    def device(self, device_id: int) -> pd.DataFrame:
        s = self.samples
        return s[s["deviceId"] == device_id] if s["deviceId"].nunique() > 1 else s


def _has(conn: sqlite3.Connection, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                        (table,)).fetchone() is not None


def read_gpu_metrics(path: str | Path) -> Optional[GpuMetrics]:
    """The export's GPU-metrics samples, or None when it has none."""
    from profkit.read.nsys import open_readonly  # read-only, no lock; crashed writers recovered
    conn = open_readonly(path)
    try:
        if not (_has(conn, "GPU_METRICS") and _has(conn, "TARGET_INFO_GPU_METRICS")):
            return None
        info = pd.read_sql_query("SELECT DISTINCT typeId, metricId, metricName "
                                 "FROM TARGET_INFO_GPU_METRICS", conn)
        wanted: dict[tuple[int, int], str] = {}
        names: dict[str, str] = {}
        for r in info.itertuples(index=False):
            for key, pat in METRIC_PATTERNS.items():
                if pat.search(str(r.metricName)):
                    wanted[(int(r.typeId), int(r.metricId))] = key
                    names.setdefault(key, str(r.metricName))
                    break
        if not wanted:
            return None
        ids = sorted({m for _, m in wanted})
        raw = pd.read_sql_query(
            f"SELECT timestamp, typeId, metricId, value FROM GPU_METRICS "
            f"WHERE metricId IN ({','.join('?' * len(ids))})", conn, params=ids)
    finally:
        conn.close()
    if raw.empty:
        return None
    raw["key"] = [wanted.get((int(t), int(m))) for t, m in zip(raw["typeId"], raw["metricId"])]
    raw = raw[raw["key"].notna() & (raw["timestamp"] >= 0)]
    raw["deviceId"] = raw["typeId"].astype("int64") & 0xFF  # the low byte of typeId is the GPU
    wide = raw.pivot_table(index=["deviceId", "timestamp"], columns="key", values="value",
                           aggfunc="mean").reset_index().sort_values(["deviceId", "timestamp"])
    steps = wide.groupby("deviceId")["timestamp"].diff().dropna()
    period = float(steps[steps > 0].median()) if (steps > 0).any() else 1e9 / DEFAULT_FREQUENCY_HZ
    return GpuMetrics(wide.reset_index(drop=True), period, names)


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[:1] = True
    new[1:] = s[1:] > reach[:-1]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new)) if len(s) else e


def overlap_weights(ts: np.ndarray, period: float, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per sample (sorted ``ts``, each covering ``[t, t + period)``): ns of overlap with the union
    of the intervals ``[start, end)``."""
    w = np.zeros(len(ts))
    if len(ts) == 0 or len(start) == 0:
        return w
    us, ue = _union(start.astype(float), end.astype(float))
    lo = np.searchsorted(ts, us - period, side="right")
    hi = np.searchsorted(ts, ue, side="left")
    counts = np.clip(hi - lo, 0, None)
    if counts.sum() == 0:
        return w
    owner = np.repeat(np.arange(len(us)), counts)
    idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi) if b > a])
    ov = np.minimum(ts[idx] + period, ue[owner]) - np.maximum(ts[idx], us[owner])
    np.add.at(w, idx, np.clip(ov, 0, None))
    return w
