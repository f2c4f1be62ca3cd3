"""PK104 pageable-copy: host-to-device copies from pageable memory block the CPU every step.

What
    Host-to-device memcpys in the window whose source is pageable (not pinned) host memory.
Why
    The driver stages a pageable copy through a pinned bounce buffer on the CPU, so the call
    returns only after the data has crossed: the copy cannot overlap with the CPU's work and
    ``non_blocking=True`` has no effect. From pinned memory the copy is a DMA the CPU only queues.
Evidence
    ``srcKind`` of CUPTI_ACTIVITY_KIND_MEMCPY (0 = pageable), the copies' bytes, and the CPU time
    inside their launch calls.
Fix
    ``DataLoader(pin_memory=True)`` or ``tensor.pin_memory()`` once for reused host buffers, then
    ``.to(device, non_blocking=True)``; keep data resident on the GPU where it fits.
Expected gain
    ``wall / max(GPU busy + GPU-side gaps, wall - CPU time inside the pageable copies' calls)``.
    The GPU idle while the CPU prepares the batch is PK102's, not counted here.
References
    CUDA C++ Best Practices Guide, "Pinned Memory"; PyTorch docs, "Use pinned memory buffers".
"""
from __future__ import annotations

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, speedup

RULE = RuleMeta(
    code="PK104", name="pageable-copy",
    summary="host-to-device copies from pageable memory block the CPU: pin the memory, copy non_blocking",
    tables=(Table.MEMCPY, Table.RUNTIME), example="traces/real/loader_cnn.sqlite.xz",
    quiet_on="traces/real/loader_cnn_workers.sqlite.xz",
    params=(Param("min_cpu_share", 0.005, "CPU time in pageable copy calls, as a share of the wall time"),))

PAGEABLE, H2D = 0, 1


def detect(ctx: RuleContext) -> list[Finding]:
    kinds = ctx.prof.full_trace.copy_kinds
    a = ctx.acts
    copies = a[a["kind"].astype(str) == "memcpy"]
    if kinds.empty or copies.empty:
        return []
    k = kinds[(kinds["copyKind"] == H2D) & (kinds["srcKind"] == PAGEABLE)]
    hit = copies.merge(k[["start", "correlationId"]], on=["start", "correlationId"])
    if hit.empty:
        return []
    cpu = float((hit["api_end"] - hit["api_start"]).clip(lower=0).sum())
    wall = ctx.wall_ns
    if cpu <= RULE.param("min_cpu_share") * wall:
        return []
    r = ctx.run
    gpu_floor = float(r.gpu_busy_ns + r.breakdown["idle_other"])
    g = speedup(wall, max(gpu_floor, wall - cpu))
    return [Finding(RULE.code, RULE.name,
                    f"copy from pinned memory: {len(hit)} host-to-device copies "
                    f"({hit['bytes'].sum() / 1e6:.0f} MB) come from pageable memory; use "
                    "pin_memory=True (DataLoader) or a pinned buffer, and .to(device, non_blocking=True)",
                    Rung.LIBRARY, {"copies": int(len(hit)), "bytes": int(hit["bytes"].sum()),
                                   "cpu_in_copy_calls_ns": int(cpu)}, g,
                    f"wall / max(GPU floor {gpu_floor / 1e6:.1f} ms, wall - CPU time in pageable "
                    f"copy calls {cpu / 1e6:.2f} ms)", g)]
