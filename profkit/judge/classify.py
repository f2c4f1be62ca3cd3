"""Decide for each op whether it is compute-, memory- or launch-bound, and keep the evidence.

Thresholds are named constants so the README can quote them and tests can pin them. Where the
evidence cannot decide, the verdict is ``unknown`` rather than a guess.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from profkit.judge import comm, grid
from profkit.judge.dtypes import FLOATING
from profkit.judge.evidence import Work
from profkit.run.summary import INDUCTOR_FUSED_RE
from profkit.model import CONFIDENCE, BoundClass, Source
from profkit.read.peaks import Peaks

# Launch-bound when the GPU sits idle for more than this share of a multi-kernel op's span...
IDLE_LAUNCH_FRACTION = 0.5
# ...or when most of the op's kernel time (memsets excluded) is spent in kernels within this
# factor of an empty kernel's time (the launch floor), and the work itself, where known, would
# take less than that floor per kernel.
TINY_KERNEL_FACTOR = 3.0
TINY_BUSY_SHARE = 0.5
# Timeline-only GEMMs: a cuBLAS tile this narrow (the N or M side of nvjet's ``128x8`` or
# ``24x64``) serves a skinny/decode GEMM that streams its weights: memory-bound.
SKINNY_TILE = 32
# GPU-metrics samples: with DRAM and the SMs both below this % of peak, neither bounds the op.
LOW_ACTIVITY_PCT = 20.0
# Achieved-to-roof ratios above this are impossible (the model is wrong). 1.0: no slack.
MAX_PCT_OF_ROOF = 1.0
# ...except within this margin: roofs are measurements (profkit peaks) or datasheet numbers with
# a few percent of run-to-run and clock noise, so an exact count at 102% of a measured roof is
# the roof's error, not the count's. Such readings are shown at 100% with a warning.
ROOF_NOISE = 0.05

GEMM_RE = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|cublas|matmul|\bmm\b|addmm|bmm|linear|"
                     r"conv|cudnn|flash|fmha|attention|sdpa", re.I)
MEMORY_RE = re.compile(r"elementwise|reduce|norm|softmax|copy|memcpy|memset|fill|cat|index|"
                       r"gather|scatter|embedding|transpose|distribution|add|mul", re.I)
# nvjet_sm90_tst_128x8_64x12_...: CTA tile M x N, then K x stages.
_NVJET_TILE = re.compile(r"nvjet_(?:sm\d+_)?[a-z]{3}_(\d+)x(\d+)_")
_XMMA_TILE = re.compile(r"tilesize(\d+)x(\d+)x\d+")
# cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc: CTA tile, then K x stages
_CUTLASS_TILE = re.compile(r"(?:tensorop|simt)_\w*?_(\d+)x(\d+)_\d+x\d+")
# Inductor's fused pointwise/reduction kernels: their names list the ops they fused
# ("triton_poi_fused_add_convolution_relu_4" is the add+ReLU after a convolution, not one).
# Library helper kernels that only move data (cuDNN layout padding/transposes, dtype converts):
# their names carry "cudnn" but they are no GEMM.
HELPER_RE = re.compile(r"Padding|nchwTo|nhwcTo|[Tt]ranspose|convert_|dot_do_o|reorder", re.I)
_CONFIDENCE_ORDER = ["low", "medium", "high"]


@dataclass
class Verdict:
    bound: BoundClass
    confidence: str
    source: Source
    reason: str
    evidence: dict = field(default_factory=dict)
    pct_of_roof: Optional[float] = None    # ideal time / measured time, 0..1 (None: unknown)
    ideal_ns: Optional[float] = None       # roofline time of one call at the peaks used


def compute_roof(work: Optional[Work], peaks: Peaks) -> tuple[str, float]:
    """(roof name, FLOP/s) for the work's precision. Unknown precision: the highest roof among
    the types it may be, so a percentage of it is a lower bound, never an impossible number."""
    if work is None:
        return peaks.compute_peak(None)
    if work.precision is not None:
        return peaks.compute_peak(work.precision)
    cands = [c for c in (work.candidates or FLOATING) if c in peaks.flops]
    if not cands:
        return peaks.compute_peak(None)
    best = max(cands, key=peaks.flops.__getitem__)
    return f"{best} (highest of {'/'.join(cands)}: type unknown)", peaks.flops[best]


def _cap(confidence: str, work: Optional[Work]) -> str:
    if work is None or not work.confidence_cap:
        return confidence
    return min(confidence, work.confidence_cap, key=_CONFIDENCE_ORDER.index)


def _time_of(op: dict, work: Optional[Work]) -> float:
    """The time the counts are divided by: the time they come with (ncu's own duration for ncu
    counts; a range's mean busy time per call for the mean work of its aten calls), else the
    op's median busy time per call."""
    if work is not None and work.time_ns:
        return float(work.time_ns)
    return float(op["busy_median_ns"]) or float(op["gpu_time_median_ns"])


def _rates(work: Work, time_ns: float, peaks: Peaks) -> dict:
    ev: dict = {"source": work.source.value}
    roof_name, peak = compute_roof(work, peaks)
    if work.flops is not None:
        ev["flops_per_call"] = work.flops
        ev["achieved_flops_per_s"] = work.flops / time_ns * 1e9 if time_ns else None
        ev["pct_of_compute_roof"] = (ev["achieved_flops_per_s"] or 0) / peak
        ev["compute_roof"] = roof_name
    if work.bytes is not None:
        ev["bytes_per_call"] = work.bytes
        ev["achieved_bytes_per_s"] = work.bytes / time_ns * 1e9 if time_ns else None
        if not work.host_link:
            ev["pct_of_memory_roof"] = (ev["achieved_bytes_per_s"] or 0) / peaks.memory_bandwidth
    if work.flops is not None and work.bytes:
        ev["arithmetic_intensity"] = work.flops / work.bytes
        ev["ridge_point"] = peak / peaks.memory_bandwidth
    if work.dram_pct is not None:
        key = "gpu_metrics_dram_pct" if work.source is Source.GPU_METRICS else "ncu_dram_throughput_pct"
        ev[key] = work.dram_pct
    if work.sm_pct is not None:
        key = "gpu_metrics_sm_pct" if work.source is Source.GPU_METRICS else "ncu_sm_throughput_pct"
        ev[key] = work.sm_pct
    if work.tensor_pct is not None:
        ev["gpu_metrics_tensor_active_pct"] = work.tensor_pct
    ev["precision"] = work.precision or "unknown"
    ev.update(work.notes)
    if work.detail:
        ev["detail"] = work.detail
    if work.warnings:
        ev["warnings"] = list(work.warnings)
    return ev


def ideal_time_ns(work: Optional[Work], peaks: Peaks) -> Optional[float]:
    """Roofline time of one call: the larger of compute time and memory time at the peaks."""
    if work is None or work.host_link or (work.flops is None and work.bytes is None):
        return None
    t_c = (work.flops or 0.0) / compute_roof(work, peaks)[1]
    t_m = (work.bytes or 0.0) / peaks.memory_bandwidth
    return max(t_c, t_m) * 1e9


_PCT_KEYS = ("pct_of_roof", "pct_of_memory_roof", "pct_of_compute_roof")


def above_roof(verdict: Verdict, slack: float = 0.0) -> list[str]:
    """The evidence numbers of ``verdict`` above 100% (+ ``slack``) of the roof they are
    compared with."""
    ev = verdict.evidence
    out = []
    for key in _PCT_KEYS:
        v = verdict.pct_of_roof if key == "pct_of_roof" else ev.get(key)
        if v is not None and v == v and v > MAX_PCT_OF_ROOF + slack:
            out.append(f"{key.replace('_', ' ')} {v:.0%}")
    for key in ("ncu_dram_throughput_pct", "ncu_sm_throughput_pct", "gpu_metrics_dram_pct",
                "gpu_metrics_sm_pct", "gpu_metrics_tensor_active_pct"):
        v = ev.get(key)
        if v is not None and v == v and v > 100.0 * MAX_PCT_OF_ROOF:
            out.append(f"{key} {v:.0f}%")
    return out


def launch_stats(member_acts: pd.DataFrame, floor_ns: float) -> dict:
    """Time-weighted launch evidence of one op's GPU activities (memsets and copies excluded:
    a tiny memset beside a long kernel says nothing about launches).

    ``tiny_kernel_busy_share``: share of the op's kernel time in kernels shorter than
    TINY_KERNEL_FACTOR x the launch floor; ``tiny_kernel_count_share``: the same by count.
    """
    if member_acts is None or member_acts.empty:
        return {}
    k = member_acts[member_acts["kind"] == "kernel"]
    return kernel_launch_stats((k["end"] - k["start"]).to_numpy(dtype=float), floor_ns)


def kernel_launch_stats(dur: np.ndarray, floor_ns: float) -> dict:
    """:func:`launch_stats` from the durations of an op's kernels (ns, at least one activity)."""
    if not len(dur):
        return {"tiny_kernel_busy_share": None, "tiny_kernel_count_share": None}
    tiny = dur < TINY_KERNEL_FACTOR * floor_ns
    total = float(dur.sum())
    return {"tiny_kernel_busy_share": float(dur[tiny].sum() / total) if total > 0 else 1.0,
            "tiny_kernel_count_share": float(tiny.mean()),
            "kernel_median_ns_no_memset": float(np.median(dur))}


def gemm_shape_hint(kernel_names: list[str]) -> Optional[str]:
    """'skinny' when a GEMM kernel's CTA tile has a side of at most SKINNY_TILE (cuBLAS picks
    such tiles for decode/skinny GEMMs, which stream their weights), 'large' for wide tiles,
    None when no name shows a tile."""
    tiles = []
    for n in kernel_names:
        m = _NVJET_TILE.search(n) or _XMMA_TILE.search(n) or _CUTLASS_TILE.search(n)
        if m:
            tiles.append((int(m.group(1)), int(m.group(2))))
    if not tiles:
        return None
    if all(min(t) <= SKINNY_TILE for t in tiles):
        return "skinny"
    if all(min(t) >= 64 for t in tiles):
        return "large"
    return None


def classify_op(op: dict, work: Optional[Work], peaks: Peaks, kernel_names: list[str]) -> Verdict:
    """``op`` is one row of ops.group_ops(...).ops as a dict (with its name under ``name``);
    ``tiny_kernel_busy_share`` (see :func:`launch_stats`) in it makes the launch rule time-weighted."""
    nccl = comm.verdict_parts(op, work, kernel_names)  # NCCL collectives: their own class
    if nccl is not None:
        return Verdict(BoundClass.COMMUNICATION, nccl["confidence"], work.source if work else
                       Source.TIMELINE, nccl["reason"], nccl["evidence"])
    time_ns = _time_of(op, work)
    kpc = float(op["kernels_per_call"])
    kmed = float(op.get("kernel_median_ns_no_memset") or op["kernel_median_ns"])
    floor = peaks.launch_floor_ns
    tiny_share = op.get("tiny_kernel_busy_share")
    base = {"gpu_busy_fraction": float(op["busy_fraction"]), "kernels_per_call": kpc,
            "median_kernel_ns": kmed, "launch_floor_ns": floor}
    if tiny_share is not None:
        base["tiny_kernel_busy_share"] = float(tiny_share)
    ideal = ideal_time_ns(work, peaks)
    ev = {**base, **(_rates(work, time_ns, peaks) if work else {"source": Source.TIMELINE.value})}
    source = work.source if work else Source.TIMELINE
    pct = ideal / time_ns if (ideal is not None and time_ns) else None
    if pct is not None:
        ev["pct_of_roof"] = pct
    conf = lambda c: _cap(c, work)

    small = op.get("small_grid_share")
    if small is not None and small == small and small >= grid.MIN_OP_SHARE:
        # The trace's launch dimensions are exact: a long kernel on a few blocks leaves most SMs
        # idle whatever its bytes and FLOPs, so no roof tells its time.
        blocks, sm = int(op["small_grid_blocks"]), int(op["sm_count"])
        ev.update({"small_grid_share": float(small), "small_grid_blocks": blocks, "sm_count": sm})
        return Verdict(BoundClass.LATENCY, "high", source,
                       f"{small:.0%} of its kernel time on {blocks} block(s) of the GPU's {sm} SMs "
                       f"(launch dimensions): most of the GPU idles while they run", ev, pct, ideal)
    idle = 1.0 - float(op["busy_fraction"])
    if kpc >= 2 and idle > IDLE_LAUNCH_FRACTION:
        return Verdict(BoundClass.LAUNCH, conf(CONFIDENCE[Source.TIMELINE] if work is None else "high"),
                       source, f"GPU idle {idle:.0%} of the op's span between {kpc:.0f} kernels",
                       ev, pct, ideal)
    if tiny_share is not None:
        tiny = tiny_share >= TINY_BUSY_SHARE
    else:
        tiny = kmed < TINY_KERNEL_FACTOR * floor
    work_is_tiny = ideal is None or ideal < floor * max(kpc, 1.0)
    is_copy = work is not None and work.source is Source.COPY
    if tiny and work_is_tiny and not is_copy:
        what = (f"{tiny_share:.0%} of its kernel time is in kernels under "
                f"{TINY_KERNEL_FACTOR:g}x the launch floor ({floor / 1e3:.1f} us)"
                if tiny_share is not None else
                f"median kernel {kmed / 1e3:.1f} us is {kmed / floor:.1f}x the launch floor "
                f"({floor / 1e3:.1f} us)")
        return Verdict(BoundClass.LAUNCH, conf("medium" if work is None else "high"), source,
                       f"{what}: the fixed per-kernel cost dominates", ev, pct, ideal)

    # Zero FLOPs is never compute: whatever the SM counters say, a copy or fill moves bytes.
    if work is not None and work.flops == 0 and (work.bytes or work.source is Source.NCU):
        return Verdict(BoundClass.MEMORY, conf(CONFIDENCE[source]), source,
                       "moves bytes and does no arithmetic", ev, pct, ideal)
    # With measured FLOPs and DRAM bytes the roofline decides (below). "SM throughput" mixes
    # load/store and issue activity with arithmetic, so it only decides when bytes are missing.
    if work is not None and work.source in (Source.NCU, Source.GPU_METRICS) \
            and not (work.bytes and work.flops) and work.dram_pct is not None \
            and (work.sm_pct is not None or work.tensor_pct is not None):
        work_sm = work.sm_pct if work.sm_pct is not None else 0.0
        busy = max(work_sm, work.tensor_pct or 0.0)
        bound = BoundClass.MEMORY if work.dram_pct >= busy else BoundClass.COMPUTE
        what = "ncu" if work.source is Source.NCU else "GPU metrics"
        if work.source is Source.GPU_METRICS and max(work.dram_pct, busy) < LOW_ACTIVITY_PCT:
            return Verdict(BoundClass.UNKNOWN, "low", source,
                           f"GPU metrics: DRAM {work.dram_pct:.0f}% and SM {busy:.0f}% of peak: "
                           "neither is busy (latency, synchronisation or a small grid)", ev, pct, ideal)
        if work.source is Source.GPU_METRICS:
            # The measured utilisation of the binding unit is the op's place under its roof.
            pct = min((work.dram_pct if bound is BoundClass.MEMORY else busy) / 100.0, 1.0)
            ideal = pct * time_ns
            ev["pct_of_roof"] = pct
        return Verdict(bound, conf(CONFIDENCE[source]), source,
                       f"{what}: DRAM {work.dram_pct:.0f}% vs SM {busy:.0f}% of peak", ev, pct, ideal)
    if work is not None and work.bytes and work.flops is not None:
        roof_name, peak = compute_roof(work, peaks)
        ai, ridge = work.flops / work.bytes, peak / peaks.memory_bandwidth
        bound = BoundClass.MEMORY if ai < ridge else BoundClass.COMPUTE
        side = "below" if bound is BoundClass.MEMORY else "above"
        counters = (f" (ncu: DRAM {work.dram_pct:.0f}%, SM {work.sm_pct:.0f}% of peak)"
                    if work.dram_pct is not None and work.sm_pct is not None else "")
        return Verdict(bound, conf(CONFIDENCE[source]), source,
                       f"intensity {ai:.3g} FLOP/B {side} the {roof_name} "
                       f"ridge point {ridge:.3g} FLOP/B{counters}", ev, pct, ideal)
    if work is not None and work.flops and not work.bytes:
        return Verdict(BoundClass.COMPUTE, "low", source, "FLOPs known, bytes unknown", ev, pct, ideal)

    text = " ".join([str(op["name"])] + kernel_names)
    if kernel_names and all(HELPER_RE.search(n) for n in kernel_names):
        return Verdict(BoundClass.MEMORY, "low", Source.TIMELINE,
                       "library data-movement helper kernels (padding, layout, convert; timeline "
                       "only)", ev)
    if kernel_names and all(INDUCTOR_FUSED_RE.match(n) for n in kernel_names):
        return Verdict(BoundClass.MEMORY, "low", Source.TIMELINE,
                       "Inductor fused pointwise/reduction kernels (timeline only)", ev)
    if GEMM_RE.search(text):
        shape = gemm_shape_hint(kernel_names)
        if shape == "skinny":
            return Verdict(BoundClass.MEMORY, "low", Source.TIMELINE,
                           f"GEMM kernel tiles with a side of at most {SKINNY_TILE} (a skinny/decode "
                           "GEMM streams its weights; timeline only)", ev)
        if shape == "large":
            return Verdict(BoundClass.COMPUTE, "low", Source.TIMELINE,
                           "GEMM kernels with wide tiles (64 or more on both sides; timeline only)",
                           ev)
        return Verdict(BoundClass.UNKNOWN, "low", Source.TIMELINE,
                       "GEMM/convolution/attention kernels, but no work counts or tile shapes to "
                       "tell a large one (compute) from a skinny one (memory): capture with --aten "
                       "or --ncu", ev)
    why = ("kernel names of an elementwise/reduction/copy family (timeline only)"
           if MEMORY_RE.search(text) else "no work counts; most non-GEMM kernels are memory-bound "
           "(timeline only): capture with --ncu or --aten for a firmer verdict")
    return Verdict(BoundClass.MEMORY, "low", Source.TIMELINE, why, ev)


def judge(op: dict, candidates: list, peaks: Peaks, kernel_names: list[str]
          ) -> tuple[Verdict, Optional[Work]]:
    """Classify with the first evidence source whose numbers are possible.

    ``candidates``: Work objects or zero-argument callables returning one (or None), best source
    first. A reading above 100% of the roof it is compared with means that model is wrong for
    this op (a wrong element type, an L2-resident working set against the HBM roof, a non-causal
    count for causal attention): its lower reading (``Work.fallback``) is tried, then the next
    source, and the op's evidence keeps a warning naming what was dropped and why.
    """
    warnings: list[str] = []
    for cand in candidates:
        work = cand() if callable(cand) else cand
        while work is not None:
            verdict = classify_op(op, work, peaks, kernel_names)
            bad = above_roof(verdict, ROOF_NOISE)
            if not bad:
                noisy = above_roof(verdict)
                if noisy:
                    # within the roof's own noise: clamp to 100% and say so
                    warnings.append(f"{', '.join(noisy)} of a roof is within its {ROOF_NOISE:.0%} "
                                    "measurement noise: shown as 100% (the roof is a little low)")
                    for key in _PCT_KEYS:
                        if verdict.evidence.get(key) is not None and verdict.evidence[key] > 1.0:
                            verdict.evidence[key] = 1.0
                    if verdict.pct_of_roof is not None and verdict.pct_of_roof > 1.0:
                        verdict.pct_of_roof = 1.0
                if warnings:
                    verdict.evidence["warnings"] = warnings + verdict.evidence.get("warnings", [])
                    work.warnings = warnings + work.warnings
                return verdict, work
            warnings.append(f"{work.source.value} evidence dropped: {', '.join(bad)} is impossible, "
                            f"so its count or its roof is wrong for this op ({work.detail or 'model'})")
            work = work.fallback
    verdict = classify_op(op, None, peaks, kernel_names)
    if warnings:
        verdict.evidence["warnings"] = warnings
    return verdict, None
