"""PK307 underfilled-grid: a long kernel launched on a few blocks, so most of the GPU's SMs sit idle.

What
    Kernels of ``min_kernel_us`` or more, launched with at most ``max_grid_share`` as many blocks
    (gridX x gridY x gridZ) as the GPU has SMs, together ``min_gpu_share`` of the step's GPU time
    or more. A kernel with one block runs on one SM of 132 (an H100 or H200): whatever it does,
    it does at a 132nd of the machine. PyTorch's ``kthvalue`` and ``median`` of one slice are such
    kernels (``gatherKthValue``, ``gatherMedian``: one block per slice, radix-selecting through
    the whole slice in 2-bit passes), and so is a hand-written kernel launched with a grid of one.
Why
    Neither the compute nor the memory roof applies: the kernel is bound by the parallelism it was
    given. It is not a launch problem either (it runs for milliseconds). Fusing it with its
    neighbours changes nothing; the fix is an algorithm that uses the whole GPU.
Evidence
    Each kernel's grid, from the trace's kernel table; the GPU's SM count (TARGET_INFO_GPU).
    ``kernels``: the names, ``blocks`` the median grid of each, ``underfilled_ns_per_iteration``
    their time. The op table reads the same kernels (profkit.judge.grid): an op with half its
    kernel time or more in them is ``latency``-bound there, priced by the same edit.
Fix
    A device-wide algorithm for the same result: for a global k-th value or quantile, ``torch.sort``
    of the values (CUB's device-wide radix sort) or ``torch.topk``, or the threshold from a random
    sample; for a reduction, a split over many blocks (``torch.sum`` does this); for a kernel of
    your own, a grid of at least one block per SM. Or compute it less often (a pruning threshold
    every 100 steps), which the trace cannot price. No trial: the fix is another algorithm in the
    program's code.
Expected gain
    A graph edit, replayed by the step model: each such kernel runs as if every SM did what its
    blocks did (its time x blocks / SMs, never below ``floor_us``). That assumes the work spreads
    evenly and the lone blocks were not near the memory roof themselves (a kernel that streams
    at a block's rate on every SM); a replacement that does other work (a sort instead of a
    selection) takes what it takes. Global magnitude pruning of a 23 M-weight GPT, its threshold
    ``kthvalue`` over all magnitudes every step (w_global_prune_train.py, an H100, 2026-12-07):
    ``gatherKthValue`` on one block of 1,024 threads, 115 ms of a 116 ms step under the profiler
    (about 74 ms of 82.5 without it, later in the run: the selection's time follows the weights'
    values, and fell over the first iterations); priced 17.1x on the 14 iterations it was scored
    on, 20.3x on its committed capture (their first 3); the threshold from ``torch.sort`` measured
    8.64x, the threshold every 100 steps 9.50x (interleaved in one process). The price's step
    after the fix (6.9 ms) is near the measured one (8.7-9.6 ms); the miss is the baseline, which
    the profiled iterations show slower than the timed run. At first sight (before this rule)
    its top action was a 4.21x fusion of the pruning range's five kernels; measured under 1.01x
    by the compile trial.
References
    PyTorch ``aten/src/ATen/native/cuda/Sorting.cu`` (``gatherKthValue``: one block per slice);
    CUB ``DeviceRadixSort``; CUDA C++ Best Practices Guide, "Occupancy".
"""
from __future__ import annotations

import re

import numpy as np

from profkit.judge import grid
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table, bare_kernel_name
from profkit.model import Rung
from profkit.run.step.fusion import LIBRARY_RE
from profkit.run.step.transform import replace_ops

RULE = RuleMeta(
    code="PK307", name="underfilled-grid",
    summary="a long kernel on a few blocks: most of the GPU's SMs idle while it runs",
    tables=(Table.KERNEL,), example="traces/corpus/global_prune_train.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_kernel_us", grid.MIN_KERNEL_NS / 1e3, "each kernel at least this long"),
            Param("max_grid_share", grid.MAX_GRID_SHARE, "blocks at most this share of the SMs"),
            Param("min_gpu_share", 0.05, "their share of the step's GPU time"),
            Param("floor_us", grid.FLOOR_NS / 1e3, "no kernel priced shorter than this")))

# Single-slice selections and what replaces them across the whole GPU
HINTS = ((re.compile(r"gatherKthValue|gatherMedian", re.I),
          "the k-th value from torch.sort (CUB's device-wide radix sort) or torch.topk, or from a random "
          "sample (kthvalue and median run one block a slice)"),)


def short(name: str) -> str:
    """A demangled kernel name without its namespaces, template and parameter lists."""
    return bare_kernel_name(name).rsplit("::", 1)[-1].strip() or name


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None:
        return []
    g = m.graph
    sm = ctx.prof.full_trace.primary_gpu().sm_count
    if not sm:
        return []
    ops = np.flatnonzero(g.g_kind == 0)
    if not len(ops):
        return []
    dur = g.g_dur[ops]
    # (the names and the library check once per kernel name, for the long kernels alone)
    names = np.array([str(n) for n in g.op_names] + [""], dtype=object)
    library = np.array([bool(LIBRARY_RE.search(n)) for n in names], dtype=bool)
    name_of = np.where(g.g_name[ops] >= 0, g.g_name[ops], len(g.op_names))
    # a library's kernel with a small grid is its own choice (NCCL's channels, a split GEMM)
    cand = np.flatnonzero((dur >= RULE.param("min_kernel_us") * 1e3) & ~library[name_of])
    if not len(cand):
        return []
    grids = ctx.launch_grids(ops[cand])
    few = grid.few_blocks(grids, sm, RULE.param("max_grid_share"))
    hit, blocks = cand[few], grids[few]
    total = float(dur.sum())
    under = float(dur[hit].sum())
    if not len(hit) or under < RULE.param("min_gpu_share") * total:
        return []
    hit_names = names[name_of[hit]]
    floor = RULE.param("floor_us") * 1e3
    new = grid.spread_ns(dur[hit], blocks, sm, floor)
    op_gain = under / float(new.sum())
    its = max(len(g.iter_call) - 1, 1)
    kernels = sorted(set(hit_names))
    med = {k: int(np.median(blocks[hit_names == k])) for k in kernels}
    per_kernel = {k: float(dur[hit][hit_names == k].sum()) for k in kernels}
    ev = {"kernels": [short(k) for k in kernels], "blocks": {short(k): b for k, b in med.items()}, "sm_count": int(sm),
          "underfilled_ns_per_iteration": int(under / its), "full_grid_ns_per_iteration": int(new.sum() / its)}
    gain, basis = ctx.price(lambda gr: replace_ops(gr, [np.array([o]) for o in ops[hit]], new),
                            f"{len(kernels)} kernel(s) on at most {max(med.values())} block(s) of the "
                            f"{sm} SMs ({under / its / 1e6:.2f} ms an iteration) as if every SM did what "
                            f"their blocks did ({float(new.sum()) / its / 1e6:.2f} ms)", cap=op_gain)
    worst = max(kernels, key=per_kernel.__getitem__)
    hint = next((h for rx, h in HINTS if rx.search(worst)), None)
    what = hint or ("an algorithm that spreads the work over the whole GPU (at least one block per SM; a "
                    "reduction split over many blocks)")
    action = (f"{short(worst)} runs {per_kernel[worst] / its / 1e6:.1f} ms an iteration on "
              f"{med[worst]} block(s) of the GPU's {sm} SMs, using {med[worst] / sm:.1%} of it: replace it "
              f"with {what}; or compute it less often")
    return [Finding(RULE.code, RULE.name, action, Rung.LIBRARY, ev, gain, basis, op_gain, op_gain,
                    Scope.OPS, frozenset(kernels))]
