"""Work counts (FLOPs, bytes, precision) per op call, from the best source the trace offers.

Order, best first: ncu counters merged into the trace, nsys GPU-metrics samples over the op's
kernels, aten op shapes, FLOP/byte hints in the range name, the exact bytes of memcpy/memset,
and — when none applies — nothing: the classifier then reads the timeline alone.

Element types come from the op's own kernels (:mod:`profkit.judge.dtypes`), never from a vote over the
whole trace: where no kernel of the op names its type, the precision is None, byte counts are
given at both 2 and 4 bytes per element (the lower one used, so a wrong guess cannot put an op
above its roof) and the confidence drops to "low".
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
import pandas as pd

from profkit.read.aten_record import flatten_sizes
from profkit.judge.dtypes import ELEM_BYTES, UNKNOWN_ELEM_BYTES, OpDtype, op_dtype
from profkit.read.hints import Hint
from profkit.model import Source

__all__ = ["Work", "OpDtype", "ELEM_BYTES", "precision_of", "from_ncu", "match_ncu", "from_hint", "from_copies",
           "from_shapes", "from_aten_calls", "op_dtype"]


@dataclass
class Work:
    """What one call of an op does, and where that number came from."""
    source: Source
    flops: Optional[float] = None      # per call
    bytes: Optional[float] = None      # per call
    precision: Optional[str] = None    # None: the element type is unknown
    detail: str = ""
    dram_pct: Optional[float] = None   # ncu / GPU metrics: time-weighted DRAM throughput, % of peak
    sm_pct: Optional[float] = None     # ncu: SM throughput; GPU metrics: SMs active, % of peak
    time_ns: Optional[float] = None    # per call, the GPU time the counts were measured over
    host_link: bool = False            # bytes cross PCIe/C2C, not HBM: the HBM roof does not apply
    tensor_pct: Optional[float] = None  # GPU metrics: tensor pipes active, % of peak
    l2_bytes: Optional[float] = None   # ncu: L2-side bytes (lts__t_bytes) per call
    bytes_basis: str = ""              # which bytes the verdict uses: hbm | dram | l2 | model | copy
    candidates: tuple[str, ...] = ()   # precision None: the types it may be (roof: the highest)
    confidence_cap: Optional[str] = None  # "low" when the counts rest on a guessed element type
    notes: dict = field(default_factory=dict)     # further evidence (bounds), shown as is
    warnings: list[str] = field(default_factory=list)
    # A lower reading of the same source (e.g. causal attention FLOPs), tried before giving the
    # source up when the primary reading lands above a roof.
    fallback: Optional["Work"] = None
    # Different ops (aten::mm, aten::add, ...) whose calls were summed into this count (a range's
    # aten calls, from_aten_calls); 0 for an op's own count.
    parts: int = 0


def precision_of(names: list[str]) -> Optional[str]:
    """The element type the kernel names point to, or None (see :func:`profkit.judge.dtypes.op_dtype`)."""
    return op_dtype(names).precision


# L2 capacity when the trace does not say (H100's 50 MiB; the H200's TARGET_INFO_GPU says 60 MiB):
# an op whose per-launch L2 traffic fits may keep its writes in L2, so ncu's DRAM bytes
# understate what it moves.
L2_CAPACITY_BYTES = 50 * 2**20
# DRAM bytes below this share of the L2-side bytes mean the working set stayed in L2.
L2_RESIDENT_RATIO = 0.5
_FLOP_COLS = ["flops_fp64", "flops_fp32", "flops_fp16", "flops_tensor"]


def _kernels_only(member_acts: pd.DataFrame) -> pd.DataFrame:
    """The op's kernels: memcpy/memset have no counters and must not scale the kernels' ones."""
    return member_acts[member_acts["kind"] == "kernel"]


_BASIS_TEXT = {"hbm": "DRAM reads + stores into L2", "dram": "DRAM bytes", "l2": "L2 bytes"}


def hbm_bytes(ncu_rows: pd.DataFrame) -> pd.Series:
    """Per ncu row, the bytes that reach HBM: DRAM reads plus the larger of the DRAM and L2 write
    counts.  ncu flushes L2 before each kernel, so its DRAM reads are cold, but a store that fits
    in L2 is written back after the kernel ends, outside the DRAM write counter; every store
    passes through L2.  A row without the L2 write count (NaN) counts its DRAM writes."""
    return ncu_rows["dram_bytes_read"].fillna(0) + np.maximum(ncu_rows["dram_bytes_write"].fillna(0),
                                                              ncu_rows["l2_write_bytes"].fillna(0))


def match_ncu(kernels: pd.DataFrame, ncu: pd.DataFrame) -> pd.DataFrame:
    """The ncu rows of ``kernels`` (matched by process, device and start), beside their columns."""
    return kernels.merge(ncu, left_on=["globalPid", "deviceId", "start"],
                         right_on=["globalPid", "deviceId", "kernel_start"], how="inner")


def from_ncu(member_acts: pd.DataFrame, ncu: pd.DataFrame, calls: int,
             l2_capacity: Optional[float] = None,
             matched: Optional[pd.DataFrame] = None) -> Optional[Work]:
    """Counters of the op's kernels that the ncu pass profiled (matched by device and start).

    Per kernel identity (demangled name): the profiled launches of a kernel stand for all its
    launches in the op, so a fill and a GEMM under one key are never averaged together. Bytes,
    FLOPs and time all come from ncu (its ``gpu__time_duration``), so a cold-cache byte count is
    never divided by a warm-cache nsys time. Kernels of the op that ncu never saw are covered by
    scaling with their nsys time, and the detail says so. Copies and memsets are left out.
    ``matched``: ``match_ncu`` of the op's kernels when the caller matched the whole trace once.
    """
    if ncu.empty or member_acts.empty:
        return None
    kern = _kernels_only(member_acts)
    if kern.empty:
        return None
    m = match_ncu(kern, ncu) if matched is None else matched
    if m.empty:
        return None
    m = m.copy()
    m["nsys_ns"] = (m["end"] - m["start"]).astype(float)
    ncu_t = pd.to_numeric(m["gpu_time_ns"], errors="coerce") if "gpu_time_ns" in m else None
    m["ncu_ns"] = ncu_t.where(ncu_t > 0, m["nsys_ns"]) if ncu_t is not None else m["nsys_ns"]
    for c in ("l2_bytes", "l2_write_bytes"):
        if c not in m:
            m[c] = np.nan
    m["dram"] = m["dram_bytes_read"].fillna(0) + m["dram_bytes_write"].fillna(0)
    hbm_seen = m["l2_write_bytes"].notna().any()
    m["hbm"] = hbm_bytes(m)
    launches = kern.groupby("name", observed=True).size()
    cols = _FLOP_COLS + ["dram", "hbm", "l2_bytes", "ncu_ns", "nsys_ns"]
    l2_seen = m["l2_bytes"].notna().any()
    by_name = m[cols].astype(float).fillna(0).groupby(m["name"], observed=True)
    sums, seen = by_name.sum(), by_name.size()
    # a kernel's profiled launches stand for all its launches in the op
    factor = (launches.reindex(sums.index).fillna(seen) / seen).to_numpy(dtype=float)
    totals = {c: sum((sums[c].to_numpy() * factor).tolist(), 0.0) for c in cols}
    per_launch_l2 = (sums["l2_bytes"] / seen).tolist() if l2_seen else []
    covered_nsys = totals["nsys_ns"]
    unprofiled = kern[~kern["name"].isin(set(m["name"]))]
    extra_ns = float((unprofiled["end"] - unprofiled["start"]).sum())
    note = ""
    if extra_ns > 0 and covered_nsys > 0:
        # kernels of the op without counters: assume they work like the profiled ones, per ns
        s = 1.0 + extra_ns / covered_nsys
        for c in totals:
            if c != "nsys_ns":
                totals[c] *= s
        note = (f"; {unprofiled['name'].nunique()} kernel name(s) without counters "
                f"({extra_ns / (extra_ns + covered_nsys):.0%} of the op's kernel time) scaled by time")
    # Device-side copies and memsets of the op (pow(x, 1) is a copy, pow(x, 2) a kernel, under
    # one key): no counters, but their bytes are exact and their time is in the trace.
    dev = member_acts[member_acts["kind"].isin(["memcpy", "memset"])
                      & ~member_acts["name"].astype(str).str.contains("Host")]
    if len(dev):
        copy_b = copy_bytes(dev)
        for c in ("dram", "hbm"):
            totals[c] += copy_b
        totals["ncu_ns"] += float((dev["end"] - dev["start"]).sum())
        note += f"; {len(dev)} device copies/memsets at their exact bytes"
    if totals["ncu_ns"] <= 0:
        return None
    n = max(calls, 1)
    flops = sum(totals[c] for c in _FLOP_COLS)
    if totals["flops_tensor"] > 0:
        # The tensor precision that did most of the tensor work: kernels without tensor work
        # (empty or missing precision) must not outvote the GEMMs.
        tp = m[["tensor_precision", "flops_tensor"]].dropna()
        tp = tp[tp["tensor_precision"].astype(str).str.fullmatch(r"[a-z0-9_]+") & (tp["flops_tensor"] > 0)]
        precision = (str(tp.groupby("tensor_precision")["flops_tensor"].sum().idxmax())
                     if len(tp) else None)
    elif flops > 0:
        precision = max(("fp64", "fp32", "fp16"), key=lambda p: totals[f"flops_{p}"])
    else:
        precision = op_dtype(list(kern["name"].astype(str).unique())).precision
    w = lambda col: (float(np.average(m[col].fillna(0), weights=m["ncu_ns"]))
                     if m[col].notna().any() else None)
    dram = totals["dram"]
    l2 = totals["l2_bytes"] if l2_seen else None
    basis, used = "dram", dram
    if hbm_seen:
        basis, used = "hbm", totals["hbm"]  # cold reads + every store
    elif l2 and totals["flops_tensor"] == 0 and dram < L2_RESIDENT_RATIO * l2 \
            and max(per_launch_l2 or [0.0]) <= (l2_capacity or L2_CAPACITY_BYTES):
        basis, used = "l2", l2  # the data stayed in L2: DRAM bytes miss the writes it absorbed
    notes = {"dram_bytes_per_call": dram / n, "bytes_basis": basis,
             "ncu_time_per_call_ns": totals["ncu_ns"] / n}
    if hbm_seen:
        notes["hbm_bytes_per_call"] = totals["hbm"] / n
    if l2 is not None:
        notes["l2_bytes_per_call"] = l2 / n
    return Work(Source.NCU, flops=flops / n, bytes=used / n, precision=precision,
                dram_pct=w("dram_throughput_pct"), sm_pct=w("sm_throughput_pct"),
                time_ns=totals["ncu_ns"] / n, l2_bytes=(l2 / n) if l2 is not None else None,
                bytes_basis=basis, notes=notes,
                detail=f"{len(m)} of {len(kern)} kernels profiled by ncu; bytes and time from ncu "
                       f"({_BASIS_TEXT[basis]}){note}")


def from_hint(hint: Optional[Hint], default_precision: Optional[str]) -> Optional[Work]:
    if hint is None or (hint.flops is None and hint.bytes is None):
        return None
    return Work(Source.HINTS, flops=hint.flops, bytes=hint.bytes,
                precision=hint.precision or default_precision, detail="hint in the NVTX range name")


def copy_bytes(copies: pd.DataFrame) -> float:
    """Bytes memcpy/memset rows move, from the trace: a device-to-device copy reads and writes."""
    factor = np.where(copies["name"].astype(str).str.contains("Device-to-Device"), 2.0, 1.0)
    return float((copies["bytes"].astype(float).fillna(0) * factor).sum())


def from_copies(member_acts: pd.DataFrame, calls: int) -> Optional[Work]:
    """memcpy/memset ops: their bytes are in the trace."""
    if member_acts.empty or not member_acts["kind"].isin(["memcpy", "memset"]).all():
        return None
    b = copy_bytes(member_acts)
    host = bool(member_acts["name"].str.contains("Host").any())
    return Work(Source.COPY, flops=0.0, bytes=b / max(calls, 1), precision=None, host_link=host,
                bytes_basis="copy",
                detail="bytes of the copies" + (" over the host link" if host else ""))


def _top_level_args(name: str, start: int) -> list[str]:
    """The comma-separated template arguments of the ``<...>`` opening at ``name[start]``."""
    depth, cur, out = 0, [], []
    for ch in name[start:]:
        if ch == "<":
            depth += 1
            if depth == 1:
                continue
        elif ch == ">":
            depth -= 1
            if depth == 0:
                out.append("".join(cur).strip())
                return out
        elif ch == "," and depth == 1:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    return out


def attention_causal(kernel_names: list[str]) -> Optional[bool]:
    """Whether the op's flash-attention kernels were built causal, where the name shows it.

    FlashAttention-2 kernels (PyTorch's ``pytorch_flash::flash_fwd_kernel`` and the bwd ones)
    take ``<Kernel_traits, Is_dropout, Is_causal, ...>``. cuDNN and memory-efficient kernels do
    not name it: None (unknown)."""
    seen = set()
    for n in kernel_names:
        m = re.search(r"flash_(?:fwd|bwd)\w*kernel<", n)
        if not m:
            continue
        args = _top_level_args(n, m.end() - 1)
        if len(args) >= 3 and args[2] in ("(bool)1", "true", "(bool)0", "false"):
            seen.add(args[2] in ("(bool)1", "true"))
    return seen.pop() if len(seen) == 1 else None


def _record_out_elems(record, call) -> Optional[int]:
    """A reduction's (or a backward scatter's) output size from the record: its outputs, else
    the input and ``dim``."""
    from profkit.judge import flops as flop_model
    name = flop_model.normalize_op(call.op)
    if record is None or (name not in flop_model.REDUCTION_OPS
                          and name not in flop_model.SCATTER_BACKWARD_OPS):
        return None
    if record.outputs:
        shape = record.outputs[0][1]
        if shape is not None:
            return flop_model.numel(shape)
    if name in flop_model.REDUCTION_OPS and record.dim is not None and call.sizes and call.sizes[0]:
        return flop_model.reduced_elems(call.sizes[0], record.dim)
    return None


def from_shapes(op_key: str, dtype: OpDtype | int | None = None,
                precision: Optional[str] = None, causal: Optional[bool] = None,
                record=None) -> Optional[Work]:
    """FLOPs and bytes from an aten op's input sizes (`aten::mm [[m, k], [k, n]]`).

    ``dtype``: the op's :class:`~profkit.judge.dtypes.OpDtype` (from its kernels); an int is taken as
    bytes per element with ``precision`` (the older call form). Unknown element size: bytes at
    2 and 4 bytes per element, the lower one used and confidence capped at "low". Casts count
    the source and destination types where the kernel names show them. ``causal``: attention
    built causal (True: half the FLOPs), not (False), or unknown (None: the full count, with the
    causal count as the fallback when the full one lands above the compute roof). ``record``:
    the op's :class:`~profkit.read.aten_record.AtenRecord` (profkit's recorder), for what the
    shapes alone do not show: a reduction's output size.
    """
    from profkit.judge import flops as flop_model
    if isinstance(dtype, int):
        fixed_eb: Optional[int] = dtype
        dtype = OpDtype(precision, "given by the caller")
    else:
        dtype = dtype if dtype is not None else OpDtype(None, "no kernels", ("bf16", "fp32"))
        fixed_eb = dtype.elem_bytes
    call = flop_model.parse_aten_range(op_key.replace(" [", ", sizes = [", 1))
    if call is None:
        return None
    src_eb = ELEM_BYTES.get(dtype.src or "") or None
    dst_eb = ELEM_BYTES.get(dtype.dst or "") or None

    def cost(eb: int, causal: bool = False):
        c = flop_model.estimate(call.op, call.sizes, elem_bytes=eb, causal=causal,
                                src_elem_bytes=src_eb, dst_elem_bytes=dst_eb,
                                raw_sizes=call.raw_sizes, out_elems=out_elems)
        if c is None or record is None or not record.same:
            return c
        # A tensor passed twice is read once: bytes without the repeats, FLOPs as called.
        raw = record.without_repeats()
        once = flop_model.estimate(call.op, flatten_sizes(raw), elem_bytes=eb, causal=causal,
                                   src_elem_bytes=src_eb, dst_elem_bytes=dst_eb, raw_sizes=raw,
                                   out_elems=out_elems)
        if once is None or once.bytes >= c.bytes:
            return c
        shown = ", ".join(f"argument {i} is argument {j}" for i, j in record.same)
        return replace(c, bytes=once.bytes, formula=f"{c.formula}; {shown}: read once")

    out_elems = _record_out_elems(record, call)

    if fixed_eb is not None:
        c = cost(fixed_eb, causal=bool(causal))
        if c is None:
            return None
        notes: dict = {"element_type": dtype.precision or "/".join(dtype.candidates) or "unknown",
                       "element_type_basis": dtype.basis}
        cap = None
        prec = dtype.precision
    else:
        lo, hi = UNKNOWN_ELEM_BYTES
        c, c_hi = cost(lo, causal=bool(causal)), cost(hi, causal=bool(causal))
        if c is None:
            return None
        notes = {"element_type": "unknown", "element_type_basis": dtype.basis,
                 f"bytes_per_call_at_{lo}B": c.bytes,
                 f"bytes_per_call_at_{hi}B": c_hi.bytes if c_hi else None}
        cap = "low"
        prec = None
    work = Work(Source.SHAPES, flops=float(c.flops), bytes=float(c.bytes), precision=prec,
                candidates=dtype.candidates if prec is None else (), bytes_basis="model",
                confidence_cap=cap, notes=notes,
                detail=f"{c.kind}: {c.formula}" + ("" if fixed_eb is not None else
                       f" (element type unknown: bytes at {UNKNOWN_ELEM_BYTES[0]} B/element, "
                       f"{UNKNOWN_ELEM_BYTES[1]} B/element in the evidence)"))
    if c.kind == "attention" and causal is not None:
        work.notes["causal"] = causal
    if c.kind == "attention" and causal is None:
        eb = fixed_eb if fixed_eb is not None else UNKNOWN_ELEM_BYTES[0]
        cc = cost(eb, causal=True)
        if cc is not None:
            work.notes["flops_per_call_if_causal"] = cc.flops
            work.fallback = Work(Source.SHAPES, flops=float(cc.flops), bytes=float(cc.bytes),
                                 precision=prec, candidates=work.candidates, bytes_basis="model",
                                 confidence_cap="low", notes=dict(work.notes),
                                 detail=f"{cc.kind}: {cc.formula} (causal assumed: the full "
                                        "count is above the compute roof)")
    return work


# A range's work from the aten calls nested in it (from_aten_calls) is offered when calls that
# the shape model covers hold at least this share of the range's GPU time (below, most of the
# work is unknown and the sum would say little)...
ATEN_MIN_SHARE = 0.5
# ...with the shape model's own confidence ("medium", never more: a sum over several ops is no
# surer than the model of each) only from this share up, when one element type holds at least
# this share of the FLOPs (of the bytes, for work without FLOPs), and when calls whose element
# type is a guess hold under the rest; otherwise "low".
ATEN_FULL_SHARE = 0.9


def from_aten_calls(calls: list[tuple[str, Optional[Work], int, float]], n_calls: int,
                    total_ns: float, busy_ns: float) -> Optional[Work]:
    """A range's work per call: the sum of the shape model's work of the aten calls nested in it
    that launched its GPU work (each aten call counted once: the innermost aten range around a
    launch owns its kernels, so a wrapper such as aten::linear around aten::addmm adds nothing).

    ``calls``: one entry per aten op and input sizes: the op's name (``aten::mm``); its work per
    call, or None where the model has none or its reading lands above a roof; how many of its
    calls the range holds; their GPU time in the range. ``n_calls``: the range's own calls.
    ``total_ns``: the GPU time of all the range's activities, inside aten calls or not; None is
    returned when modelled calls hold under ATEN_MIN_SHARE of it. ``busy_ns``: the range's busy
    GPU time over all its calls. The counts are a mean per call (calls of one range name may
    differ: the backward of the LM head and of a small projection), so they are measured over
    the mean busy time per call (``time_ns``), not the median call's. Element type: that of the
    calls with the most FLOPs (bytes when there are none), so the compute roof is the one the
    bulk of the arithmetic runs against.
    """
    if n_calls <= 0 or total_ns <= 0 or busy_ns <= 0:
        return None
    names = {op for op, w, n, _ in calls if w is not None and w.flops is not None
             and w.bytes is not None and n > 0}
    modelled = [(w, n, t) for _, w, n, t in calls
                if w is not None and w.flops is not None and w.bytes is not None and n > 0]
    if not modelled:
        return None
    modelled_ns = sum(t for _, _, t in modelled)
    share = modelled_ns / total_ns
    if share < ATEN_MIN_SHARE:
        return None
    flops = sum(w.flops * n for w, n, _ in modelled)
    nbytes = sum(w.bytes * n for w, n, _ in modelled)
    weight: dict[Optional[str], float] = {}
    for w, n, _ in modelled:
        weight[w.precision] = weight.get(w.precision, 0.0) + (w.flops if flops > 0 else w.bytes) * n
    precision, top = max(weight.items(), key=lambda kv: kv[1])
    type_share = top / sum(weight.values()) if sum(weight.values()) > 0 else 1.0
    guessed_ns = sum(t for w, _, t in modelled if w.confidence_cap == "low")
    low = []
    if share < ATEN_FULL_SHARE:
        low.append(f"only {share:.0%} of its GPU time is in aten calls the shape model covers")
    if precision is not None and type_share < ATEN_FULL_SHARE:
        low.append(f"{precision} holds {type_share:.0%} of its work; the rest runs against other roofs")
    if guessed_ns > (1.0 - ATEN_FULL_SHARE) * modelled_ns:
        low.append(f"{guessed_ns / modelled_ns:.0%} of the modelled time is in calls of unknown element type")
    cands = tuple(dict.fromkeys(c for w, _, _ in modelled if w.precision is None for c in w.candidates))
    n_all = sum(n for _, _, n, _ in calls)
    n_mod = sum(n for _, n, _ in modelled)
    notes = {"aten_calls_per_call": n_all / n_calls, "aten_modelled_calls_per_call": n_mod / n_calls,
             "aten_ops": len(modelled), "aten_modelled_share": share,
             "element_type": precision or "unknown",
             "element_type_basis": "the aten calls with the most "
                                   + ("FLOPs" if flops > 0 else "bytes") + " in the range"}
    if type_share < 1.0:
        notes["element_type_share"] = type_share
    if low:
        notes["aten_sum_confidence"] = "low: " + "; ".join(low)
    return Work(Source.SHAPES, flops=flops / n_calls, bytes=nbytes / n_calls, precision=precision,
                candidates=cands if precision is None else (), bytes_basis="model",
                confidence_cap="low" if low else "medium", notes=notes, parts=len(names),
                time_ns=busy_ns / n_calls,
                detail=f"sum of the {n_mod / n_calls:g} aten calls per call nested in the range that "
                       f"the shape model covers ({len(modelled)} ops by name and input sizes, "
                       f"{share:.0%} of the range's GPU time)")
