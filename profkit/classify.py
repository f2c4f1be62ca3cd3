"""Decide for each op whether it is compute-, memory- or launch-bound, and keep the evidence.

Thresholds are named constants so the README can quote them and tests can pin them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from profkit import comm
from profkit.evidence import Work
from profkit.model import CONFIDENCE, BoundClass, Source
from profkit.peaks import Peaks

# Launch-bound when the GPU sits idle for more than this share of a multi-kernel op's span...
IDLE_LAUNCH_FRACTION = 0.5
# ...or when the median kernel is within this factor of an empty kernel's time (the launch floor)
# and the work itself, where known, would take less than that floor per kernel.
TINY_KERNEL_FACTOR = 3.0

GEMM_RE = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|cublas|matmul|\bmm\b|addmm|bmm|linear|"
                     r"conv|cudnn|flash|fmha|attention|sdpa", re.I)
MEMORY_RE = re.compile(r"elementwise|reduce|norm|softmax|copy|memcpy|memset|fill|cat|index|"
                       r"gather|scatter|embedding|transpose|distribution|add|mul", re.I)


@dataclass
class Verdict:
    bound: BoundClass
    confidence: str
    source: Source
    reason: str
    evidence: dict = field(default_factory=dict)
    pct_of_roof: Optional[float] = None    # ideal time / measured time, 0..1 (None: unknown)
    ideal_ns: Optional[float] = None       # roofline time of one call at the peaks used


def _rates(work: Work, time_ns: float, peaks: Peaks) -> dict:
    ev: dict = {"source": work.source.value}
    prec, peak = peaks.compute_peak(work.precision)
    if work.flops is not None:
        ev["flops_per_call"] = work.flops
        ev["achieved_flops_per_s"] = work.flops / time_ns * 1e9 if time_ns else None
        ev["pct_of_compute_roof"] = (ev["achieved_flops_per_s"] or 0) / peak
        ev["compute_roof"] = prec
    if work.bytes is not None:
        ev["bytes_per_call"] = work.bytes
        ev["achieved_bytes_per_s"] = work.bytes / time_ns * 1e9 if time_ns else None
        if not work.host_link:
            ev["pct_of_memory_roof"] = (ev["achieved_bytes_per_s"] or 0) / peaks.memory_bandwidth
    if work.flops is not None and work.bytes:
        ev["arithmetic_intensity"] = work.flops / work.bytes
        ev["ridge_point"] = peaks.ridge(work.precision)
    if work.dram_pct is not None:
        ev["ncu_dram_throughput_pct"] = work.dram_pct
    if work.sm_pct is not None:
        ev["ncu_sm_throughput_pct"] = work.sm_pct
    if work.detail:
        ev["detail"] = work.detail
    return ev


def ideal_time_ns(work: Optional[Work], peaks: Peaks) -> Optional[float]:
    """Roofline time of one call: the larger of compute time and memory time at the peaks."""
    if work is None or work.host_link or (work.flops is None and work.bytes is None):
        return None
    t_c = (work.flops or 0.0) / peaks.compute_peak(work.precision)[1]
    t_m = (work.bytes or 0.0) / peaks.memory_bandwidth
    return max(t_c, t_m) * 1e9


def classify_op(op: dict, work: Optional[Work], peaks: Peaks, kernel_names: list[str]) -> Verdict:
    """``op`` is one row of ops.group_ops(...).ops as a dict (with its name under ``name``)."""
    nccl = comm.verdict_parts(op, work, kernel_names)  # NCCL collectives: their own class
    if nccl is not None:
        return Verdict(BoundClass.COMMUNICATION, nccl["confidence"], work.source if work else
                       Source.TIMELINE, nccl["reason"], nccl["evidence"])
    time_ns = float(op["busy_median_ns"]) or float(op["gpu_time_median_ns"])
    kpc = float(op["kernels_per_call"])
    kmed = float(op["kernel_median_ns"])
    floor = peaks.launch_floor_ns
    base = {"gpu_busy_fraction": float(op["busy_fraction"]), "kernels_per_call": kpc,
            "median_kernel_ns": kmed, "launch_floor_ns": floor}
    ideal = ideal_time_ns(work, peaks)
    ev = {**base, **(_rates(work, time_ns, peaks) if work else {"source": Source.TIMELINE.value})}
    source = work.source if work else Source.TIMELINE
    pct = ideal / time_ns if (ideal is not None and time_ns) else None
    if pct is not None:
        ev["pct_of_roof"] = pct

    idle = 1.0 - float(op["busy_fraction"])
    if kpc >= 2 and idle > IDLE_LAUNCH_FRACTION:
        return Verdict(BoundClass.LAUNCH, CONFIDENCE[Source.TIMELINE] if work is None else "high",
                       source, f"GPU idle {idle:.0%} of the op's span between {kpc:.0f} kernels",
                       ev, pct, ideal)
    tiny = kmed < TINY_KERNEL_FACTOR * floor
    work_is_tiny = ideal is None or ideal < floor * max(kpc, 1.0)
    is_copy = work is not None and work.source is Source.COPY
    if tiny and work_is_tiny and not is_copy:
        return Verdict(BoundClass.LAUNCH, "medium" if work is None else "high", source,
                       f"median kernel {kmed / 1e3:.1f} us is {kmed / floor:.1f}x the launch floor "
                       f"({floor / 1e3:.1f} us): the fixed per-kernel cost dominates", ev, pct, ideal)

    # With measured FLOPs and DRAM bytes the roofline decides (below). "SM throughput" mixes
    # load/store and issue activity with arithmetic, so it only decides when bytes are missing.
    if work is not None and work.source is Source.NCU and not (work.bytes and work.flops) \
            and work.dram_pct is not None and work.sm_pct is not None:
        bound = BoundClass.MEMORY if work.dram_pct >= work.sm_pct else BoundClass.COMPUTE
        return Verdict(bound, CONFIDENCE[Source.NCU], source,
                       f"ncu: DRAM throughput {work.dram_pct:.0f}% vs SM throughput "
                       f"{work.sm_pct:.0f}% of peak", ev, pct, ideal)
    if work is not None and work.bytes and not work.flops:
        return Verdict(BoundClass.MEMORY, CONFIDENCE[source], source,
                       "moves bytes and does no arithmetic", ev, pct, ideal)
    if work is not None and work.bytes and work.flops is not None:
        ai, ridge = work.flops / work.bytes, peaks.ridge(work.precision)
        bound = BoundClass.MEMORY if ai < ridge else BoundClass.COMPUTE
        side = "below" if bound is BoundClass.MEMORY else "above"
        counters = (f" (ncu: DRAM {work.dram_pct:.0f}%, SM {work.sm_pct:.0f}% of peak)"
                    if work.dram_pct is not None and work.sm_pct is not None else "")
        return Verdict(bound, CONFIDENCE[source], source,
                       f"intensity {ai:.3g} FLOP/B {side} the {peaks.compute_peak(work.precision)[0]} "
                       f"ridge point {ridge:.3g} FLOP/B{counters}", ev, pct, ideal)
    if work is not None and work.flops and not work.bytes:
        return Verdict(BoundClass.COMPUTE, "low", source, "FLOPs known, bytes unknown", ev, pct, ideal)

    text = " ".join([str(op["name"])] + kernel_names)
    if GEMM_RE.search(text):
        return Verdict(BoundClass.COMPUTE, "low", Source.TIMELINE,
                       "kernel names of a GEMM/convolution/attention family (timeline only)", ev)
    why = ("kernel names of an elementwise/reduction/copy family (timeline only)"
           if MEMORY_RE.search(text) else "no work counts; most non-GEMM kernels are memory-bound "
           "(timeline only): capture with --ncu or --aten for a firmer verdict")
    return Verdict(BoundClass.MEMORY, "low", Source.TIMELINE, why, ev)
