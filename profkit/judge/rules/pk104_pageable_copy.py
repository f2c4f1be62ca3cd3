"""PK104 pageable-copy: copies to or from pageable memory block the CPU every step.

What
    Host-to-device memcpys in the window whose source is pageable (not pinned) host memory; and
    device-to-host copies of whole tensors (1 MB or more) into pageable memory, which the host
    then works on (logits copied for a numpy argmax or scikit-learn metrics); and data sent to the
    host and brought back within the step (a round trip: saved activations offloaded with
    ``torch.autograd.graph.save_on_cpu``, or a CPU offload of one's own).
Why
    The driver stages a pageable copy through a pinned bounce buffer on the CPU, so the call
    returns only after the data has crossed: the copy cannot overlap with the CPU's work and
    ``non_blocking=True`` has no effect. From pinned memory the copy is a DMA the CPU only queues.
    A device-to-host copy waits for the GPU in any case (its data is read next); what costs there
    is the size of what crosses and the host's work on it after the copy returns, its consumer.
Evidence
    ``srcKind`` of CUPTI_ACTIVITY_KIND_MEMCPY (0 = pageable), the copies' bytes, and the CPU time
    inside their launch calls. A round trip: each host-to-device copy paired with the latest
    unpaired device-to-host copy of the same size earlier in the same iteration (a backward reads
    its saved tensors back last in, first out), the pairs holding half or more of the bytes the
    step sends to the host, 1 MB or more an iteration, and three or more held on the host at once
    (a sliding-window loop that copies each window's logits out and the next window's input in, of
    the same size by chance, holds one at a time: not a round trip). Streamed weights: the
    host-to-device copies (pageable or pinned) of the sizes the op record marked ``weights`` (their
    source an ``nn.Parameter``, or a parameter or buffer of a module the program called; a mark
    no capture on a GPU has made yet: its test copies to the meta device on the CPU), or, in a
    record that marked none, of the sizes of its GEMMs' weight operands (n x k of a 2-D ``mm`` or
    ``addmm`` whose m differs from n) and its convolutions' weights, and the copies a thread
    issues with one of those before any kernel launch (a layer's biases and norm scales, copied
    with its weights); 1 MB or more an iteration and half or more of the bytes the step copies
    in, and a quarter of the GPU's memory or less.
Fix
    Streamed weights: load them to the GPU once (``model.to(device)``, no CPU offload) where
    they fit; where they must stay on the host, pin them and copy the next layer's on a side
    stream while this one computes.
    A round trip: keep the data on the GPU where it fits (drop the offload); where it does not,
    recompute the activations in the backward (``torch.utils.checkpoint``) or offload through
    pinned buffers (``save_on_cpu(pin_memory=True)``).
    Host-to-device: ``DataLoader(pin_memory=True)`` or ``tensor.pin_memory()`` once for reused
    host buffers, then ``.to(device, non_blocking=True)``; keep data resident on the GPU where it
    fits. Device-to-host: compute on the GPU what the host computes from the copy (``argmax``,
    ``topk``, metric counts) and copy only the result; or, where the host must have the whole
    tensor, copy it into a pinned buffer.
Expected gain
    Graph edits, replayed at the calibrated CPU scale:

    * a round trip, kept on the GPU (the price): the paired copies, their calls and every wait on
      them or right after them gone (its copies are then no other part's: PK101 leaves their
      syncs out). A decoder trained with ``save_on_cpu()`` (590 MB a step each way, 157 copies):
      8.77x, measured 15.5x without the offload and 13.1x with checkpointing instead (the step
      is priced at the profiled run's CPU speed, which its runs without the profiler bracket;
      the profiler's cost on the CPU work that remains, a few ms, cannot be told from them);
    * streamed weights, kept on the GPU (the price): the copies, their calls and the waits on
      them and after them gone (the round trip's edit); from pinned memory (said beside it,
      evidence ``pinned_speedup``), the host-to-device edit below. Weights that would take more
      than a quarter of the GPU's memory are priced as any host-to-device copy. Why: a stack of
      six decoder layers streamed from pageable memory at every batch (2.4 GB, an H100,
      2026-12-08) was priced 6.58x for pinned copies, its top action, where the weights kept on
      the GPU measured 35.6x (pinned 5.56x, pinned with a prefetch 6.45x); this led to it: 30.5x
      at capture (21.8x before the biases copied with the weights counted: their 48 small
      blocking copies an iteration kept the host waiting on the GPU at every layer), no test of it;
    * a round trip through pinned buffers (said beside it): the copies to the host at the pinned
      bandwidth, still waited for (``copy_`` without ``non_blocking``), the copies back
      non-blocking (3.08x on that decoder, measured 4.6x: the pinned bandwidth there is assumed);

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

from profkit.judge.dtypes import ELEM_BYTES
from profkit.judge.rules.pk102_data_loading import RESIDENT_SHARE   # what a GPU may keep resident
from profkit.judge.rules.base import ESTIMATED, Finding, Param, RuleContext, RuleMeta, Table, timed_text
from profkit.run.step.graph import CallKind, StepGraph
from profkit.run.step.transform import (DISPATCH_GAP_NS, PINNED_BYTES_PER_S, drop_waits, pin_copies, reads_after,
                                        reduce_before_copy, scale_ops)

RULE = RuleMeta(
    code="PK104", name="pageable-copy",
    summary="copies from pageable memory block the CPU, or data goes to the host and back: pin, non_blocking, keep it on the GPU",
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
    d2h = is_device_to_host(g)
    out = []
    trip = round_trip_ops(g)
    if trip is not None:
        out += _round_trip(ctx, m, *trip)
        # the copies that come back are that finding's; the others are priced as below
        gone = np.zeros(g.n_ops, dtype=bool)
        gone[np.concatenate(trip)] = True
        paged = paged & ~gone
    weights = streamed_weights(ctx, g)
    if weights is not None:
        found = _resident_weights(ctx, m, *weights, np.flatnonzero(paged & ~d2h))
        if found:
            out += found
            paged = paged.copy()
            paged[weights[0]] = False
    h2d_ops = np.flatnonzero(paged & ~d2h)
    if len(h2d_ops):
        out += _host_to_device(ctx, m, h2d_ops)
    d2h_ops = np.flatnonzero(paged & d2h & (np.nan_to_num(g.g_bytes) >= BULK_D2H_BYTES))
    if len(d2h_ops):
        out += _device_to_host(ctx, m, d2h_ops)
    return out


# Most of the bytes a step copies to the host coming back in the same step: a round trip
ROUND_TRIP_SHARE = 0.5
# ... and several of them on the host at once (sent before the first comes back)
MIN_HELD = 3


def is_device_to_host(g) -> np.ndarray:
    """Per operation: a device-to-host copy."""
    return np.array(["Device-to-Host" in str(n) for n in g.op_names] + [False], dtype=bool)[g.g_name]


def round_trip_ops(g) -> tuple[np.ndarray, np.ndarray] | None:
    """``round_trips`` of the step's copies (pageable or pinned, of any size: an offload sends a
    LayerNorm's statistics and a bias with the activations, each a blocking copy), where the
    pairs move ``BULK_D2H_BYTES`` or more an iteration."""
    d2h = is_device_to_host(g)
    copy = (g.g_kind == 1) & (g.g_call >= 0)
    trip = round_trips(g, np.flatnonzero(copy & d2h), np.flatnonzero(copy & ~d2h))
    its = max(len(g.iter_call) - 1, 1)
    if trip is None or np.nan_to_num(g.g_bytes[trip[0]]).sum() / its < BULK_D2H_BYTES:
        return None
    return trip


def round_trips(g, d2h: np.ndarray, h2d: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(device-to-host copies, host-to-device copies) of the same sizes, each host-to-device copy
    later in the same iteration than the device-to-host copy it is paired with (the latest
    unpaired one of its size: a backward reads its saved tensors back last in, first out): data
    sent to the host and brought back within a step, as activation offloading does
    (``torch.autograd.graph.save_on_cpu``). None unless the pairs hold ``ROUND_TRIP_SHARE`` of the
    device-to-host bytes."""
    if not len(d2h) or not len(h2d):
        return None
    nbytes = np.nan_to_num(g.g_bytes)
    ops = np.concatenate([d2h, h2d])
    back = np.r_[np.zeros(len(d2h), dtype=bool), np.ones(len(h2d), dtype=bool)]
    order = np.lexsort((ops, back, g.g_call[ops]))   # in launch order, a copy out before one back
    it = np.searchsorted(g.iter_call, g.g_call[ops], side="right") - 1
    waiting: dict[tuple[int, int], list[int]] = {}
    out_d, out_h = [], []
    for o, b, k in zip(ops[order].tolist(), back[order].tolist(), it[order].tolist()):
        if not b:
            waiting.setdefault((k, int(nbytes[o])), []).append(o)
        elif (stack := waiting.get((k, int(nbytes[o])))):
            out_d.append(stack.pop())
            out_h.append(o)
    if not out_d or nbytes[out_d].sum() < ROUND_TRIP_SHARE * nbytes[d2h].sum():
        return None
    # Held on the host together: an offload sends many tensors before the first comes back. A
    # loop that copies each window's output to the host and the next window's input in, of the
    # same size by chance (a sliding-window segmentation), holds one at a time: no round trip.
    ends = sorted([(int(g.g_call[d]), 1) for d in out_d] + [(int(g.g_call[h]), -1) for h in out_h])
    if max(np.cumsum([e for _, e in ends])) < MIN_HELD:
        return None
    return np.array(sorted(out_d), dtype=np.int64), np.array(sorted(out_h), dtype=np.int64)


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


def kept_on_gpu(gr: StepGraph, ops: np.ndarray, nbytes: np.ndarray) -> StepGraph:
    """``gr`` with the copies ``ops`` (of ``nbytes``) not made, their data kept on the GPU: the
    copies, their calls, and the waits on them and right after them gone."""
    gr = pin_copies(gr, ops, nbytes, bandwidth=1e18, non_blocking=True)
    return scale_ops(gr, ops, float("inf"), drop_launches=True)


def _round_trip(ctx: RuleContext, m, down: np.ndarray, up: np.ndarray) -> list[Finding]:
    """Data sent to the host and brought back in the same step: kept on the GPU (the price), or
    through pinned buffers both ways (said beside it)."""
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    ops = np.concatenate([down, up])
    nbytes = np.nan_to_num(g.g_bytes)
    per_it = nbytes[down].sum() / its

    kept, basis = ctx.price(lambda gr: kept_on_gpu(gr, ops, nbytes[ops]),
                            f"{len(down) / its:.0f} device-to-host copies per iteration "
                                  f"({per_it / 1e6:.0f} MB) and the {len(up) / its:.0f} host-to-device "
                                  "copies that bring the same bytes back gone")
    d_bw = timed_bandwidth(ctx, "d2h")[0] or pinned_bandwidth(g)
    h_bw, said = timed_bandwidth(ctx, "h2d")
    h_bw = h_bw or pinned_bandwidth(g)

    def pinned_both(gr):
        # save_on_cpu(pin_memory=True): the copy down still waits (copy_ without non_blocking),
        # the copy back is non_blocking
        gr = pin_copies(gr, down, nbytes[down], d_bw, non_blocking=False)
        return pin_copies(gr, up, nbytes[up], h_bw, non_blocking=True)
    pinned, _ = ctx.price(pinned_both, "the same copies through pinned buffers")
    if max(kept, pinned) < 1.0 + 1e-9:
        return []
    ev = {"copies_to_host_per_iteration": round(len(down) / its, 1),
          "copies_back_per_iteration": round(len(up) / its, 1),
          "bytes_per_iteration": int(per_it), "pinned_speedup": round(pinned, 3),
          "pinned_bytes_per_s": round(h_bw or PINNED_BYTES_PER_S),
          "priced_from": "estimate" if said == ESTIMATED else "timed"}
    return [Finding(RULE.code, RULE.name,
                    f"keep them on the GPU: {per_it / 1e6:.0f} MB a step go to host memory in "
                    f"{len(down) / its:.0f} device-to-host copies and come back in {len(up) / its:.0f} "
                    "host-to-device copies of the same sizes later in the step (saved activations "
                    "offloaded: torch.autograd.graph.save_on_cpu, or a CPU offload of one's own); where "
                    f"they fit in the GPU's memory drop the offload ({kept:.2f}x, the number below), "
                    "where they do not, recompute them in the backward (torch.utils.checkpoint) or "
                    f"offload through pinned buffers (save_on_cpu(pin_memory=True)): {pinned:.2f}x",
                    Rung.LIBRARY, ev, kept, basis, kept)]


def weight_sizes(ctx: RuleContext) -> tuple[set[int], str]:
    """(the byte sizes of the weights the op record saw copied to the device, how it knows): the
    host-to-device copies it marked ``weights`` (an ``nn.Parameter`` or a module's parameter or
    buffer as the source); where it marked none, the sizes of the recorded GEMMs' weight operands
    (n x k of a 2-D ``mm``/``addmm``, whose other operand, m x k, differs in size) and of the
    convolutions' weights, which a layer's streamed weights take."""
    copies = ctx.replacements.recorded("copy")
    marked = {int(c["bytes"]) for c in copies if c.get("weights") and c.get("direction") == "h2d"}
    if marked:
        return marked, "copies of parameters, by the op record"
    sizes: set[int] = set()
    for x in ctx.replacements.recorded("gemm"):
        e = ELEM_BYTES.get(str(x.get("dtype")))
        if e and x.get("op") in ("mm", "addmm") and x.get("batch", 1) == 1 and x.get("m") != x.get("n"):
            sizes.add(int(x["n"]) * int(x["k"]) * e)
    for x in ctx.replacements.recorded("conv"):
        e = ELEM_BYTES.get(str(x.get("dtype")))
        if e and x.get("weight"):
            sizes.add(int(np.prod(x["weight"])) * e)
    return sizes, "copies of the sizes of the recorded GEMMs' and convolutions' weights"


def streamed_weights(ctx: RuleContext, g) -> tuple[np.ndarray, str] | None:
    """(the host-to-device copies of the step that bring a model's weights in, how they were
    told), where they move ``BULK_D2H_BYTES`` or more an iteration and most of what the step
    copies in: a layer's weights streamed from host memory at every forward (a CPU offload), the
    same bytes each iteration."""
    sizes, how = weight_sizes(ctx)
    if not sizes:
        return None
    h2d = np.flatnonzero((g.g_kind == 1) & (g.g_call >= 0) & ~is_device_to_host(g))
    nbytes = np.nan_to_num(g.g_bytes[h2d]).astype(np.int64)
    hit = np.isin(nbytes, list(sizes))
    # A layer's weights are copied together before its kernels: the copies a thread issues with
    # no kernel launched between them and one of the weights are that layer's too (its biases,
    # its norms' scales), which the sizes alone do not tell
    launched = np.cumsum(g.c_kind == int(CallKind.LAUNCH))[g.g_call[h2d]]
    group = (g.c_tid[g.g_call[h2d]].astype(np.int64), launched)
    held = {k for k, h in zip(zip(*group), hit) if h}
    hit = np.array([k in held for k in zip(*group)], dtype=bool) if len(h2d) else hit
    its = max(len(g.iter_call) - 1, 1)
    if nbytes[hit].sum() / its < BULK_D2H_BYTES or nbytes[hit].sum() < 0.5 * nbytes.sum():
        return None
    return h2d[hit], how


def _resident_weights(ctx: RuleContext, m, ops: np.ndarray, how: str, paged: np.ndarray) -> list[Finding]:
    """Weights copied in at every iteration that fit in the GPU's memory: kept there (the price),
    or streamed from pinned memory (said beside it: every pageable host-to-device copy ``paged``
    pinned, the small ones beside the weights, such as biases, with them)."""
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    nbytes = np.nan_to_num(g.g_bytes[ops])
    per_it = float(nbytes.sum()) / its
    mem = getattr(ctx.prof.full_trace.primary_gpu(), "total_memory", None)
    if not mem or per_it > RESIDENT_SHARE * mem:
        return []

    kept, basis = ctx.price(lambda gr: kept_on_gpu(gr, ops, nbytes),
                            f"{len(ops) / its:.0f} host-to-device copies of weights per iteration "
                            f"({per_it / 1e6:.0f} MB) gone, the weights loaded once")
    timed_bw, _ = timed_bandwidth(ctx, "h2d")
    bw = timed_bw or pinned_bandwidth(g)
    pinned_ops = np.union1d(ops, paged)
    pinned, _ = ctx.price(lambda gr: pin_copies(gr, pinned_ops, np.nan_to_num(g.g_bytes[pinned_ops]), bw),
                          "the host-to-device copies from pinned memory, non-blocking")
    if kept < 1.0 + 1e-9:
        return []
    ev = {"copies_per_iteration": round(len(ops) / its, 1), "bytes_per_iteration": int(per_it),
          "gpu_memory_share": round(per_it / mem, 4), "weights_from": how,
          "pinned_speedup": round(pinned, 3), "pinned_bytes_per_s": round(bw or PINNED_BYTES_PER_S),
          "priced_from": "timed" if timed_bw else "estimate"}
    return [Finding(RULE.code, RULE.name,
                    f"keep the weights on the GPU: {per_it / 1e6:.0f} MB of weights cross from host memory every "
                    f"iteration in {len(ops) / its:.0f} host-to-device copies (weights streamed in, as a CPU "
                    f"offload does), {per_it / mem:.1%} of the GPU's memory: load them once "
                    f"(model.to(device)) ({kept:.2f}x, the number below); where they must stay on the host, "
                    f"pin them (and copy the next layer's on a side stream while this one computes): "
                    f"{pinned:.2f}x", Rung.LIBRARY, ev, kept, f"{how}; {basis}", kept)]


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
