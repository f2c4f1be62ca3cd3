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
    CUDA graph alone: per iteration, new = max(GPU busy + GPU-side gaps, iteration - launch-call
    time - short dispatch gaps); gain = median iteration / median new (``cuda_graph_speedup``).
    On generate_llama the old estimate (all host idle removed) said 39x where the static-cache
    variant measured 1.8x per token: most of a decode step's CPU time is outside the launches.

    ``torch.compile(mode="reduce-overhead")`` of eager code (``compile_speedup``, the expected
    gain unless the window already runs Inductor kernels) also fuses, and runs no Python inside
    what it compiled. GPU side: each run of non-library kernels between two library kernels
    (GEMM, convolution, attention, NCCL) becomes one kernel as long as the longest of the run
    (Inductor fuses pointwise ops and reductions between them; on the Llama training step this
    floor said 9.3 -> 4.1 ms of GPU time per step, and the compiled step ran at 4.5 ms a step,
    95% busy). CPU side:
    when the iteration range has ranges inside it (``forward``, ``backward``, ``optimizer``), the
    time outside them stays (the loop's own Python); without such ranges the longer host gaps
    stay as above, and so they do in a data-parallel step (its collectives launch from autograd
    hooks, outside one captured graph). Per iteration, new = max(fused GPU floor, CPU time left).
References
    PyTorch CUDA Graphs docs; ``torch.compile`` modes; HF transformers "Static cache and
    torch.compile" docs; Nsight Systems ``nsys analyze`` rule ``gpu_gaps``.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profkit.model import Rung
from profkit.judge.rules.base import (Finding, Param, RuleContext, RuleMeta, Table, covered_per_interval,
                                iteration_bounds, speedup)
from profkit.run.summary import DATA_RE, GEMM_RE, NCCL_RE
from profkit.run.window import loop_range_mask

# Kernels Inductor wrote: a window where they carry this share of the kernel time is compiled.
INDUCTOR_RE = re.compile(r"^triton_")
COMPILED_SHARE = 0.3
GRAPH_LAUNCH_RE = re.compile(r"^cudaGraphLaunch")

RULE = RuleMeta(
    code="PK103", name="host-overhead",
    summary="the CPU's per-kernel launch cost sets the pace: CUDA graphs, static KV cache, bigger batches",
    tables=(Table.RUNTIME, Table.KERNEL, Table.NVTX), example="traces/real/generate_llama.sqlite.xz",
    quiet_on="traces/real/cnn_infer.sqlite.xz",
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


def _fused_floor(ctx: RuleContext, bounds: np.ndarray) -> tuple[np.ndarray, float]:
    """Per iteration: the GPU time Inductor's fusion would save (each run of non-library kernels
    between library kernels down to its longest kernel); and the share of kernel time that is
    already Inductor's."""
    acts = ctx.acts
    n = len(bounds) - 1
    kern = (acts["kind"].astype(str) == "kernel").to_numpy()
    if not kern.any():
        return np.zeros(n), 0.0
    dev_all = acts["deviceId"].to_numpy()
    dur_all = acts["dur"].to_numpy(np.int64)
    devs, inv = np.unique(dev_all[kern], return_inverse=True)
    dev = devs[np.bincount(inv, weights=dur_all[kern]).argmax()]
    sel = kern & (dev_all == dev)
    codes = acts["name"].cat.codes.to_numpy()[sel]
    names = pd.Series(acts["name"].cat.categories.astype(str))
    order = np.argsort(acts["start"].to_numpy(np.int64)[sel], kind="stable")
    codes, dur = codes[order], dur_all[sel][order]
    api = acts["api_start"].to_numpy("float64")[sel][order]
    lib = (names.str.match(GEMM_RE) | names.str.match(NCCL_RE)).to_numpy()[codes]
    ind = names.str.match(INDUCTOR_RE).to_numpy()[codes]
    inductor_share = float(dur[ind].sum()) / max(float(dur.sum()), 1.0)
    # Runs of consecutive non-library kernels (contiguous in start order): saved = run total - its
    # longest kernel.
    body = ~lib
    if not body.any():
        return np.zeros(n), inductor_share
    rid = np.cumsum(lib)[body]
    db, tb = dur[body], api[body]
    starts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]])
    saved = (np.add.reduceat(db, starts) - np.maximum.reduceat(db, starts)).astype("float64")
    t = np.fmin.reduceat(tb, starts)
    idx = np.searchsorted(bounds, t, side="right") - 1
    ok = (idx >= 0) & (idx < n)
    return np.bincount(idx[ok], weights=saved[ok], minlength=n), inductor_share


def _outside_children(ctx: RuleContext, bounds: np.ndarray) -> np.ndarray | None:
    """Per iteration: the time not covered by user ranges nested in the iteration range (the
    loop's own Python, which compiling the model does not remove); None without such ranges."""
    w = ctx.run.window
    if not w.delimiter or not w.iteration_ns:
        return None
    user = ctx.prof.full_trace.user_ranges
    user = user[loop_range_mask(user["name"])]
    steps = user[user["name"] == w.delimiter]
    kids = user[(user["name"] != w.delimiter) & (user["start"] >= bounds[0]) & (user["end"] <= bounds[-1])]
    # Data loading is not model code: compiling the model leaves it where it is.
    kids = kids[~kids["name"].astype(str).str.contains(DATA_RE)]
    if steps.empty or kids.empty:
        return None
    tid = steps["globalTid"].mode().iat[0]
    kids = kids[kids["globalTid"] == tid].sort_values("start")
    if kids.empty:
        return None
    b = bounds.astype(np.int64)
    out = np.diff(b).astype("float64") - covered_per_interval(
        kids["start"].to_numpy(np.int64), kids["end"].to_numpy(np.int64), b)
    return np.maximum(out, 0.0)


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
    per = "median iteration" if len(iters) > 1 else "window"
    # The iteration's wall time as the window measures it (GPU-side periods, which stay right
    # when the CPU queues work ahead); the per-iteration CPU terms come from the CPU-side bounds.
    it_med = float(r.window.iteration_median_ns or np.median(iters))
    graph_gain = min(speedup(it_med, float(np.median(new))), bound)
    graph_basis = (f"CUDA graph {graph_gain:.2f}x: {per} {it_med / 1e6:.2f} ms / max(GPU floor {floor_it / 1e6:.2f} ms, "
                   f"{per} - launch calls and dispatch gaps under {RULE.param('dispatch_gap_us'):.0f} us "
                   f"{np.median(removable) / 1e6:.2f} ms); longer host gaps (Python between calls) stay "
                   f"(all host idle removed would be {bound:.2f}x)")
    saved, inductor_share = _fused_floor(ctx, bounds)
    # A data-parallel step launches its collectives from autograd hooks, outside what compile
    # captures as one graph: its Python stays, only the fusion counts.
    collectives = bool(ctx.kernels.index.astype(str).str.match(NCCL_RE).any())
    outside = None if collectives else _outside_children(ctx, bounds)
    cpu_left = iters - removable if outside is None else outside
    fused_floor = np.maximum(floor_it - saved, 0.0)
    new_c = np.maximum(fused_floor, cpu_left)
    compile_bound = speedup(wall, max(gpu_floor - float(saved.sum()), 1.0))
    compile_gain = min(speedup(it_med, float(np.median(new_c))), max(compile_bound, graph_gain))
    compiled = inductor_share >= COMPILED_SHARE
    evidence = {"idle_host_ns": int(host), "launch_and_dispatch_ns_per_iteration": int(np.median(removable)),
                "iteration_median_ns": int(it_med), "gpu_floor_ns_per_iteration": int(floor_it),
                "cuda_graph_speedup": round(graph_gain, 3),
                "fusion_saved_ns_per_iteration": int(np.median(saved)),
                "compile_speedup": round(compile_gain, 3), "inductor_kernel_share": round(inductor_share, 3)}
    if compiled or compile_gain <= graph_gain:
        gain, basis, cap = graph_gain, graph_basis, bound
    else:
        left = ("CPU time outside the ranges inside the step" if outside is not None
                else "the longer host gaps")
        gain, cap = compile_gain, max(compile_bound, graph_gain)
        basis = (f"torch.compile(mode=\"reduce-overhead\"): {per} {it_med / 1e6:.2f} ms / max(GPU floor "
                 f"{floor_it / 1e6:.2f} ms - fusion {np.median(saved) / 1e6:.2f} ms (each run of "
                 f"non-library kernels between GEMM/attention/NCCL kernels as one kernel as long as "
                 f"its longest), {left} {np.median(cpu_left) / 1e6:.2f} ms); " + graph_basis)
    action = ("cut the CPU cost per kernel: capture the step in a CUDA graph "
              "(torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs; for HF generate(), "
              "cache_implementation=\"static\"), or give each launch more work (larger batches)")
    g = ctx.prof.trace.api_calls_matching(GRAPH_LAUNCH_RE)
    graphs = int(((g["start"] >= r.window.start_ns) & (g["start"] <= r.window.end_ns)).sum())
    n_it = max(len(iters), 1)
    if graphs >= 0.5 * n_it:
        # Already replaying graphs: what is left is the work launched outside them.
        outside = len(ctx.launches) - graphs
        evidence["graph_launches_per_iteration"] = round(graphs / n_it, 1)
        action = (f"cut the CPU cost of the launches left outside the CUDA graphs the step "
                  f"already replays ({graphs / n_it:.1f} graph launches and {outside / n_it:.0f} "
                  "other launches per iteration): capture more of the step (in HF generate(), "
                  "logits processing and sampling run eager between graph replays), or give "
                  "each launch more work (larger batches)")
    return [Finding(RULE.code, RULE.name, action, Rung.TORCH_COMPILE, evidence, gain, basis, cap)]
