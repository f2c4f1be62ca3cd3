"""PK102 data-loading: the GPU waits while the main process loads and prepares batches.

What
    GPU idle time whose gaps fall inside a data-loading NVTX range (``data``, ``load``,
    ``batch``, ``fetch``, ...) or while the CPU is inside a memcpy call.
Why
    With ``DataLoader(num_workers=0)`` the main process decodes, augments and collates every
    batch while the GPU has nothing queued; pageable host memory makes each copy a CPU-staged
    synchronous transfer.
Evidence
    ``idle_host_by_range`` (host idle by the top-level range open at the gap) and
    ``idle_memcpy_wait`` of the run breakdown.
Fix
    ``DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2)``
    and ``batch.to(device, non_blocking=True)``; move heavy augmentation to the GPU.
Expected gain
    ``wall / max(GPU busy + GPU-side gaps, wall - GPU idle in data ranges and copies)``: the
    loading leaves the critical path, the rest of the CPU's work stays. Measured on
    loader_cnn -> loader_cnn_workers: predicted 12.3x, measured 11.5x per iteration.
References
    PyTorch ``torch.utils.data`` docs (multi-process loading, memory pinning);
    PyTorch performance tuning guide, "Enable async data loading and augmentation".
"""
from __future__ import annotations

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, speedup
from profkit.run.summary import DATA_RE

RULE = RuleMeta(
    code="PK102", name="data-loading",
    summary="the GPU idles while the main process loads batches: DataLoader workers, pinned memory",
    tables=(Table.NVTX, Table.RUNTIME, Table.KERNEL), example="traces/real/loader_cnn.sqlite.xz",
    quiet_on="traces/real/loader_cnn_workers.sqlite.xz",
    params=(Param("min_idle_share", 0.05, "GPU idle while loading, as a share of the wall time"),))


def detect(ctx: RuleContext) -> list[Finding]:
    r = ctx.run
    wall = ctx.wall_ns
    b = r.breakdown
    data = sum(v for k, v in r.idle_host_by_range.items() if DATA_RE.search(k))
    idle = data + b["idle_memcpy_wait"]
    if idle <= RULE.param("min_idle_share") * wall:
        return []
    gpu_floor = float(r.gpu_busy_ns + b["idle_other"])
    g = speedup(wall, max(gpu_floor, wall - idle))
    ranges = [k for k in r.idle_host_by_range if DATA_RE.search(k)]
    return [Finding(RULE.code, RULE.name,
                    "prepare batches off the critical path: DataLoader num_workers > 0, "
                    "pin_memory=True, .to(device, non_blocking=True), prefetch", Rung.LIBRARY,
                    {"idle_in_data_ranges_ns": int(data), "idle_memcpy_wait_ns": int(b["idle_memcpy_wait"]),
                     "data_ranges": ranges[:3], "gpu_floor_ns": int(gpu_floor)}, g,
                    f"wall / max(GPU busy + GPU-side gaps {gpu_floor / 1e6:.1f} ms, wall - GPU idle "
                    f"while the CPU loads or copies data {idle / 1e6:.1f} ms)", g)]
