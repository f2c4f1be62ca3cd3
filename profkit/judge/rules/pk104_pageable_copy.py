"""PK104 pageable-copy: copies to or from pageable memory block the CPU every step.

What
    Host-to-device memcpys in the window whose source is pageable (not pinned) host memory; and
    device-to-host copies of whole tensors (1 MB or more) into pageable memory, which the host
    then works on (logits copied for a numpy argmax or scikit-learn metrics).
Why
    The driver stages a pageable copy through a pinned bounce buffer on the CPU, so the call
    returns only after the data has crossed: the copy cannot overlap with the CPU's work and
    ``non_blocking=True`` has no effect. From pinned memory the copy is a DMA the CPU only queues.
    A device-to-host copy waits for the GPU in any case (its data is read next); what costs there
    is the size of what crosses and the host's work on it after the copy returns, its consumer.
Evidence
    ``srcKind`` of CUPTI_ACTIVITY_KIND_MEMCPY (0 = pageable), the copies' bytes, and the CPU time
    inside their launch calls.
Fix
    Host-to-device: ``DataLoader(pin_memory=True)`` or ``tensor.pin_memory()`` once for reused
    host buffers, then ``.to(device, non_blocking=True)``; keep data resident on the GPU where it
    fits. Device-to-host: compute on the GPU what the host computes from the copy (``argmax``,
    ``topk``, metric counts) and copy only the result; or, where the host must have the whole
    tensor, copy it into a pinned buffer.
Expected gain
    Graph edits, replayed at the calibrated CPU scale:

    * host-to-device: each pageable copy runs at the pinned bandwidth, no longer at the host's
      pace, and its call no longer waits for it (``non_blocking=True``), nor does the stream
      synchronisation PyTorch issues right after a blocking host-to-device copy. The GPU idle
      while the CPU prepares the batch is PK102's, not changed here. The pinned bandwidth, best
      first: **timed at capture** (``profkit capture`` records the program's copies, their bytes
      and direction, in its calibration run and times each size from pageable and from pinned
      memory, PROFKIT_META ``replacements``: the pinned copies' bytes over their time; the action
      says "replacement timed at the program's shapes: X us vs Y us"); else **estimated** ("no
      replacement timed at capture"): the trace's own pinned copies of at least 1 MB, else the
      55 GB/s measured on an H200's PCIe Gen5 link (pinned memory there measured 2.61x where the
      55 GB/s priced 2.04x);
    * device-to-host, reduced on the GPU (the price): each copy becomes a reduction reading the
      tensor once at the GPU's memory bandwidth and a copy of its result (2 us), and the CPU time
      between the copy's return and the next CUDA call of its thread (the consumer: numpy,
      scikit-learn, Python over the values) drops to the trace's median dispatch gap. The call
      still waits for the result;
    * device-to-host, reduced on the GPU and read once (the price where an iteration makes
      several such copies: the windows of one volume, the batches of one evaluation): the same,
      and the results kept on the GPU and read together at the iteration's end, so the earlier
      copies' calls and the reads after them wait for nothing. A sliding-window segmentation that
      copied 8 windows' logits a volume to numpy accumulators: read once 6.22x, read after each
      copy 5.88x, measured 7.42x with the volume on the GPU (its windows also cut there, not
      copied in from the host: the host-to-device side, which this edit keeps);
    * device-to-host into a pinned buffer (said beside it): the copy at the pinned bandwidth, its
      wait and its consumer kept;
    * device-to-host into pinned buffers, read one step later (said beside it): the copy at the
      pinned bandwidth with ``non_blocking=True`` and an event, the host working on a step's copy
      after it has queued the next step's work: the copy's call and the reads right after it (more
      small copies, syncs) wait for nothing, so the host's work overlaps the GPU's. (A ViT
      evaluation loop that copied 11 MB of logits a batch for numpy metrics: this price 1.39x,
      measured 1.36x; the pinned copy alone 1.02x.)

    The consumer is looked for past the reads that follow the large copy (a batch's labels copied
    right after its logits): the CPU time before the first call after them, or the window's tail
    where the window's last call is such a read (a window cut after an iteration: the last
    iteration's host work on its copies lies past the last call; kept, a 6-volume window of the
    sliding-window segmentation priced 4.09x where the capture's 14 volumes gave 6.28x).
References
    CUDA C++ Best Practices Guide, "Pinned Memory"; PyTorch docs, "Use pinned memory buffers".
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung

from profkit.judge.rules.base import ESTIMATED, Finding, Param, RuleContext, RuleMeta, Table, timed_text
from profkit.run.step.graph import CallKind
from profkit.run.step.transform import (DISPATCH_GAP_NS, PINNED_BYTES_PER_S, drop_waits, pin_copies, reads_after,
                                        reduce_before_copy)

RULE = RuleMeta(
    code="PK104", name="pageable-copy",
    summary="host-to-device copies from pageable memory block the CPU: pin the memory, copy non_blocking",
    tables=(Table.MEMCPY, Table.RUNTIME), example="traces/real/loader_cnn.sqlite.xz",
    quiet_on="traces/real/loader_cnn_workers.sqlite.xz",
    params=(Param("min_cpu_share", 0.005, "CPU time in pageable copy calls, as a share of the wall time"),))

PAGEABLE, H2D = 0, 1
# A device-to-host copy this large is a tensor's worth of data for the host to work on (an
# ``.item()`` or a few ids are PK101's business).
BULK_D2H_BYTES = 1e6
RESULT_COPY_NS = 2_000.0


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
    paged = g.g_host_paced & (g.g_call >= 0)
    d2h = np.array(["Device-to-Host" in str(n) for n in g.op_names] + [False], dtype=bool)[g.g_name]
    out = []
    h2d_ops = np.flatnonzero(paged & ~d2h)
    if len(h2d_ops):
        out += _host_to_device(ctx, m, h2d_ops)
    d2h_ops = np.flatnonzero(paged & d2h & (np.nan_to_num(g.g_bytes) >= BULK_D2H_BYTES))
    if len(d2h_ops):
        out += _device_to_host(ctx, m, d2h_ops)
    return out


def timed_bandwidth(ctx: RuleContext, direction: str) -> tuple[float | None, str]:
    """(bytes per second of the pinned copies timed at the program's sizes in ``direction``, the
    words that say so), or (None, the estimate's words) where none was timed."""
    timed = [e for e in ctx.replacements.measured("copy") if e.shape.get("direction") == direction]
    if not timed:
        return None, ESTIMATED
    nbytes = sum(float(e.shape.get("bytes", 0)) * e.count for e in timed)
    ns = sum(float(e.replacement_ns) * e.count for e in timed)
    if nbytes <= 0 or ns <= 0:
        return None, ESTIMATED
    return nbytes / ns * 1e9, timed_text(timed, "pinned vs pageable, ")


def _copy_cpu(m, ops: np.ndarray) -> float:
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    calls = g.g_call[ops]
    return float((g.c_end - g.c_start)[calls].sum()) * m.host / its


def _host_to_device(ctx: RuleContext, m, ops: np.ndarray) -> list[Finding]:
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    cpu = _copy_cpu(m, ops)
    if cpu <= RULE.param("min_cpu_share") * m.iteration_ns:
        return []
    timed_bw, said = timed_bandwidth(ctx, "h2d")
    bw = timed_bw or pinned_bandwidth(g)
    nbytes = np.nan_to_num(g.g_bytes[ops])
    where = (" timed" if timed_bw else " measured on the trace's pinned copies" if bw else ", assumed")
    gain, basis = ctx.price(lambda gr: pin_copies(gr, ops, nbytes, bw),
                            f"{len(ops) / its:.0f} pageable copies per iteration pinned "
                            f"({(bw or PINNED_BYTES_PER_S) / 1e9:.0f} GB/s{where}) and non-blocking")
    basis = f"{said}; {basis}"
    return [Finding(RULE.code, RULE.name,
                    f"copy from pinned memory: {len(ops)} host-to-device copies "
                    f"({nbytes.sum() / 1e6:.0f} MB) come from pageable memory; use "
                    "pin_memory=True (DataLoader) or a pinned buffer, and .to(device, non_blocking=True)",
                    Rung.LIBRARY, {"copies": int(len(ops)), "bytes": int(nbytes.sum()),
                                   "cpu_in_copy_calls_ns_per_iteration": int(cpu),
                                   "pinned_bytes_per_s": round(bw or PINNED_BYTES_PER_S),
                                   "priced_from": "timed" if timed_bw else "estimate"}, gain, basis, gain)]


def _device_to_host(ctx: RuleContext, m, ops: np.ndarray) -> list[Finding]:
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    nbytes = np.nan_to_num(g.g_bytes[ops])
    hbm = float(ctx.prof.peaks.memory_bandwidth)
    launches = g.c_kind == int(CallKind.LAUNCH)
    short = launches & (g.c_gap < DISPATCH_GAP_NS)
    dispatch = float(np.median(g.c_gap[short])) if short.any() else 0.0
    def reduce(gr):
        return reduce_before_copy(gr, ops, nbytes / hbm * 1e9, RESULT_COPY_NS, dispatch)
    reduced, basis = ctx.price(
        reduce,
        f"{len(ops) / its:.0f} device-to-host copies per iteration ({nbytes.sum() / its / 1e6:.0f} MB) "
        f"reduced on the GPU ({hbm / 1e12:.1f} TB/s) and only the result copied, the host's work on "
        "the copied data after each gone")
    # Several copies an iteration (windows of one volume, batches of one evaluation): their
    # results kept on the GPU and read together at the iteration's end; the earlier copies' calls
    # and the reads after them then wait for nothing, and the host's launches overlap the GPU's work.
    calls = g.g_call[ops]
    it = np.searchsorted(g.iter_call, calls, side="right") - 1
    reads = reads_after(g, ops)
    once = None
    if len(np.unique(it)) < len(it):
        last = {k: int(calls[it == k].max()) for k in np.unique(it)}
        r_it = np.searchsorted(g.iter_call, reads, side="right") - 1
        early = reads[reads < np.array([last.get(k, -1) for k in r_it], dtype=np.int64)]
        once, once_basis = ctx.price(
            lambda gr: drop_waits(reduce(gr), early),
            f"{len(ops) / its:.0f} device-to-host copies per iteration ({nbytes.sum() / its / 1e6:.0f} MB) "
            f"reduced on the GPU ({hbm / 1e12:.1f} TB/s), the host's work on the copied data gone, the "
            "results kept on the GPU and read once at the iteration's end")
    bw = timed_bandwidth(ctx, "d2h")[0] or pinned_bandwidth(g)
    pinned, _ = ctx.price(lambda gr: pin_copies(gr, ops, nbytes, bw, non_blocking=False),
                          "the same copies into a pinned buffer, the host's work on them kept")
    later, _ = ctx.price(lambda gr: drop_waits(pin_copies(gr, ops, nbytes, bw), reads),
                         "the same copies into pinned buffers, read one step later: the host's work "
                         "on them overlaps the GPU's")
    ev = {"copies": int(len(ops)), "bytes": int(nbytes.sum()),
          "cpu_in_copy_calls_ns_per_iteration": int(_copy_cpu(m, ops)),
          "reduce_on_gpu_speedup": round(reduced, 3), "pinned_speedup": round(pinned, 3),
          "pinned_read_later_speedup": round(later, 3)}
    if max(reduced, pinned, later) < 1.0 + 1e-9:
        return []
    result = f"copy only the result ({reduced:.2f}x, the number below)"
    price = reduced
    if once is not None and once > reduced:
        ev["reduce_on_gpu_read_once_speedup"] = round(once, 3)
        result = (f"keep the iteration's results there and copy them once at its end ({once:.2f}x, the "
                  f"number below; read after each copy: {reduced:.2f}x)")
        price, basis = once, once_basis
    return [Finding(RULE.code, RULE.name,
                    f"keep the reduction on the GPU: {len(ops) / its:.0f} device-to-host copies per iteration "
                    f"({nbytes.sum() / its / 1e6:.0f} MB) go to pageable memory and the host works on them "
                    f"after each; compute what the host takes from them (argmax, top-k, metric counts, an "
                    f"accumulation) on the GPU and {result}; where the host "
                    f"needs the whole tensor, a pinned buffer for the copy: {pinned:.2f}x, and read one step "
                    f"later (non_blocking=True and an event; the host's work then overlaps the next "
                    f"step's GPU work): {later:.2f}x",
                    Rung.LIBRARY, ev, price, basis, price)]
