"""PK502 accumulation-allreduce: gradient accumulation that all-reduces every micro-batch.

What
    A DistributedDataParallel step that accumulates gradients over R micro-batches and lets every
    micro-batch's backward all-reduce every gradient bucket: R rounds of (about) the same
    all-reduces per optimizer step, where only the last round's result is used.
Why
    DDP all-reduces a bucket as soon as its gradients are ready, in every backward, unless told
    not to. With accumulation, rounds 1 to R-1 move the full gradient for nothing: NCCL time,
    launches and DDP's copies, each round's last buckets exposed after its backward, and the SMs
    and memory bandwidth NCCL takes from the backward it overlaps. ``model.no_sync()`` around the
    first R-1 micro-batches keeps their gradients local; the last backward all-reduces the sum.
Evidence
    Per iteration of the window (the optimizer step; each kernel in the iteration that launched
    it), the NCCL AllReduce kernels in launch order
    and the compute (non-NCCL kernels' time) launched between consecutive ones. A gap holding at
    least ``boundary_share`` of the compute launched outside the all-reduces (the optimizer, the
    first forward and the start of its backward) holds a forward: it separates two rounds. An
    iteration has R rounds when R >= 2, every round has the same number of all-reduces with the
    same kernel names in the same order, and every gap inside a round holds at most half the
    smallest gap between rounds; with one all-reduce a round, R >= 3 (two buckets without
    accumulation would look like two rounds of one). It fires when ``min_iterations_share`` of
    the window's iterations have the same R >= 2.
Fix
    ``with model.no_sync():`` around the forward and backward of the first R-1 micro-batches of
    each optimizer step (HF Accelerate: ``accelerator.accumulate(model)``; Lightning does it
    itself). Gradients then accumulate locally; the last micro-batch's backward all-reduces
    their sum, the result unchanged.
Expected gain
    Graph edit: the AllReduce kernels of rounds 1 to R-1 take no time and their launch calls go
    (``scale_ops`` with ``inf`` and ``drop_launches``); the step model replays the step with its
    dependencies (the compute stream waits where it waited for an all-reduce, now for one that
    takes no time) and gives the end-to-end gain at the calibrated CPU scale. Capped at the
    change's own gain: the iteration less the removed kernels' time and their launches' CPU time.
    On a multi-rank job the price is per rank, from that rank's trace: each rank's all-reduces
    include waiting for the others, so the removed time can hold a peer's lateness (a straggler's
    own trace prices less). Limits: bytes are not compared (NCCL's payload is not in the SQLite
    export; a ``{bytes=}`` hint would say them), so two rounds of different buckets with the same
    kernel names count as the same; DDP's copies of the gradients into and out of the buckets in
    the removed rounds are kept (a floor); a step whose rounds are not separated by compute
    (accumulation with all-reduces deferred by hand) is not seen.
References
    PyTorch DDP docs (``no_sync``); PyTorch DDP design notes (gradient bucketing); HF Accelerate,
    gradient accumulation guide.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from profkit.judge import comm
from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table, iteration_bounds

RULE = RuleMeta(
    code="PK502", name="accumulation-allreduce",
    summary="gradient accumulation that all-reduces every micro-batch: model.no_sync() for all but the last",
    tables=(Table.KERNEL, Table.RUNTIME),
    example="a synthetic DDP step of 4 micro-batches (tests/test_rule_pk502.py); no committed trace accumulates",
    quiet_on="traces/ddp2/rank0.sqlite.xz",
    params=(Param("boundary_share", 0.5, "compute between two all-reduces, as a share of the compute "
                  "launched outside them, that marks a new round (a forward between them)"),
            Param("min_iterations_share", 0.75, "share of the iterations that must show the same rounds")))


def rounds_of(names: list[str], gaps: np.ndarray, outside: float, share: float) -> int:
    """How many rounds one iteration's all-reduces (kernel ``names`` in launch order; ``gaps``: the
    compute launched between consecutive ones; ``outside``: the compute launched before the first
    and after the last) come in, by the module docstring's criterion; 1 when they do not split."""
    n = len(names)
    if n < 2 or outside <= 0:
        return 1
    cut = gaps >= share * outside
    r = int(cut.sum()) + 1
    if r < 2 or n % r:
        return 1
    b = n // r
    # the cuts fall every b all-reduces, the rounds are one sequence repeated
    if not np.array_equal(np.flatnonzero(cut), np.arange(b - 1, n - 1, b)):
        return 1
    if any(names[k * b:(k + 1) * b] != names[:b] for k in range(1, r)):
        return 1
    if b == 1 and r < 3:
        return 1
    inner = gaps[~cut]
    if len(inner) and inner.max() > 0.5 * gaps[cut].min():
        return 1
    return r


def detect(ctx: RuleContext) -> list[Finding]:
    names = [n for n in ctx.kernels.index if comm.is_nccl_kernel(n) and comm.collective_of(n) == "AllReduce"]
    if not names or ctx.iterations < 1:
        return []
    a = ctx.acts
    k = a[(a["kind"] == "kernel").to_numpy()]
    nm = k["name"].astype(str).to_numpy()
    nccl = np.array([comm.is_nccl_kernel(x) for x in nm], dtype=bool)
    ar = np.isin(nm, names)
    compute = ~nccl
    bounds = iteration_bounds(ctx.run)
    # iterations are bounded on the CPU's clock (the step's range or its delimiting launch): each
    # kernel goes with the iteration that launched it (its GPU start where the launch is unknown)
    launched = k["api_start"].to_numpy(np.float64)
    launched = np.where(np.isnan(launched), k["start"].to_numpy(np.float64), launched)
    it = np.searchsorted(bounds, launched, side="right") - 1
    corr = k["correlationId"].to_numpy(np.int64)
    dur = k["dur"].to_numpy(np.float64)
    share = RULE.param("boundary_share")
    per_iter: list[int] = []
    removed_idx: list[np.ndarray] = []
    idx = k.index.to_numpy()
    for i in range(len(bounds) - 1):
        mine = it == i
        if not (mine & ar).any():
            per_iter.append(1)
            removed_idx.append(idx[:0])
            continue
        order = np.flatnonzero(mine)[np.argsort(corr[mine], kind="stable")]
        is_ar = ar[order]
        pos = np.flatnonzero(is_ar)
        c_dur = np.where(compute[order], dur[order], 0.0)
        cum = np.concatenate([[0.0], np.cumsum(c_dur)])
        gaps = cum[pos[1:]] - cum[pos[:-1] + 1]
        outside = cum[pos[0]] + (cum[-1] - cum[pos[-1] + 1])
        r = rounds_of(nm[order][pos].tolist(), gaps, outside, share)
        per_iter.append(r)
        b = len(pos) // r
        removed_idx.append(idx[order[pos[:(r - 1) * b]]] if r > 1 else idx[:0])
    if not per_iter:
        return []
    r, seen = Counter(per_iter).most_common(1)[0]
    if r < 2 or seen < RULE.param("min_iterations_share") * len(per_iter):
        return []
    gone = np.concatenate([x for x, ri in zip(removed_idx, per_iter) if ri == r])
    rows = a.loc[gone]
    iters = ctx.iterations
    gone_ns = float(rows["dur"].sum())
    launch_ns = float(np.nansum(rows["api_end"].to_numpy(np.float64) - rows["api_start"].to_numpy(np.float64)))
    base = ctx.baseline_ns
    per_it = (gone_ns + launch_ns) / max(len(per_iter), 1)
    cap = base / max(base - per_it, 1.0) if base > 0 else None
    all_ar = float(k.loc[ar, "dur"].sum())
    b = int(round(ar.sum() / max(len(per_iter), 1) / r))
    g, basis = ctx.price_ops(rows, float("inf"),
                             f"the AllReduce kernels of the first {r - 1} of {r} rounds gone with their launches "
                             f"({ctx.per_iteration(gone_ns)} of NCCL time)", drop_launches=True, cap=cap)
    return [Finding(RULE.code, RULE.name,
                    f"wrap the first {r - 1} of the {r} micro-batches of each optimizer step in "
                    f"`model.no_sync()` (DDP): every backward all-reduces every gradient bucket ({r} rounds "
                    f"of {b} all-reduces a step) where only the last round is used",
                    Rung.LIBRARY,
                    {"rounds": r, "allreduces_per_round": b, "iterations_with_rounds": seen,
                     "iterations": iters, "removed_ns": int(gone_ns), "removed_launch_ns": int(launch_ns)},
                    g, basis, cap if cap is not None else g,
                    all_ar / max(all_ar - gone_ns, 1.0), Scope.OPS, frozenset(names))]
