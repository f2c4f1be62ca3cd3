"""PK103 host-overhead: the CPU's cost per kernel launch sets the pace (host-bound steps, decode).

What
    The GPU idles between kernels waiting for the CPU to launch the next one, outside any
    data-loading range: Python, the dispatcher and the launch calls take longer than the kernels.
    Typical of small-batch training steps and of token-by-token decode loops.
Why
    A CUDA graph replays a whole captured region with one launch: the per-kernel CPU cost (the
    launch call and the framework code between two launches) goes away; the Python between
    captured regions (a generate() loop's sampling and stopping checks, the optimizer's
    bookkeeping) stays.
Evidence
    Per iteration: the time inside launch calls, and the host gaps between consecutive launch
    calls that are shorter than ``dispatch_gap_us`` (per-op framework overhead). Longer gaps
    are Python between model calls and are kept.
Fix
    ``torch.compile(mode="reduce-overhead")`` or ``torch.cuda.graphs``; for HF ``generate()``,
    ``cache_implementation="static"`` (a static KV cache, which lets the decode step be compiled
    and captured); or give each launch more work (larger batches).
Expected gain
    Per iteration, new = max(GPU busy + GPU-side gaps, iteration - launch-call time - short
    dispatch gaps); gain = median iteration / median new. The old bound (all host idle removed)
    is kept as ``bound``: on generate_llama it said 39x where the static-cache variant measured
    1.8x per token, because most of a decode step's CPU time is outside the launches.
References
    PyTorch CUDA Graphs docs; ``torch.compile`` modes; HF transformers "Static cache and
    torch.compile" docs; Nsight Systems ``nsys analyze`` rule ``gpu_gaps``.
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.rules.base import (Finding, Param, RuleContext, RuleMeta, Table, iteration_bounds,
                                speedup)
from profkit.run import DATA_RE

RULE = RuleMeta(
    code="PK103", name="host-overhead",
    summary="the CPU's per-kernel launch cost sets the pace: CUDA graphs, static KV cache, bigger batches",
    tables=(Table.RUNTIME, Table.KERNEL, Table.NVTX), example="traces/real/generate_llama.sqlite",
    quiet_on="traces/real/cnn_infer.sqlite",
    params=(Param("min_idle_share", 0.05, "GPU idle waiting for the CPU, as a share of the wall time"),
            Param("dispatch_gap_us", 50.0, "host gaps between launches shorter than this are "
                                           "per-op framework overhead that a graph removes")))


def _removable(ctx: RuleContext, bounds: np.ndarray) -> np.ndarray:
    """Per iteration: launch-call time plus short gaps between consecutive launches."""
    launches = ctx.launches
    if launches.empty:
        return np.zeros(len(bounds) - 1)
    pid = np.right_shift(launches["globalTid"].to_numpy(np.int64), 24)
    main = np.bincount(pid - pid.min()).argmax() + pid.min()  # the process that launches most
    launches = launches[pid == main].sort_values("start")
    s, e = launches["start"].to_numpy(np.int64), launches["end"].to_numpy(np.int64)
    gap = np.append(np.maximum(s[1:] - e[:-1], 0), 0)
    short = gap < RULE.param("dispatch_gap_us") * 1e3
    per = (e - s) + np.where(short, gap, 0)
    idx = np.searchsorted(bounds, s, side="right") - 1
    ok = (idx >= 0) & (idx < len(bounds) - 1)
    return np.bincount(idx[ok], weights=per[ok], minlength=len(bounds) - 1)


def detect(ctx: RuleContext) -> list[Finding]:
    r = ctx.run
    wall = ctx.wall_ns
    b = r.breakdown
    data = sum(v for k, v in r.idle_host_by_range.items() if DATA_RE.search(k))
    host = b["idle_host"] - data
    if host <= RULE.param("min_idle_share") * wall:
        return []
    gpu_floor = float(r.gpu_busy_ns + b["idle_other"])
    bound = speedup(wall, max(gpu_floor, wall - host))
    bounds = iteration_bounds(r)
    iters = np.diff(bounds).astype(float)
    removable = _removable(ctx, bounds)
    floor_it = gpu_floor / len(iters)
    new = np.maximum(floor_it, iters - removable)
    gain = min(speedup(float(np.median(iters)), float(np.median(new))), bound)
    per = "median iteration" if len(iters) > 1 else "window"
    action = ("cut the CPU cost per kernel: capture the step in a CUDA graph "
              "(torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs; for HF generate(), "
              "cache_implementation=\"static\"), or give each launch more work (larger batches)")
    return [Finding(RULE.code, RULE.name, action, Rung.TORCH_COMPILE,
                    {"idle_host_ns": int(host), "launch_and_dispatch_ns_per_iteration":
                     int(np.median(removable)), "iteration_median_ns": int(np.median(iters)),
                     "gpu_floor_ns_per_iteration": int(floor_it)}, gain,
                    f"{per} {np.median(iters) / 1e6:.2f} ms / max(GPU floor {floor_it / 1e6:.2f} ms, "
                    f"{per} - launch calls and dispatch gaps under {RULE.param('dispatch_gap_us'):.0f} us "
                    f"{np.median(removable) / 1e6:.2f} ms); longer host gaps (Python between calls) stay "
                    f"(all host idle removed would be {bound:.2f}x)", bound)]
