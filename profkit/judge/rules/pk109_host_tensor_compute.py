"""PK109 host-tensor-compute: the step computes on tensors in host memory while the GPU waits.

What
    The op record of the capture (``profkit capture``'s calibration run, one iteration watched,
    no profiler) holds ops whose tensors all live in CPU memory and whose output is 4 KB or
    more (``host_ops``): an embedding table looked up, back-propagated and updated by its
    optimizer on the CPU, a loss or metric over host arrays, a lookup table kept on the host.
    Their time, per iteration, is ``min_share`` of the modelled iteration or more.
Why
    A table left in host memory (once thought too large for the GPU, or created without
    ``device=``) turns every step's lookup, its gradient and the optimizer's update into CPU
    work: tens of milliseconds of host arithmetic and memory traffic while the GPU idles, and a
    copy each way between them. On the GPU the same ops are a handful of kernels that run at its
    memory bandwidth. Moving a tensor is the fix a trace alone cannot see: between two CUDA
    calls, CPU time spent computing looks the same as Python overhead.
Evidence
    The record's ``host_ops`` (per op: calls, the time the op itself took, its output's bytes) and
    the step graph: the CPU time between the main thread's calls (the thread that opens the
    iterations).
Fix
    Create the tensor on the GPU (``nn.EmbeddingBag(..., device="cuda")``, ``.to(device)`` once
    before the loop) with its optimizer state there too (SparseAdam and Adam keep state on the
    parameter's device); compute metrics on the GPU and read back the result. A table that
    really does not fit: keep the hot rows on the GPU, or shard it (TorchRec).
Expected gain
    Graph edit (``scale_cpu``), replayed at the calibrated CPU scale: the main thread's CPU time
    between calls is scaled down by the recorded ops' time, less what they cost on the GPU's
    side of the host: each moved op becomes one launch at the trace's own median launch cost (a
    call's own time and the dispatch gap before it), and its kernel's time, its output's bytes
    written and read once at the GPU's peak memory bandwidth, stays on the path (the GPU idles
    while the host works, so the moved work runs where the host's was; a sparse update of a large
    tensor in place counts the tensor's whole size). The copies that carried the host tensors'
    results to the GPU and back are not removed (PK104 prices copies). On the GPU some ops are
    more than one kernel: a sparse gradient's coalesce and SparseAdam's sparse mask sort, scan
    and wait for their output's size, each priced here as one launch. On cpu_embedding_train
    (an H100, 2026-12-06) the price was 26.5x at the capture, 24.9x at the timed baseline, where
    the table, its ids and SparseAdam on the GPU measured 15.6-18.4x: the price leans high
    there, by about 40% in step time.
References
    PyTorch docs, "CUDA semantics" (device placement); ``torch.optim.SparseAdam``; TorchRec
    (sharded embedding tables).
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung

from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table
from profkit.run.step.graph import CallKind
from profkit.run.step.transform import DISPATCH_GAP_NS, scale_cpu

RULE = RuleMeta(
    code="PK109", name="host-tensor-compute",
    summary="the step computes on CPU tensors while the GPU waits: keep those tensors on the GPU",
    tables=(Table.RUNTIME,),
    example="traces/corpus/cpu_embedding_train.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_share", 0.10, "the recorded host ops' time, as a share of the modelled iteration"),))

# The memory's rate where the peaks give none: an H100's HBM3 datasheet figure
FALLBACK_BYTES_PER_S = 3.35e12


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    # entries as the record writes them (another tool's or a hand-edited record may not)
    ops = [o for o in ctx.replacements.recorded("host_ops")
           if all(isinstance(o.get(k), (int, float)) and o[k] >= 0 for k in ("count", "ns", "bytes"))
           and isinstance(o.get("op"), str)]
    if m is None or not ops:
        return []
    host_ns = float(sum(o["ns"] for o in ops))
    base = ctx.baseline_ns
    if base <= 0 or host_ns < RULE.param("min_share") * base:
        return []
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    main = g.c_tid[g.iter_call[0]] if len(g.iter_call) > 1 else None
    calls = np.flatnonzero(g.c_tid == main) if main is not None else np.arange(len(g.c_gap))
    scale = ctx.host
    gaps = float(g.c_gap[calls].sum()) * scale / its              # unprofiled ns an iteration
    if gaps <= 0:
        return []
    launches = calls[g.c_kind[calls] == int(CallKind.LAUNCH)]
    short = launches[g.c_gap[launches] < DISPATCH_GAP_NS]
    per_launch = float(np.median(g.c_own[short] + g.c_gap[short])) * scale if len(short) else 0.0
    count = int(sum(o["count"] for o in ops))
    nbytes = float(sum(o["bytes"] for o in ops))
    bw = ctx.prof.peaks.memory_bandwidth or FALLBACK_BYTES_PER_S
    gpu_ns = 2.0 * nbytes / bw * 1e9
    removed = min(max(host_ns - count * per_launch - gpu_ns, 0.0), gaps)
    factor = 1.0 - removed / gaps
    top = sorted(ops, key=lambda o: -o["ns"])[:4]
    named = ", ".join(f"{o['op']} {o['ns'] / 1e6:.2f} ms" for o in top)
    gain, basis = ctx.price(lambda gr: scale_cpu(gr, calls, factor, own=False),
                            f"{host_ns / 1e6:.2f} ms of host-tensor ops an iteration ({count} ops) on the GPU: "
                            f"{count} launches at {per_launch / 1e3:.1f} us and {gpu_ns / 1e6:.2f} ms of kernels "
                            f"({nbytes / 1e6:.0f} MB at {bw / 1e12:.1f} TB/s) in their place, the main thread's "
                            f"CPU time between calls {gaps / 1e6:.2f} -> {(gaps - removed) / 1e6:.2f} ms")
    ev = {"host_ops_ns_per_iteration": int(host_ns), "host_ops": count, "host_op_bytes": int(nbytes),
          "ops": [{k: o[k] for k in ("op", "count", "ns", "bytes")} for o in top],
          "share_of_iteration": round(host_ns / base, 3)}
    return [Finding(RULE.code, RULE.name,
                    f"the step computes on tensors in host memory: {host_ns / 1e6:.2f} ms an iteration in "
                    f"{count} ops ({named}) while the GPU waits: create those tensors on the GPU (an "
                    "embedding table and its optimizer's state, a lookup table, a metric's inputs) and "
                    "read back only results",
                    Rung.LIBRARY, ev, gain, basis, gain)]
