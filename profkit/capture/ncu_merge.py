"""Read an Nsight Compute raw-page CSV and merge its per-kernel counters into an nsys SQLite trace.

The CSV comes from ``ncu --import REPORT.ncu-rep --csv --page raw --print-units base
--print-kernel-base demangled``: a header row of column/metric names, a row of units, then one
row per profiled kernel. Numbers may carry thousands separators ("1,048,576"); counters ncu could
not collect read "n/a" (or are absent) and become NULL.

Rows go to ``PROFKIT_NCU_METRICS`` (columns: :data:`profkit.read.ncu.NCU_COLUMNS`). nsys's own tables
are never altered. Each ncu kernel is matched to an nsys kernel row by name, grid and block (where
both sides give them) and launch order: the k-th launch of kernel N in ncu is the k-th launch of
N in nsys (per process and device, and only among kernels launched inside the NVTX range or time
window when one was given). Pairs whose geometry differs or that break launch order are named,
and the merge is refused unless the caller allows leaving them out (:func:`merge_ncu`).
"""
from __future__ import annotations

import functools
import io
import math
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from profkit.errors import ProfkitError, TraceError
from profkit.read.hints import parse_range_name
from profkit.read.ncu import NCU_COLUMNS, NCU_TABLE, create_table_sql

# --- what the ncu pass collects ------------------------------------------------------------
NCU_SECTIONS = ["SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis",
                "LaunchStats", "Occupancy"]

# Non-tensor FLOPs: (metric, FLOPs per thread instruction). Half-precision instructions are
# counted as packed (HADD2/HMUL2/HFMA2), the convention of ncu's own half-precision roofline.
# A kernel with HADD but no HFMA/HMUL is converting 16-bit data to fp32 (HADD2.F32 with -RZ is
# the compiler's bf16/fp16 -> fp32 move), not doing half-precision math: its HADDs are not FLOPs.
FP64_METRICS = {"sm__sass_thread_inst_executed_op_dadd_pred_on.sum": 1,
                "sm__sass_thread_inst_executed_op_dmul_pred_on.sum": 1,
                "sm__sass_thread_inst_executed_op_dfma_pred_on.sum": 2}
FP32_METRICS = {"sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 1,
                "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": 1,
                "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": 2}
FP16_METRICS = {"sm__sass_thread_inst_executed_op_hadd_pred_on.sum": 2,
                "sm__sass_thread_inst_executed_op_hmul_pred_on.sum": 2,
                "sm__sass_thread_inst_executed_op_hfma_pred_on.sum": 4}
# Tensor-core math ops (1 op = 1 FLOP; an m16n8k16 MMA counts 2*16*8*16) -> precision.
# Names as `ncu --query-metrics` lists them on Ampere/Ada/Hopper (fp8: Ada/Hopper) and
# Blackwell (fp8_dst_*); the ones a GPU lacks are dropped before the run.
TENSOR_METRICS = {
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "bf16",
    "sm__ops_path_tensor_src_fp16.sum": "fp16",         # Hopper: fp16 with any accumulator
    "sm__ops_path_tensor_src_fp16_dst_fp16.sum": "fp16",
    "sm__ops_path_tensor_src_fp16_dst_fp32.sum": "fp16",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum": "tf32",
    "sm__ops_path_tensor_src_fp64.sum": "fp64",
    "sm__ops_path_tensor_src_fp8.sum": "fp8",
    "sm__ops_path_tensor_src_fp8_dst_fp16.sum": "fp8",
    "sm__ops_path_tensor_src_fp8_dst_fp32.sum": "fp8",
}
# Where a GPU has both an umbrella counter and its split by accumulator type, the umbrella wins
# (never both: that would count the same FLOPs twice).
TENSOR_UMBRELLAS = {
    "sm__ops_path_tensor_src_fp16.sum": ("sm__ops_path_tensor_src_fp16_dst_fp16.sum",
                                         "sm__ops_path_tensor_src_fp16_dst_fp32.sum"),
    "sm__ops_path_tensor_src_fp8.sum": ("sm__ops_path_tensor_src_fp8_dst_fp16.sum",
                                        "sm__ops_path_tensor_src_fp8_dst_fp32.sum"),
}
TIME_METRIC = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
OCC_PCT = "sm__warps_active.avg.pct_of_peak_sustained_active"
L2_BYTES = "lts__t_bytes.sum"
# What the SMs read from and wrote into L2 (32-byte sectors). ncu flushes L2 before each kernel,
# so DRAM reads are cold, but a store smaller than L2 is written back to DRAM only after the
# kernel ends: DRAM write counters miss it, the L2 write sectors do not.
L2_READ_TEX = "lts__t_sectors_srcunit_tex_op_read.sum"
L2_WRITE_TEX = "lts__t_sectors_srcunit_tex_op_write.sum"
L2_WRITE_ALL = "lts__t_sectors_op_write.sum"   # every L2 client (kept in the raw page only)
SECTOR_BYTES = 32

NCU_METRICS: list[str] = [
    TIME_METRIC, DRAM_READ, DRAM_WRITE, SM_PCT, DRAM_PCT, OCC_PCT, L2_BYTES,
    L2_READ_TEX, L2_WRITE_TEX, L2_WRITE_ALL,
    *FP64_METRICS, *FP32_METRICS, *FP16_METRICS, *TENSOR_METRICS,
]

# --- units ------------------------------------------------------------------------------------
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
         "second": 1e9, "s": 1e9}


def unit_scale(unit: str) -> float:
    """Factor that turns a value in ``unit`` into profkit's base unit (ns, byte, count, %)."""
    u = (unit or "").strip()
    if u in _TIME:
        return _TIME[u]
    m = re.fullmatch(r"([KMGT]?)(byte|inst|cycle|warp|sector|request|thread|op|flop)s?(/.*)?", u)
    if m and not m.group(3):
        return _PREFIX[m.group(1)]
    return 1.0


def to_number(text: object) -> float:
    """'1,048,576' -> 1048576.0; '', 'n/a', 'no data' -> NaN."""
    if text is None:
        return math.nan
    if isinstance(text, (int, float, np.number)):
        return float(text)
    s = str(text).strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if not s or s.lower() in ("n/a", "na", "nan", "nodata", "-"):
        return math.nan
    try:
        return float(s)
    except ValueError:
        return math.nan


# --- NVTX column --------------------------------------------------------------------------------
_QUOTED = re.compile(r'"([^"]*)"')


def parse_nvtx_stack(cell: object) -> list[str]:
    """Range names, outermost first, from ncu's ``thread Domain:Push/Pop_Range:…`` column.

    A cell reads ``1  "<default domain>:outer:none:none:none:none:none:none"  "<default
    domain>:inner:none:…"``: the thread id, then one quoted ``domain:range:PL_Type:PL_Value:
    CLR_Type:Color:Msg_Type:Msg`` item per pushed range (a range name may itself hold colons).
    """
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return []
    names = []
    for item in _QUOTED.findall(str(cell)):
        parts = item.split(":")
        if len(parts) < 2:
            continue
        rest = parts[1:]
        name = ":".join(rest[:-6]) if len(rest) >= 7 else rest[0]
        if name and name != "none":
            names.append(name)
    return names


# --- kernel names -------------------------------------------------------------------------------
def _strip_balanced(text: str, open_ch: str, close_ch: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_ch:
            depth += 1
        elif ch == close_ch and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


@functools.lru_cache(maxsize=65536)
def kernel_base_name(name: str) -> str:
    """The bare function name of a demangled kernel name.

    ``void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)1>(int, …)``
    -> ``vectorized_layer_norm_kernel``; names without templates or parameters stay as they are.
    """
    s = str(name or "").strip()
    # ncu prints anonymous namespaces as "unnamed>::" (its "<" lost), nsys as "<unnamed>::":
    # an unbalanced bracket would swallow the rest of the name, so drop them first.
    s = re.sub(r"<?unnamed>::|\(anonymous namespace\)::", "", s)
    s = _strip_balanced(s, "[", "]")
    s = _strip_balanced(s, "<", ">")
    s = _strip_balanced(s, "(", ")")
    s = s.strip().split(" ")[-1] if s.strip() else s
    s = s.split("::")[-1]
    return s.strip() or str(name)


# --- parsing ----------------------------------------------------------------------------------
def _geometry(cell: object) -> Optional[str]:
    """'(256, 1, 1)' -> '256,1,1' (None when absent)."""
    nums = re.findall(r"\d+", str(cell or ""))
    return ",".join(nums) if len(nums) == 3 else None


def read_raw_csv(source: str | Path | io.TextIOBase) -> pd.DataFrame:
    """One row per profiled kernel with profkit's columns (ns, FLOP, byte, %).

    Columns: ``id, process_id, device, kernel_name, nvtx_range, launch_index`` plus the metric
    columns of :data:`profkit.read.ncu.NCU_COLUMNS` (the nsys match columns are filled by the merge).
    """
    if isinstance(source, (str, Path)):
        p = Path(source)
        try:
            if p.suffix in (".gz", ".xz"):  # raw pages compress 7-12x; keep them so beside the trace
                import gzip
                import lzma
                opener = gzip.open if p.suffix == ".gz" else lzma.open
                with opener(p, "rt", encoding="utf-8-sig", errors="replace") as f:
                    text = f.read()
            else:
                text = p.read_text(encoding="utf-8-sig", errors="replace")
        except FileNotFoundError:
            raise ProfkitError(f"ncu CSV not found: {p}") from None
        except (OSError, EOFError) as exc:  # a damaged .gz
            raise ProfkitError(f"cannot read {p}: {exc}") from None
        label = str(p)
    else:
        text = source.read()
        label = "ncu CSV"
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') or ln.startswith("ID,")),
                 None)
    if start is None:
        raise ProfkitError(f"{label} is not an ncu raw-page CSV (no header row starting with "
                           "\"ID\"); export it with `ncu --import R.ncu-rep --csv --page raw`")
    table = pd.read_csv(io.StringIO("\n".join(lines[start:])), dtype=str, keep_default_na=False)
    if "Metric Name" in table.columns and "Metric Value" in table.columns:
        raise ProfkitError(f"{label} is an ncu details-page CSV; profkit needs the raw page: "
                           "`ncu --import R.ncu-rep --csv --page raw`")
    if "Kernel Name" not in table.columns:
        raise ProfkitError(f"{label} has no 'Kernel Name' column; is it an ncu raw-page CSV?")
    units = table.iloc[0] if len(table) else pd.Series(dtype=str)
    # The row after the header holds units: its ID cell is empty.
    if len(table) and str(table.iloc[0].get("ID", "")).strip() == "":
        body = table.iloc[1:]
    else:
        units = pd.Series({c: "" for c in table.columns})
        body = table
    body = body[body["ID"].astype(str).str.strip() != ""].reset_index(drop=True)

    def column(name: str) -> pd.Series:
        if name not in body.columns:
            return pd.Series(np.nan, index=body.index, dtype="float64")
        scale = unit_scale(str(units.get(name, "")))
        return body[name].map(to_number).astype("float64") * scale

    def metric(name: str) -> pd.Series:
        if name in body.columns or not name.endswith(".sum"):
            return column(name)
        # e.g. sm__ops_path_tensor_src_fp8.sum collected as its _sparsity_off/_on parts
        parts = [column(name[:-4] + f"_sparsity_{s}.sum") for s in ("off", "on")
                 if name[:-4] + f"_sparsity_{s}.sum" in body.columns]
        if not parts:
            return column(name)
        return pd.concat(parts, axis=1).sum(axis=1, min_count=1)

    def weighted(metrics: dict[str, float]) -> pd.Series:
        cols = [metric(m) * w for m, w in metrics.items()]
        frame = pd.concat(cols, axis=1)
        return frame.sum(axis=1, min_count=1)

    nvtx_cols = [c for c in body.columns if "Push/Pop_Range" in c]
    if nvtx_cols:
        stacks = body[nvtx_cols[0]].map(parse_nvtx_stack)
    else:
        stacks = pd.Series([[] for _ in range(len(body))], index=body.index, dtype=object)

    out = pd.DataFrame({
        "id": body["ID"].map(to_number).astype("int64"),
        "process_id": body["Process ID"].map(to_number) if "Process ID" in body else np.nan,
        "device": body["Device"].map(to_number) if "Device" in body else np.nan,
        "kernel_name": body["Kernel Name"].astype(str),
        "nvtx_range": stacks.map(lambda s: s[-1] if s else None),
        "nvtx_stack": stacks,
    })
    out["launch_index"] = np.arange(len(out), dtype="int64")
    out["gpu_time_ns"] = metric(TIME_METRIC)
    out["flops_fp64"] = weighted(FP64_METRICS)
    out["flops_fp32"] = weighted(FP32_METRICS)
    hadd, hmul, hfma = (metric(m) * w for m, w in FP16_METRICS.items())
    real_half = (hmul.fillna(0) + hfma.fillna(0)) > 0
    fp16 = pd.concat([hadd.where(real_half, 0.0), hmul, hfma], axis=1).sum(axis=1, min_count=1)
    out["flops_fp16"] = fp16
    tensor = {m: metric(m) for m in TENSOR_METRICS}
    for umbrella, splits in TENSOR_UMBRELLAS.items():
        has_umbrella = tensor[umbrella].notna()
        for split in splits:
            tensor[split] = tensor[split].where(~has_umbrella)
    tframe = pd.DataFrame(tensor)
    out["flops_tensor"] = tframe.sum(axis=1, min_count=1)
    by_prec = pd.DataFrame({p: sum((tensor[m].fillna(0) for m, q in TENSOR_METRICS.items()
                                    if q == p), pd.Series(0.0, index=body.index))
                            for p in dict.fromkeys(TENSOR_METRICS.values())})
    best = by_prec.idxmax(axis=1) if len(by_prec) else pd.Series(dtype=object)
    has = by_prec.max(axis=1) > 0 if len(by_prec) else pd.Series(dtype=bool)
    out["tensor_precision"] = [b if h else None for b, h in zip(best, has)]
    out["dram_bytes_read"] = metric(DRAM_READ)
    out["dram_bytes_write"] = metric(DRAM_WRITE)
    out["sm_throughput_pct"] = metric(SM_PCT)
    out["dram_throughput_pct"] = metric(DRAM_PCT)
    out["achieved_occupancy_pct"] = metric(OCC_PCT)
    out["l2_bytes"] = metric(L2_BYTES)
    out["l2_read_bytes"] = metric(L2_READ_TEX) * SECTOR_BYTES
    out["l2_write_bytes"] = metric(L2_WRITE_TEX) * SECTOR_BYTES
    out["grid"] = body["Grid Size"].map(_geometry) if "Grid Size" in body else None
    out["block"] = body["Block Size"].map(_geometry) if "Block Size" in body else None
    return out.sort_values("id", kind="stable").reset_index(drop=True)


# --- NVTX range filter --------------------------------------------------------------------------
def range_matcher(expr: Optional[str]):
    """A predicate on NVTX range text for an ncu ``--nvtx-include`` style expression.

    ``NAME`` or ``NAME/`` (push/pop range), ``domain@NAME/``, ``A/B/`` (innermost ``B``),
    ``regex:PATTERN`` (searched in the range text). A range carrying profkit hints
    (``"gemm {flops=…}"``) matches its bare name too.
    """
    if not expr:
        return None
    e = expr.strip()
    if e.startswith("regex:"):
        pat = re.compile(e[len("regex:"):].rstrip("/"))
        return lambda text: bool(text) and (bool(pat.search(text))
                                            or bool(pat.search(parse_range_name(text)[0])))
    e = e.rstrip("/")
    if "@" in e:
        e = e.split("@", 1)[1]
    e = e.split("/")[-1]
    return lambda text: bool(text) and (text == e or parse_range_name(text)[0] == e)


def ncu_range_expression(name: str) -> str:
    """The ``--nvtx-include`` argument for a user's ``--ncu-range`` (push/pop range ``NAME/``)."""
    n = name.strip()
    return n if n.endswith("/") else n + "/"


# --- nsys side ---------------------------------------------------------------------------------
def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                        (name,)).fetchone() is not None


def nsys_kernels(conn: sqlite3.Connection, range_expr: Optional[str] = None,
                 window: Optional[tuple[int, int]] = None) -> pd.DataFrame:
    """nsys kernel rows (start, deviceId, globalPid, demangled, short, grid, block) in launch
    order; ``window``: only kernels launched (API call start) in ``[t0, t1]``."""
    if not _has_table(conn, "CUPTI_ACTIVITY_KIND_KERNEL"):
        raise TraceError("the trace has no CUPTI_ACTIVITY_KIND_KERNEL table (no kernels were "
                         "traced); capture with `profkit capture` (nsys -t cuda)")
    have = {r[1] for r in conn.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
    geo = all(c in have for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"))
    geo_sql = (", k.gridX || ',' || k.gridY || ',' || k.gridZ AS grid, "
               "k.blockX || ',' || k.blockY || ',' || k.blockZ AS block" if geo else
               ", NULL AS grid, NULL AS block")
    k = pd.read_sql_query(
        "SELECT k.start, k.deviceId, k.globalPid, k.correlationId, "
        f"d.value AS demangled, s.value AS short{geo_sql} FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "LEFT JOIN StringIds d ON d.id = k.demangledName "
        "LEFT JOIN StringIds s ON s.id = k.shortName ORDER BY k.start", conn)
    k["demangled"] = k["demangled"].fillna(k["short"]).fillna("")
    if window is not None and not k.empty and _has_table(conn, "CUPTI_ACTIVITY_KIND_RUNTIME"):
        api = pd.read_sql_query("SELECT correlationId, globalTid, start AS api_start "
                                "FROM CUPTI_ACTIVITY_KIND_RUNTIME", conn)
        api["globalPid"] = api["globalTid"] - (api["globalTid"] % (1 << 24))
        k = k.merge(api[["globalPid", "correlationId", "api_start"]],
                    on=["globalPid", "correlationId"], how="left")
        k = k[(k["api_start"] >= window[0]) & (k["api_start"] <= window[1])]
        k = k.drop(columns="api_start").sort_values("start", kind="stable").reset_index(drop=True)
    match = range_matcher(range_expr)
    if match is None or k.empty:
        return k
    if not (_has_table(conn, "CUPTI_ACTIVITY_KIND_RUNTIME") and _has_table(conn, "NVTX_EVENTS")):
        return k.iloc[0:0]
    launches = pd.read_sql_query(
        "SELECT correlationId, globalTid, start AS api_start FROM CUPTI_ACTIVITY_KIND_RUNTIME",
        conn)
    launches["globalPid"] = launches["globalTid"] - (launches["globalTid"] % (1 << 24))
    k = k.merge(launches, on=["globalPid", "correlationId"], how="left")
    nv = pd.read_sql_query(
        "SELECT n.start, n.end, n.globalTid, COALESCE(n.text, s.value) AS text "
        "FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE n.eventType = 59 AND n.end IS NOT NULL", conn)
    nv = nv[nv["text"].map(lambda t: match(t) if isinstance(t, str) else False)]
    keep = np.zeros(len(k), dtype=bool)
    for tid, ranges in nv.groupby("globalTid"):
        ranges = ranges.sort_values("start")
        starts = ranges["start"].to_numpy()
        reach = np.maximum.accumulate(ranges["end"].to_numpy())
        sel = (k["globalTid"] == tid).to_numpy()
        t = k.loc[sel, "api_start"].to_numpy(dtype="float64")
        idx = np.searchsorted(starts, t, side="right") - 1
        ok = (idx >= 0) & (reach[np.clip(idx, 0, None)] >= t)
        keep[np.flatnonzero(sel)[ok]] = True
    return k[keep].sort_values("start", kind="stable").reset_index(drop=True)


# --- matching and merging -------------------------------------------------------------------
@dataclass
class MergeResult:
    trace: Path
    profiled: int = 0
    matched: int = 0
    unmatched: list[str] = field(default_factory=list)
    # pairs whose grid/block differ or that break launch order: the pairing is not trustworthy
    mismatched: list[str] = field(default_factory=list)
    dropped: int = 0   # mismatched pairs left out (allow_mismatch)

    def summary(self) -> str:
        text = f"{self.matched} of {self.profiled} ncu kernels matched to nsys kernels"
        if self.mismatched:
            text += (f", {len(self.mismatched)} of them with a different grid/block or out of "
                     f"launch order (e.g. {self.mismatched[0][:120]})")
            if self.dropped:
                text += f"; those {self.dropped} left out"
        if self.unmatched:
            names = sorted(set(self.unmatched))
            more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
            text += f"; unmatched: {', '.join(n[:60] for n in names[:3])}{more}"
        return text


def _longest_increasing(values: list[float]) -> set[int]:
    """Indices of one longest strictly increasing subsequence of ``values``."""
    import bisect
    tails: list[float] = []
    tail_idx: list[int] = []
    prev = [-1] * len(values)
    for i, v in enumerate(values):
        k = bisect.bisect_left(tails, v)
        if k == len(tails):
            tails.append(v)
            tail_idx.append(i)
        else:
            tails[k] = v
            tail_idx[k] = i
        prev[i] = tail_idx[k - 1] if k else -1
    keep, i = set(), (tail_idx[-1] if tail_idx else -1)
    while i >= 0:
        keep.add(i)
        i = prev[i]
    return keep


def check_pairs(matched: pd.DataFrame) -> dict[int, str]:
    """The matched pairs that do not line up, by ncu id: a grid or block size that differs
    between ncu and nsys (where both name it), or an nsys launch out of ncu's launch order (ncu
    profiles in launch order; the fewest pairs that break the order are named, so one pair that
    jumped ahead does not condemn every pair after it)."""
    bad: dict[int, str] = {}
    ok = matched[matched["kernel_start"].notna()].sort_values("id")
    for r in ok.itertuples(index=False):
        for what in ("grid", "block"):
            a, b = getattr(r, what, None), getattr(r, f"nsys_{what}", None)
            if isinstance(a, str) and isinstance(b, str) and a != b:
                bad[int(r.id)] = (f"ncu #{r.id} {kernel_base_name(r.kernel_name)}: {what} ({a}) "
                                  f"in ncu, ({b}) in nsys")
    if "nsys_corr" in ok:
        for _, g in ok.groupby("globalPid"):
            corr = g["nsys_corr"].astype(float).tolist()
            keep = _longest_increasing(corr)
            for j, r in enumerate(g.itertuples(index=False)):
                if j not in keep and int(r.id) not in bad:
                    bad[int(r.id)] = (f"ncu #{r.id} {kernel_base_name(r.kernel_name)}: its nsys "
                                      "launch is out of ncu's launch order")
    return bad


def match_kernels(ncu: pd.DataFrame, nsys: pd.DataFrame) -> pd.DataFrame:
    """Add ``globalPid, deviceId, kernel_start`` to the ncu rows (NaN where no match).

    Processes are paired by order of first kernel (the two runs have different pids); a device
    is honoured when both sides name it. Within a (process, device), the k-th ncu launch of a
    kernel is the k-th nsys launch of the same kernel: by exact demangled name when nsys has that
    name, else by bare function name (:func:`kernel_base_name`). Where both sides give grid and
    block sizes they are part of the kernel's identity: a launch ncu saw with another geometry
    (e.g. cuDNN picked another configuration in the second run) stays unmatched rather than
    landing on the wrong kernel.
    """
    out = ncu.reset_index(drop=True).copy()
    out["globalPid"] = np.nan
    out["deviceId"] = np.nan
    out["kernel_start"] = np.nan
    out["nsys_grid"] = None
    out["nsys_block"] = None
    out["nsys_corr"] = np.nan
    if out.empty or nsys.empty:
        return out
    nsys = nsys.sort_values("start", kind="stable")
    pids_nsys = list(dict.fromkeys(nsys["globalPid"]))
    pids_ncu = list(dict.fromkeys(out.sort_values("id")["process_id"].fillna(-1)))
    pid_map = {p: (pids_nsys[i] if i < len(pids_nsys) else None) for i, p in enumerate(pids_ncu)}
    devices_nsys = set(nsys["deviceId"].dropna().astype(int))

    use_geo = ("grid" in out and "block" in out and out["grid"].notna().all()
               and out["block"].notna().all() and "grid" in nsys and nsys["grid"].notna().all())
    geo_n = (lambda r: (r.grid, r.block)) if use_geo else (lambda r: ())
    geo_c = (lambda r: (r["grid"], r["block"])) if use_geo else (lambda r: ())

    queues: dict[tuple, list] = {}
    for row in nsys.itertuples(index=False):
        queues.setdefault(("x", row.globalPid, row.deviceId, row.demangled, *geo_n(row)),
                          []).append(row)
    exact_names = {key[3] for key in queues}
    used_exact = {n for n in out["kernel_name"] if n in exact_names}
    for row in nsys.itertuples(index=False):
        if row.demangled not in used_exact:
            queues.setdefault(("b", row.globalPid, row.deviceId, kernel_base_name(row.demangled),
                               *geo_n(row)), []).append(row)
    cursor: dict[tuple, int] = {}
    for i, row in out.sort_values("id").iterrows():
        gpid = pid_map.get(row["process_id"] if not pd.isna(row["process_id"]) else -1)
        if gpid is None:
            continue
        devs = ([int(row["device"])] if not pd.isna(row["device"])
                and int(row["device"]) in devices_nsys else sorted(devices_nsys))
        name = row["kernel_name"]
        for dev in devs:
            key = (("x", gpid, dev, name, *geo_c(row)) if name in used_exact
                   else ("b", gpid, dev, kernel_base_name(name), *geo_c(row)))
            q = queues.get(key)
            n = cursor.get(key, 0)
            if q and n < len(q):
                cursor[key] = n + 1
                out.at[i, "globalPid"] = q[n].globalPid
                out.at[i, "deviceId"] = q[n].deviceId
                out.at[i, "kernel_start"] = q[n].start
                out.at[i, "nsys_grid"] = getattr(q[n], "grid", None)
                out.at[i, "nsys_block"] = getattr(q[n], "block", None)
                out.at[i, "nsys_corr"] = q[n].correlationId
                break
    return out


def check_writable(trace: Path) -> None:
    """A merge writes into the trace (and SQLite puts its journal beside it): say so up front."""
    if not os.access(trace, os.W_OK) or not os.access(trace.parent, os.W_OK):
        raise ProfkitError(f"{trace} is read-only (or its directory is): merge into a copy with "
                           f"`profkit capture --merge-ncu RAW.csv {trace} -o COPY.sqlite`")


def merge_ncu(trace: str | Path, ncu: pd.DataFrame | str | Path,
              range_expr: Optional[str] = None, window: Optional[tuple[int, int]] = None,
              allow_mismatch: bool = False, force: bool = False) -> MergeResult:
    """Write ``ncu`` (a :func:`read_raw_csv` frame or a CSV path) into ``trace``'s SQLite.

    Replaces any earlier ``PROFKIT_NCU_METRICS`` rows, in one transaction; nsys's tables are
    only read. Unmatched ncu kernels are left out and listed in the result. ``window``: only
    nsys kernels launched in ``[t0, t1]`` (ns) are candidates (one iteration profiled by ncu).

    A merge that could put counters on the wrong kernels or lose data is refused
    (:class:`ProfkitError`, nothing written) unless ``force``: pairs that do not line up (grid,
    block or launch order differ: e.g. ncu skipped launches the matcher cannot see; with
    ``allow_mismatch`` only the pairs that line up are merged and the rest reported); no kernel
    matched (a typo in the range, the CSV of another program); or fewer kernels than the
    counters already merged.
    """
    trace = Path(trace)
    if not trace.is_file():
        raise ProfkitError(f"trace not found: {trace}")
    check_writable(trace)
    frame = ncu if isinstance(ncu, pd.DataFrame) else read_raw_csv(ncu)
    match = range_matcher(range_expr)
    if match is not None and "nvtx_stack" in frame and frame["nvtx_stack"].map(bool).any():
        # a CSV profiled without the range filter: keep the kernels ncu saw inside the range
        frame = frame[frame["nvtx_stack"].map(lambda st: any(match(n) for n in st))]
        if frame.empty and not force:
            raise ProfkitError(f"no kernel of the ncu CSV ran inside the NVTX range {range_expr!r}: "
                               f"nothing merged, {trace} unchanged (check --ncu-range; --force "
                               "merges anyway)")
    try:
        conn = sqlite3.connect(str(trace))
        conn.execute("PRAGMA schema_version")
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{trace} is not an SQLite file ({exc})") from None
    try:
        try:
            kernels = nsys_kernels(conn, range_expr)
        except sqlite3.DatabaseError as exc:
            raise TraceError(f"{trace} is not an nsys SQLite export ({exc})") from None
        if window is not None:
            kernels = nsys_kernels(conn, range_expr, window)
        matched = match_kernels(frame, kernels)
        ok = matched["kernel_start"].notna()
        bad = check_pairs(matched)
        rows = matched[ok & ~matched["id"].isin(list(bad))]
        result = MergeResult(trace=trace, profiled=len(matched), matched=int(ok.sum()),
                             unmatched=list(matched.loc[~ok, "kernel_name"]),
                             mismatched=list(bad.values()), dropped=len(bad))
        if result.mismatched and not (allow_mismatch or force):
            raise ProfkitError(
                f"ncu and nsys kernels do not line up: {result.summary()}. The counters would "
                "land on the wrong kernels (was ncu run with --launch-skip, a kernel filter, or "
                "on a run that launched different kernels?); nothing merged")
        cols = list(NCU_COLUMNS)
        records = []
        for r in rows.itertuples(index=False):
            rec = []
            for c in cols:
                v = getattr(r, c)
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    rec.append(None)
                elif NCU_COLUMNS[c] == "INTEGER":
                    rec.append(int(v))
                elif NCU_COLUMNS[c] == "REAL":
                    rec.append(float(v))
                else:
                    rec.append(str(v))
            records.append(rec)
        existing = (conn.execute(f"SELECT count(*) FROM {NCU_TABLE}").fetchone()[0]
                    if _has_table(conn, NCU_TABLE) else 0)
        if not force and len(rows) == 0:
            raise ProfkitError(
                f"{result.summary()}: nothing merged, {trace} unchanged (check --ncu-range and "
                "that the CSV comes from the same program; --force merges anyway)")
        if not force and len(rows) < existing:
            raise ProfkitError(
                f"{result.summary()}, fewer than the {existing} counters already in {trace}: "
                "nothing changed (--force replaces them)")
        try:
            with conn:
                conn.execute(create_table_sql())
                # a table written by an older profkit lacks the newer columns
                have = {r[1] for r in conn.execute(f"PRAGMA table_info({NCU_TABLE})")}
                for c in cols:
                    if c not in have:
                        conn.execute(f"ALTER TABLE {NCU_TABLE} ADD COLUMN {c} {NCU_COLUMNS[c]}")
                conn.execute(f"DELETE FROM {NCU_TABLE}")
                conn.executemany(f"INSERT INTO {NCU_TABLE} ({', '.join(cols)}) VALUES "
                                 f"({', '.join('?' for _ in cols)})", records)
        except sqlite3.OperationalError as exc:  # read-only file system, locked by a writer
            raise ProfkitError(f"cannot write into {trace} ({exc}): merge into a copy with "
                               f"`profkit capture --merge-ncu RAW.csv {trace} -o COPY.sqlite`") from None
        return result
    finally:
        conn.close()


META_TABLE = "PROFKIT_META"


def write_meta(trace: str | Path, items: dict[str, object] | Iterable[tuple[str, object]]) -> None:
    """Set ``key -> value`` rows in ``PROFKIT_META(key TEXT, value TEXT)`` (one row per key)."""
    pairs = list(items.items() if isinstance(items, dict) else items)
    conn = sqlite3.connect(str(trace))
    try:
        with conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {META_TABLE} (key TEXT, value TEXT)")
            for key, value in pairs:
                conn.execute(f"DELETE FROM {META_TABLE} WHERE key = ?", (str(key),))
                conn.execute(f"INSERT INTO {META_TABLE} (key, value) VALUES (?, ?)",
                             (str(key), None if value is None else str(value)))
    finally:
        conn.close()


def read_meta(trace: str | Path) -> dict[str, Optional[str]]:
    conn = sqlite3.connect(str(trace))
    try:
        if not _has_table(conn, META_TABLE):
            return {}
        return dict(conn.execute(f"SELECT key, value FROM {META_TABLE}").fetchall())
    finally:
        conn.close()
