"""Hardware-counter evidence merged from an Nsight Compute pass.

``profkit capture --ncu`` writes one row per profiled kernel into ``PROFKIT_NCU_METRICS`` inside
the trace's SQLite (profkit's own table; nsys's tables are never altered). Each row names the
nsys kernel it was matched to by ``(globalPid, deviceId, kernel_start)``, the kernel's start
timestamp in the nsys timeline, which is unique per device.

Units: ns for times, FLOP (not FLOP/s) for counts, bytes for traffic, percent (0-100) for
throughputs. A NULL means the counter was not collected.
"""
from __future__ import annotations

import sqlite3

import pandas as pd

NCU_TABLE = "PROFKIT_NCU_METRICS"

# The table shape is the contract between `capture --ncu` (writer) and `classify` (reader).
NCU_COLUMNS: dict[str, str] = {
    "globalPid": "INTEGER",            # nsys process of the matched kernel
    "deviceId": "INTEGER",             # nsys device of the matched kernel
    "kernel_start": "INTEGER",         # start (ns) of the matched nsys kernel row
    "kernel_name": "TEXT",             # demangled name as ncu reports it
    "nvtx_range": "TEXT",              # innermost NVTX range ncu saw around the launch, if any
    "launch_index": "INTEGER",         # order of this kernel among ncu's profiled kernels
    "gpu_time_ns": "REAL",             # gpu__time_duration.sum under ncu (serialised, clocks free)
    "flops_fp64": "REAL",
    "flops_fp32": "REAL",
    "flops_fp16": "REAL",              # non-tensor half-precision FLOPs
    "flops_tensor": "REAL",            # tensor-core FLOPs (all precisions)
    "tensor_precision": "TEXT",        # bf16 | fp16 | tf32 | fp8 | fp64 when known
    "dram_bytes_read": "REAL",
    "dram_bytes_write": "REAL",
    "sm_throughput_pct": "REAL",       # sm__throughput.avg.pct_of_peak_sustained_elapsed
    "dram_throughput_pct": "REAL",     # gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed
    "achieved_occupancy_pct": "REAL",  # sm__warps_active.avg.pct_of_peak_sustained_active
    "l2_bytes": "REAL",                # lts__t_bytes.sum: L2-side traffic (hits and misses)
    "l2_read_bytes": "REAL",           # sectors the SMs read from L2, x 32
    "l2_write_bytes": "REAL",          # sectors the SMs wrote into L2, x 32 (every store)
    "grid": "TEXT",                    # "x,y,z" as ncu reports it, checked against nsys
    "block": "TEXT",                   # "x,y,z"
}


def create_table_sql() -> str:
    cols = ",\n    ".join(f"{name} {kind}" for name, kind in NCU_COLUMNS.items())
    return f"CREATE TABLE IF NOT EXISTS {NCU_TABLE} (\n    {cols}\n)"


def read_ncu_metrics(conn: sqlite3.Connection) -> pd.DataFrame:
    """The merged counters, or an empty frame with the contract's columns when there are none."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (NCU_TABLE,)
    ).fetchone()
    if not exists:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in NCU_COLUMNS})
    have = {row[1] for row in conn.execute(f"PRAGMA table_info({NCU_TABLE})")}
    cols = ", ".join(c if c in have else f"NULL AS {c}" for c in NCU_COLUMNS)
    df = pd.read_sql_query(f"SELECT {cols} FROM {NCU_TABLE}", conn)
    # A damaged or hand-edited row must not reach the arithmetic as text: a row whose key is
    # not an integer cannot be matched to a kernel and is dropped; other non-numbers -> NaN.
    keys = ["globalPid", "deviceId", "kernel_start"]
    ok = df[keys].apply(lambda col: col.map(lambda v: isinstance(v, int))).all(axis=1)
    df = df[ok].reset_index(drop=True)
    for c, kind in NCU_COLUMNS.items():
        if c in keys:
            df[c] = df[c].astype("int64")
        elif kind == "TEXT":
            df[c] = df[c].map(lambda v: v if v is None or isinstance(v, str) else str(v))
        else:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df
