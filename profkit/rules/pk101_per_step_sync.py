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
    ``wall / max(GPU floor, wall - blocked in syncs)`` when the GPU floor is at least the CPU's
    own time; 1.0 otherwise (CPU-paced: measured on sync_loop -> sync_loop_nosync, 6.13 ->
    7.04 ms per step, the bound 1.11x was wrong).
References
    PyTorch performance tuning guide, "Avoid unnecessary CPU-GPU synchronization";
    Nsight Systems ``nsys analyze`` rule ``cuda_api_sync``.
"""
from __future__ import annotations

from profkit.model import Rung
from profkit.rules.base import Finding, Param, RuleContext, RuleMeta, Table, speedup

RULE = RuleMeta(
    code="PK101", name="per-step-sync",
    summary="a sync every step drains the GPU queue: remove it only when the GPU work sets the step",
    tables=(Table.RUNTIME, Table.KERNEL), example="traces/real/sync_loop.sqlite",
    quiet_on="traces/real/sync_loop_nosync.sqlite",
    params=(Param("min_idle_share", 0.05, "GPU idle after syncs, as a share of the wall time"),))


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
    if gpu_floor >= cpu_own:
        return [Finding(RULE.code, RULE.name,
                        "remove the per-step synchronisation (`.item()`, `.cpu()`, printing a GPU "
                        "tensor, cudaStreamSynchronize): keep values on the GPU and read them every "
                        "N steps", Rung.LIBRARY, ev, bound, formula, bound)]
    # CPU-paced: the CPU's own work is longer than the GPU's, so the sync is not what the step
    # waits on. The formula's bound stays in the basis; the expectation is no gain.
    return [Finding(RULE.code, RULE.name,
                    f"leave the per-step sync for now: the CPU's own work "
                    f"({ctx.per_iteration(cpu_own)}) is longer than the GPU's "
                    f"({ctx.per_iteration(gpu_floor)}), so the CPU sets the pace with or without "
                    "it; cut the CPU work per step first", Rung.NONE, ev, 1.0,
                    f"CPU-paced: 1.0 (at most {bound:.2f}x = {formula})", bound)]
