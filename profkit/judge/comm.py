"""Communication: NCCL collectives as their own kind of op — time, bytes, bus bandwidth, exposed time.

A GPU activity is a collective when its kernel name starts with ``ncclDevKernel_`` (NCCL >= 2.19)
or ``ncclKernel_`` (older NCCL); the word after the prefix names it (AllReduce, AllGather,
ReduceScatter, Broadcast, Reduce, SendRecv, ...).

Per collective kernel name, :func:`analyze` reports:

- ``gpu_time_ns``: the kernels' summed duration. A collective kernel starts when its stream
  reaches it and ends when every peer has done its part, so this includes the time spent waiting
  for late ranks: a straggler shows up as *long* collectives on the other ranks.
- ``bytes``: the message size per call where the trace says it: an NVTX range around the launch
  carrying a ``{bytes=N}`` hint (``profkit.annotate`` or the DDP comm hook in
  ``scripts/workloads/ddp_step.py``). NCCL's own NVTX ranges (domain ``NCCL``) do carry the size
  in a binary payload, but ``nsys export --type sqlite`` (2025.3) leaves that payload out, so it
  is not read. With no hint the bytes are *unknown* and so is the bandwidth; the report says so.
- ``algbw`` = bytes / time and ``busbw`` = algbw x the NCCL-tests factor for ``n`` ranks
  (AllReduce 2(n-1)/n; AllGather, ReduceScatter, AlltoAll (n-1)/n; Broadcast, Reduce, SendRecv 1),
  compared with the GPU's link peak from :data:`LINK_PEAKS` (per direction, per GPU). Since the
  time includes waiting, the bandwidth is a lower bound on what the link delivered.
- ``exposed_ns``: the part of each collective's time not overlapped by any compute kernel (any
  non-NCCL kernel on the same device, on another stream). Computed with sorted sweeps: the union
  of compute intervals per device, then for each collective interval the covered length from
  prefix sums (O((n + m) log m), no Python loop over kernels).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from profkit.read.hints import parse_range_name
from profkit.run.attribution import activity_pairs

NCCL_KERNEL_RE = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_(?P<coll>[A-Za-z]+)")
# Op names (NVTX ranges, aten/c10d ops, NCCL's own ranges) that name a collective.
COLLECTIVE_NAME_RE = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|send_?recv|nccl|c10d::", re.I)

# Link peak per direction per GPU, bytes/s (datasheets). Multi-node jobs are bound by the
# network (e.g. 50 GB/s per 400 Gb/s NIC) instead: pass ``link_peak=`` to override.
LINK_PEAKS: list[tuple[str, str, float]] = [
    (r"H100.*PCIe", "PCIe Gen5 x16", 64e9),
    (r"H100|H200|H800|GH200", "NVLink 4 (18 links)", 450e9),
    (r"B200|B100|GB200|B300|GB300", "NVLink 5 (18 links)", 900e9),
    (r"A100.*PCIe", "PCIe Gen4 x16", 32e9),
    (r"A100|A800", "NVLink 3 (12 links)", 300e9),
    (r"V100", "NVLink 2 (6 links)", 150e9),
    (r"L40|L4\b|RTX|A10\b|T4", "PCIe Gen4 x16", 32e9),
]

# NCCL-tests bus-bandwidth factors (docs/PERFORMANCE.md of nccl-tests), n = ranks.
_BUS_FACTOR = {
    "AllReduce": lambda n: 2.0 * (n - 1) / n,
    "AllGather": lambda n: (n - 1) / n,
    "ReduceScatter": lambda n: (n - 1) / n,
    "AllToAll": lambda n: (n - 1) / n,
    "Broadcast": lambda n: 1.0,
    "Reduce": lambda n: 1.0,
    "SendRecv": lambda n: 1.0,
}

SMALL_MESSAGE_BYTES = 4 << 20   # below this, a collective is latency-bound: coalesce
SMALL_CALL_NS = 50_000          # ...or when its median call is this short
EXPOSED_HIGH = 0.5              # over half of the collective's time has no compute beside it
EXPOSED_SOME = 0.2              # a fifth or more exposed: worth overlapping better
LOW_BUSBW = 0.5                 # under half the link peak (with big messages): look at NCCL

def is_nccl_kernel(name: str) -> bool:
    return bool(NCCL_KERNEL_RE.match(str(name)))


def collective_of(name: str) -> str:
    """``AllReduce`` for ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)``; ``Generic`` etc. as named."""
    m = NCCL_KERNEL_RE.match(str(name))
    if not m:
        return "unknown"
    coll = m.group("coll")
    return {"AlltoAll": "AllToAll", "Alltoall": "AllToAll"}.get(coll, coll)


def bus_factor(collective: str, n_ranks: Optional[int]) -> Optional[float]:
    if not n_ranks or n_ranks < 1 or collective not in _BUS_FACTOR:
        return None
    return _BUS_FACTOR[collective](n_ranks)


def link_peak(gpu_name: str) -> tuple[Optional[str], Optional[float]]:
    for pat, link, bps in LINK_PEAKS:
        if re.search(pat, gpu_name or ""):
            return link, bps
    return None, None


def communication_op(op_name: str, kernel_names: list[str]) -> Optional[str]:
    """The collective an op is, or None: every kernel is an NCCL kernel, or the op's name names a
    collective and at least one of its kernels is NCCL (a DDP hook range also runs a small scaling
    kernel before its all-reduce)."""
    nccl = [k for k in kernel_names if is_nccl_kernel(k)]
    if not nccl:
        return None
    if len(nccl) == len(kernel_names) or COLLECTIVE_NAME_RE.search(str(op_name)):
        colls = sorted({collective_of(k) for k in nccl})
        return "+".join(colls)
    return None


# -- interval arithmetic ---------------------------------------------------------------------------
def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted disjoint intervals (sorted sweep)."""
    if len(start) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, np.int64)[order], np.asarray(end, np.int64)[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    starts = s[new]
    idx = np.flatnonzero(new)
    ends = reach[np.r_[idx[1:] - 1, len(s) - 1]]  # the reach at a block's last interval is its end
    return starts, ends


def covered(qs: np.ndarray, qe: np.ndarray, us: np.ndarray, ue: np.ndarray) -> np.ndarray:
    """Length of [qs, qe) covered by the disjoint sorted union (us, ue), for every query."""
    qs, qe = np.asarray(qs, np.int64), np.asarray(qe, np.int64)
    if len(us) == 0 or len(qs) == 0:
        return np.zeros(len(qs), np.int64)
    cum = np.concatenate([[0], np.cumsum(ue - us)])

    def upto(t: np.ndarray) -> np.ndarray:  # covered length in (-inf, t)
        i = np.searchsorted(us, t, side="right") - 1
        ok = i >= 0
        ic = np.where(ok, i, 0)
        part = np.clip(np.minimum(t, ue[ic]) - us[ic], 0, None)
        return np.where(ok, cum[ic] + part, 0)

    return np.clip(upto(qe) - upto(qs), 0, None)


def exposed_ns(acts: pd.DataFrame, nccl_mask: np.ndarray) -> np.ndarray:
    """For each activity in ``acts`` flagged by ``nccl_mask``: its time with no compute kernel
    (non-NCCL kernel of the same device) running beside it. Others get 0."""
    out = np.zeros(len(acts), np.int64)
    kind = acts["kind"].astype(str).to_numpy()
    dev = acts["deviceId"].to_numpy()
    s, e = acts["start"].to_numpy(np.int64), acts["end"].to_numpy(np.int64)
    compute = (kind == "kernel") & ~nccl_mask
    for d in np.unique(dev[nccl_mask]):
        q = nccl_mask & (dev == d)
        c = compute & (dev == d)
        us, ue = merge_intervals(s[c], e[c])
        out[q] = (e[q] - s[q]) - covered(s[q], e[q], us, ue)
    return out


# -- per-trace analysis ----------------------------------------------------------------------------
@dataclass
class CommSummary:
    """Communication of one trace: one row per collective kernel name, plus totals."""
    collectives: pd.DataFrame
    comm_time_ns: int = 0
    exposed_ns: int = 0
    compute_busy_ns: int = 0
    link: Optional[str] = None
    link_peak_bytes_per_s: Optional[float] = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"comm_time_ns": int(self.comm_time_ns), "exposed_ns": int(self.exposed_ns),
                "compute_busy_ns": int(self.compute_busy_ns), "link": self.link,
                "link_peak_bytes_per_s": self.link_peak_bytes_per_s, "notes": list(self.notes),
                "collectives": [_row_json(n, r) for n, r in self.collectives.iterrows()]}


COLLECTIVE_COLUMNS = ["collective", "count", "gpu_time_ns", "median_ns", "exposed_ns", "exposed_share",
                      "bytes", "calls_with_bytes", "algbw_bytes_per_s", "busbw_bytes_per_s",
                      "pct_of_link_peak", "action"]


def _row_json(name: str, r: pd.Series) -> dict:
    def num(x):
        if x is None or (isinstance(x, float) and x != x):
            return None
        return int(x) if isinstance(x, (int, np.integer)) or float(x).is_integer() else float(x)
    return {"name": name, "collective": r["collective"], "count": int(r["count"]),
            "gpu_time_ns": num(r["gpu_time_ns"]), "median_ns": num(r["median_ns"]),
            "exposed_ns": num(r["exposed_ns"]), "exposed_share": num(r["exposed_share"]),
            "bytes": num(r["bytes"]), "calls_with_bytes": int(r["calls_with_bytes"]),
            "algbw_bytes_per_s": num(r["algbw_bytes_per_s"]),
            "busbw_bytes_per_s": num(r["busbw_bytes_per_s"]),
            "pct_of_link_peak": num(r["pct_of_link_peak"]), "action": r["action"]}


def hinted_bytes(trace, nccl_idx: np.ndarray) -> pd.Series:
    """Bytes per NCCL kernel from the innermost NVTX range with a ``{bytes=}`` hint around its
    launch; a range instance holding k NCCL kernels gives each bytes/k. Missing: not in the index."""
    ranges = trace.ranges
    if ranges.empty or len(nccl_idx) == 0 or trace.linked_fraction == 0:
        return pd.Series(dtype=float)
    names = ranges["name"]
    hint_bytes = {}
    for n in names.unique():
        _, h = parse_range_name(str(n))
        if h is not None and h.bytes is not None:
            hint_bytes[n] = h.bytes
    if not hint_bytes:
        return pd.Series(dtype=float)
    pairs = activity_pairs(trace, "range")
    pairs = pairs[pairs["act_idx"].isin(nccl_idx)]
    rn = ranges["name"].to_numpy()[pairs["range_idx"].to_numpy()]
    keep = pd.Series(rn).isin(hint_bytes.keys()).to_numpy()
    p = pairs[keep].assign(
        r_start=ranges["start"].to_numpy()[pairs["range_idx"].to_numpy()[keep]],
        r_len=(ranges["end"] - ranges["start"]).to_numpy()[pairs["range_idx"].to_numpy()[keep]])
    if p.empty:
        return pd.Series(dtype=float)
    p = p.sort_values(["act_idx", "r_start", "r_len"], ascending=[True, False, True], kind="stable")
    p = p.drop_duplicates("act_idx")
    per_inst = p.groupby("range_idx")["act_idx"].transform("size")
    b = ranges["name"].to_numpy()[p["range_idx"].to_numpy()]
    vals = np.array([hint_bytes[x] for x in b], dtype=float) / per_inst.to_numpy()
    return pd.Series(vals, index=p["act_idx"].to_numpy())


def suggest(collective: str, count: int, median_ns: float, exposed_share: Optional[float],
            bytes_per_call: Optional[float], pct_of_peak: Optional[float]) -> str:
    """The next step for a collective, from its exposure, message size and bandwidth."""
    tips = []
    if exposed_share is not None and exposed_share >= EXPOSED_SOME:
        most = "most of it" if exposed_share >= EXPOSED_HIGH else "part of it"
        tips.append(f"{exposed_share:.0%} of its time has no compute beside it ({most} is exposed): "
                    "overlap it with compute (DDP overlaps gradient buckets with backward by default "
                    "— avoid sync points and find_unused_parameters; FSDP: forward/backward prefetch)")
    small = (bytes_per_call is not None and bytes_per_call < SMALL_MESSAGE_BYTES) or \
        (bytes_per_call is None and median_ns < SMALL_CALL_NS)
    if small and count >= 4:
        size = f"{bytes_per_call / 1e6:.2f} MB" if bytes_per_call is not None else \
            f"{median_ns / 1e3:.0f} us"
        tips.append(f"{count} small calls ({size} median): fewer, larger collectives — raise DDP "
                    "bucket_cap_mb or coalesce tensors before communicating")
    if pct_of_peak is not None and pct_of_peak < LOW_BUSBW and not small:
        tips.append(f"bus bandwidth at {pct_of_peak:.0%} of the link peak (a lower bound: the time "
                    "includes waiting for peers): check that ranks reach it together, the topology "
                    "(nvidia-smi topo -m) and NCCL_ALGO/NCCL_PROTO")
    if not tips:
        tips.append("hidden behind compute and near the link peak: to go further, send fewer bytes "
                    "(bf16 gradient compression hook) or sync less often")
    return "; ".join(tips)


def analyze(trace, n_ranks: Optional[int] = None, gpu_name: Optional[str] = None,
            link_peak_bytes_per_s: Optional[float] = None) -> CommSummary:
    """Collectives of one trace (see the module docstring). ``n_ranks``: the communicator size,
    for bus bandwidth (None: unknown, busbw left out)."""
    acts = trace.activities
    names = acts["name"].to_numpy()
    uniq = pd.unique(names)
    is_n = {n: is_nccl_kernel(n) for n in uniq}
    mask = np.array([is_n[n] for n in names], dtype=bool) if len(names) else np.zeros(0, bool)
    gpu = gpu_name if gpu_name is not None else trace.primary_gpu().name
    link, peak = link_peak(gpu)
    if link_peak_bytes_per_s is not None:
        link, peak = "given", link_peak_bytes_per_s
    kern = (acts["kind"].astype(str) == "kernel").to_numpy() & ~mask
    a_k = acts[kern].sort_values(["deviceId", "start"], kind="stable")
    from profkit.read.intervals import busy_union
    compute_busy = int(busy_union(a_k["deviceId"].to_numpy(), a_k["start"].to_numpy(),
                                  a_k["end"].to_numpy()).sum()) if len(a_k) else 0
    notes = []
    if not mask.any():
        return CommSummary(pd.DataFrame(columns=COLLECTIVE_COLUMNS), 0, 0, compute_busy, link, peak,
                           ["no NCCL kernels in this trace"])
    exp = exposed_ns(acts, mask)
    idx = np.flatnonzero(mask)
    sub = acts.iloc[idx]
    dur = (sub["end"] - sub["start"]).to_numpy(np.int64)
    b = hinted_bytes(trace, acts.index.to_numpy()[idx])
    byts = pd.Series(acts.index.to_numpy()[idx]).map(b).to_numpy(dtype=float)
    key = pd.Series(sub["name"].to_numpy()).map(lambda n: str(n).split("(")[0])
    df = pd.DataFrame({"name": key.to_numpy(), "dur": dur, "exp": exp[idx], "bytes": byts})
    df["dur_b"] = np.where(np.isnan(byts), 0, dur)
    g = df.groupby("name", sort=False)
    out = pd.DataFrame({
        "count": g.size(), "gpu_time_ns": g["dur"].sum(), "median_ns": g["dur"].median(),
        "exposed_ns": g["exp"].sum(), "bytes": g["bytes"].sum(min_count=1),
        "calls_with_bytes": g["bytes"].count(), "dur_b": g["dur_b"].sum(),
        "bytes_median": g["bytes"].median()})
    out["collective"] = [collective_of(n) for n in out.index]
    out["exposed_share"] = out["exposed_ns"] / out["gpu_time_ns"].where(out["gpu_time_ns"] > 0)
    out["algbw_bytes_per_s"] = out["bytes"] / out["dur_b"].where(out["dur_b"] > 0) * 1e9
    fac = [bus_factor(c, n_ranks) for c in out["collective"]]
    out["busbw_bytes_per_s"] = [a * f if (f is not None and a == a) else np.nan
                                for a, f in zip(out["algbw_bytes_per_s"], fac)]
    out["pct_of_link_peak"] = out["busbw_bytes_per_s"] / peak if peak else np.nan
    out["action"] = [suggest(r.collective, int(r.count), float(r.median_ns),
                             None if r.exposed_share != r.exposed_share else float(r.exposed_share),
                             None if r.bytes_median != r.bytes_median else float(r.bytes_median),
                             None if r.pct_of_link_peak != r.pct_of_link_peak else float(r.pct_of_link_peak))
                     for r in out.itertuples()]
    out = out.sort_values("gpu_time_ns", ascending=False, kind="stable")
    out.index.name = "name"
    if int(out["calls_with_bytes"].sum()) < int(out["count"].sum()):
        notes.append("bytes unknown for some collectives (no {bytes=} NVTX hint around their launch; "
                     "NCCL's own payload is not in the SQLite export): their bandwidth is not reported")
    if n_ranks is None:
        notes.append("communicator size unknown: bus bandwidth not reported (classify several ranks)")
    if peak is None:
        notes.append(f"no link peak known for {gpu!r}")
    return CommSummary(out[COLLECTIVE_COLUMNS], int(dur.sum()), int(exp[idx].sum()), compute_busy,
                       link, peak, notes)


# -- single-trace verdicts (used by classify.classify_op and advisor._choose) ----------------------
def verdict_parts(op: dict, work, kernel_names: list[str]) -> Optional[dict]:
    """Reason, evidence and confidence for an op that is a collective; None if it is not one."""
    coll = communication_op(str(op["name"]), kernel_names)
    if coll is None:
        return None
    time_ns = float(op.get("busy_median_ns") or 0) or float(op["gpu_time_median_ns"])
    ev = {"source": work.source.value if work is not None else "timeline", "collective": coll,
          "median_call_ns": time_ns, "kernels_per_call": float(op["kernels_per_call"])}
    bytes_ = work.bytes if work is not None else None
    if bytes_:
        ev["bytes_per_call"] = bytes_
        ev["algbw_bytes_per_s"] = bytes_ / time_ns * 1e9 if time_ns else None
        reason = (f"NCCL {coll}: {bytes_ / 1e6:.3g} MB per call at "
                  f"{(ev['algbw_bytes_per_s'] or 0) / 1e9:.3g} GB/s algorithm bandwidth")
    else:
        reason = f"NCCL {coll} kernels (bytes unknown: no {{bytes=}} hint on the range)"
    return {"collective": coll, "reason": reason, "evidence": ev, "confidence": "high"}


def advice_parts(op: dict, verdict) -> tuple[str, float, str]:
    """(action, op speedup, basis) for a communication op of one trace, where exposure is unknown."""
    ev = verdict.evidence
    count, med = int(op["count"]), float(ev.get("median_call_ns") or op["gpu_time_median_ns"])
    b = ev.get("bytes_per_call")
    small = (b is not None and b < SMALL_MESSAGE_BYTES) or (b is None and med < SMALL_CALL_NS)
    tips = ["overlap it with compute (DDP overlaps gradient buckets with backward; avoid sync points "
            "in backward; FSDP: prefetch)"]
    if small and count >= 4:
        tips.insert(0, f"{count} small calls: fewer, larger collectives (raise DDP bucket_cap_mb, "
                       "coalesce tensors)")
    else:
        tips.append("send fewer bytes (bf16 gradient compression hook) or sync less often")
    return ("; ".join(tips), 1.0, "communication: the gain is its exposed (un-overlapped) time, "
                                  "which `profkit classify` on all ranks reports")
