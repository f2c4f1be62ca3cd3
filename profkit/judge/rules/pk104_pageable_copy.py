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
    Graph edit: each pageable copy runs at the pinned bandwidth (measured on the trace's own
    pinned copies of at least 1 MB, else the 55 GB/s measured on an H200's PCIe Gen5 link), no longer at the host's pace, and
    its call no longer waits for it (``non_blocking=True``), nor does the stream synchronisation
    PyTorch issues right after a blocking host-to-device copy. The step model replays the edited
    graph at the calibrated CPU scale. The GPU idle while the CPU prepares the batch is PK102's,
    not changed here.
References
    CUDA C++ Best Practices Guide, "Pinned Memory"; PyTorch docs, "Use pinned memory buffers".
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung

from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table
from profkit.run.step.transform import PINNED_BYTES_PER_S, pin_copies

RULE = RuleMeta(
    code="PK104", name="pageable-copy",
    summary="host-to-device copies from pageable memory block the CPU: pin the memory, copy non_blocking",
    tables=(Table.MEMCPY, Table.RUNTIME), example="traces/real/loader_cnn.sqlite.xz",
    quiet_on="traces/real/loader_cnn_workers.sqlite.xz",
    params=(Param("min_cpu_share", 0.005, "CPU time in pageable copy calls, as a share of the wall time"),))

PAGEABLE, H2D = 0, 1


def pinned_bandwidth(g) -> float | None:
    """Bytes per second of the trace's own pinned copies of 1 MB or more (median), if any."""
    big = (g.g_kind == 1) & ~g.g_host_paced & (np.nan_to_num(g.g_bytes) >= 1e6) & (g.g_dur > 0)
    if not big.any():
        return None
    return float(np.median(g.g_bytes[big] / g.g_dur[big] * 1e9))


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None:
        return []
    g = m.graph
    ops = np.flatnonzero(g.g_host_paced & (g.g_call >= 0))
    if not len(ops):
        return []
    calls = g.g_call[ops]
    its = max(len(g.iter_call) - 1, 1)
    cpu = float((g.c_end - g.c_start)[calls].sum()) * m.host / its
    if cpu <= RULE.param("min_cpu_share") * m.iteration_ns:
        return []
    bw = pinned_bandwidth(g)
    nbytes = np.nan_to_num(g.g_bytes[ops])
    gain, basis = ctx.price(lambda gr: pin_copies(gr, ops, nbytes, bw),
                            f"{len(ops) / its:.0f} pageable copies per iteration pinned "
                            f"({(bw or PINNED_BYTES_PER_S) / 1e9:.0f} GB/s"
                            f"{' measured' if bw else ', assumed'}) and non-blocking")
    return [Finding(RULE.code, RULE.name,
                    f"copy from pinned memory: {len(ops)} host-to-device copies "
                    f"({nbytes.sum() / 1e6:.0f} MB) come from pageable memory; use "
                    "pin_memory=True (DataLoader) or a pinned buffer, and .to(device, non_blocking=True)",
                    Rung.LIBRARY, {"copies": int(len(ops)), "bytes": int(nbytes.sum()),
                                   "cpu_in_copy_calls_ns_per_iteration": int(cpu)}, gain, basis, gain)]
