"""PK101 per-step-sync: a synchronising call every step drains the GPU's queue.

What
    The CPU blocks in a synchronising call (``loss.item()``, ``.cpu()``, printing a GPU tensor,
    ``cudaStreamSynchronize``, a synchronous device-to-host copy) and the GPU then idles while
    the CPU does the work that follows it.
Why
    Without the sync the CPU runs ahead and its work overlaps the GPU's. That only pays when
    the sync is what the step waits on: when the GPU's work per step is at least as long as the
    CPU's own work. When the CPU's own work is longer (launches, Python, bookkeeping), the CPU
    sets the pace either way, and removing the sync gains nothing.
Evidence
    ``idle_sync`` of the run breakdown (GPU idle after a sync drained the queue), the time the
    CPU sat blocked in synchronising calls, the GPU floor (busy + GPU-side gaps) and the CPU's
    own time (wall - blocked).
Fix
    Keep values on the GPU and read them every N steps (accumulate the loss in a tensor); use
    ``non_blocking=True`` copies into pinned memory and an event for the few values needed.
Expected gain
    Per iteration: the GPU floor (busy + its share of the GPU-side gaps) and the CPU's own time
    (the iteration minus its time blocked in syncs). When the median GPU floor is at least the
    median CPU time, ``median iteration / median GPU floor``; 1.0 otherwise (CPU-paced:
    measured on sync_loop -> sync_loop_nosync, 6.13 -> 7.04 ms per step, the bound 1.11x was
    wrong). Medians, not window totals: one-off CPU work in one iteration (the allocator's
    cudaMalloc calls, 2.0 ms in ddp2's first window iteration) made the 2-GPU DDP step look
    CPU-paced over the window (39.5 ms CPU against a 37.6 ms GPU floor) while each steady
    iteration is GPU-paced (6.7 ms CPU against 7.4 ms GPU). ``bound`` keeps the window formula
    ``wall / max(GPU floor, wall - blocked in syncs)``.
References
    PyTorch performance tuning guide, "Avoid unnecessary CPU-GPU synchronization";
    Nsight Systems ``nsys analyze`` rule ``cuda_api_sync``.
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import (Finding, Param, RuleContext, RuleMeta, Table, covered_per_interval,
                                iteration_bounds, speedup)
from profkit.run.summary import sync_intervals

RULE = RuleMeta(
    code="PK101", name="per-step-sync",
    summary="a sync every step drains the GPU queue: remove it only when the GPU work sets the step",
    tables=(Table.RUNTIME, Table.KERNEL), example="traces/real/sync_loop.sqlite.xz",
    quiet_on="traces/real/sync_loop_nosync.sqlite.xz",
    # 3%: on the 2-GPU DDP step, 4-5% of idle after the per-step sync was worth 1.047x when the
    # sync went (30-step captures, diff's verdict "improvement"); 5% kept the rule quiet there.
    params=(Param("min_idle_share", 0.03, "GPU idle after syncs, as a share of the wall time"),))


def per_iteration(ctx: RuleContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per iteration: its length, its GPU floor (busy + its share of the GPU-side gaps) and the
    CPU's own time (the iteration minus its time blocked in syncs)."""
    r = ctx.run
    bounds = iteration_bounds(r)
    lengths = np.diff(bounds).astype(float)
    a = ctx.prof.trace.activities
    a = a[(a["deviceId"] == r.device) & (a["end"] > bounds[0]) & (a["start"] < bounds[-1])]
    busy = covered_per_interval(a["start"].to_numpy(np.int64), a["end"].to_numpy(np.int64), bounds)
    floor = busy + r.breakdown["idle_other"] * lengths / max(ctx.wall_ns, 1.0)
    ss, se = sync_intervals(ctx.prof.full_trace)  # read once, shared with the run summary
    cpu = lengths - covered_per_interval(np.asarray(ss, np.int64), np.asarray(se, np.int64), bounds)
    return lengths, floor, cpu


def detect(ctx: RuleContext) -> list[Finding]:
    r = ctx.run
    wall = ctx.wall_ns
    b = r.breakdown
    if b["idle_sync"] <= RULE.param("min_idle_share") * wall:
        return []
    gpu_floor = float(r.gpu_busy_ns + b["idle_other"])
    cpu_own = ctx.host_floor_ns
    bound = speedup(wall, max(gpu_floor, wall - r.sync_blocked_ns))
    ev = {"idle_sync_ns": int(b["idle_sync"]), "sync_blocked_ns": int(r.sync_blocked_ns),
          "gpu_floor_ns": int(gpu_floor), "cpu_own_ns": int(cpu_own)}
    formula = (f"wall / max(GPU busy + GPU-side gaps {gpu_floor / 1e6:.1f} ms, wall - blocked in "
               f"syncs {r.sync_blocked_ns / 1e6:.1f} ms)")
    if ctx.iterations >= 2:
        lengths, floors, cpus = per_iteration(ctx)
        it, gpu_it, cpu_it = (float(np.median(x)) for x in (lengths, floors, cpus))
        ev.update(iteration_median_ns=int(it), gpu_floor_ns_per_iteration=int(gpu_it),
                  cpu_own_ns_per_iteration=int(cpu_it))
        paced_by_gpu = gpu_it >= cpu_it
        gain = min(speedup(it, max(gpu_it, cpu_it)), bound)
        basis = (f"median iteration {it / 1e6:.2f} ms / max(median GPU floor {gpu_it / 1e6:.2f} ms, "
                 f"median CPU time outside syncs {cpu_it / 1e6:.2f} ms) (window: at most "
                 f"{bound:.2f}x = {formula})")
        cpu_txt, gpu_txt = f"{cpu_it / 1e6:.2f} ms per iteration", f"{gpu_it / 1e6:.2f} ms per iteration"
    else:
        paced_by_gpu = gpu_floor >= cpu_own
        gain, basis = bound, formula
        cpu_txt, gpu_txt = ctx.per_iteration(cpu_own), ctx.per_iteration(gpu_floor)
    if paced_by_gpu:
        return [Finding(RULE.code, RULE.name,
                        "remove the per-step synchronisation (`.item()`, `.cpu()`, printing a GPU "
                        "tensor, cudaStreamSynchronize): keep values on the GPU and read them every "
                        "N steps", Rung.LIBRARY, ev, gain, basis, bound)]
    # CPU-paced: the CPU's own work is longer than the GPU's, so the sync is not what the step
    # waits on. The formula's bound stays in the basis; the expectation is no gain.
    return [Finding(RULE.code, RULE.name,
                    f"leave the per-step sync for now: the CPU's own work ({cpu_txt}) is longer "
                    f"than the GPU's ({gpu_txt}), so the CPU sets the pace with or without "
                    "it; cut the CPU work per step first", Rung.NONE, ev, 1.0,
                    f"CPU-paced: 1.0 ({basis if basis != formula else f'at most {bound:.2f}x = {formula}'})",
                    bound)]
