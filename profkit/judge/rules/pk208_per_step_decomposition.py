"""PK208 per-step-decomposition: the optimizer decomposes matrices every step.

What
    Matrix decompositions (cuSOLVER's and MAGMA's kernels: eigh's tridiagonal reduction and
    divide and conquer, SVD, Cholesky, LU, QR, their info checks) launched after the iteration's
    backward, by the thread that runs the optimizer step, take ``min_share`` of the iteration or
    more. Second-order optimizers do this (Shampoo's and SOAP's inverse roots, K-FAC's inverses,
    GaLore's projections): an eigendecomposition of a 1024 x 1024 float32 matrix takes
    milliseconds, much of it serial, and each checks its convergence with a copy to the host and
    a stream sync.
Why
    What is decomposed after the backward is the optimizer's state (gradient statistics that move
    slowly, step after step), not the batch: the published optimizers recompute it every N steps
    (Shampoo's preconditioner update frequency, K-FAC's inverse update interval) and reuse the
    last result in between. Decompositions before or inside the backward (a Gaussian process's
    Cholesky of the batch's kernel matrix) are of the data and are left alone: the rule does not
    fire on them.
Evidence
    The decomposition kernels an iteration (their GPU time and launches), found by their names;
    the calls of each decomposition (its launches from the first to the last with no Python
    between them: a gap of 50 us or more between two calls ends one) and the info checks right
    after it (a device-to-host copy and a sync within the next 8 calls).
Fix
    Recompute the decompositions every N steps (``every`` = 10 in the price) and keep their
    results between: a step counter in the optimizer (``if step % N == 0: recompute roots``).
    Where a step must decompose, one batched call over matrices of one size (``torch.linalg.eigh``
    of a stack) issues fewer launches but does the same serial work (an H100: 1.04x measured).
Expected gain
    Graph edit: the decompositions gone (their kernels, launches, CPU time and info checks), and
    that edit taken (N - 1) / N of the way (``blend``): the mean iteration of a cycle of N steps
    in which one decomposes. The matrix products that turn the decompositions into roots and the
    preconditioning itself stay (they are not told apart from the step's other GEMMs): a floor.
    Shampoo over four 1024 x 1024 layers (eight eigh a step, 82% of the step), an H100,
    2026-12-07: 8.44x priced at every 10, measured 8.37x. Staler roots change the optimizer's
    trajectory: check the loss curve.
References
    Gupta, Koren, Singer, "Shampoo: Preconditioned Stochastic Tensor Optimization" (2018);
    Martens, Grosse, "Optimizing Neural Networks with Kronecker-factored Approximate Curvature"
    (2015); cuSOLVER ``syevd``.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import FACTORISATION, Finding, Param, RuleContext, RuleMeta, Table, bare_kernel_name
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import DISPATCH_GAP_NS, blend, drop_cpu, remove_calls, scale_ops, synchronising

RULE = RuleMeta(
    code="PK208", name="per-step-decomposition",
    summary="the optimizer decomposes matrices (eigh, SVD, Cholesky) every step: recompute them every N steps",
    tables=(Table.KERNEL, Table.RUNTIME),
    example="traces/corpus/shampoo_precond_train.sqlite.xz",
    quiet_on="traces/corpus/gp_cholesky_train.sqlite.xz",
    params=(Param("min_share", 0.05, "the decompositions' kernels, as a share of the modelled iteration"),
            Param("every", 10.0, "the steps between recomputations the price assumes")))

# cuSOLVER's and MAGMA's kernels (their names carry the LAPACK routine, or its parameters'
# type: ``transpose<sytrd_params...>``), and the info checks around them
SOLVER_RE = re.compile(FACTORISATION + r"|potri|getri|sytrd|hetrd|laed\d|steqr|stedc|sterf|larf[tb]|syr2k|"
                       r"her2k|syevj|gesvdj|orgtr|ormtr|unmtr|gesdd|gebrd|bdsqr|lansy|lacpy|xx_set_info|"
                       r"copy_info_kernel|setup_vhat", re.I)
# calls after a decomposition looked through for its info check (a copy to the host, a sync)
CHECK_CALLS = 8


def decompositions(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """The solver kernels launched after the iteration's backward by the optimizer's thread, and
    the calls that launched them (empty where there is no backward to place them after)."""
    solver = np.array([bool(SOLVER_RE.search(str(n))) for n in g.op_names] + [False], dtype=bool)
    ops = np.flatnonzero(solver[g.g_name] & (g.g_call >= 0))
    calls = _main_thread_after_backward(g, np.unique(g.g_call[ops])) if len(ops) else np.zeros(0, np.int64)
    return ops[np.isin(g.g_call[ops], calls)], calls


def _main_thread_after_backward(g: StepGraph, calls: np.ndarray) -> np.ndarray:
    """Among ``calls``, those of the thread that issued the iteration's first call, made after
    the last call of any other thread in the iteration (the autograd engine's backward): the
    optimizer step's. An iteration with one thread has no backward to place them after: none."""
    keep = np.zeros(len(calls), dtype=bool)
    for lo, hi in zip(g.iter_call[:-1], g.iter_call[1:]):
        inside = np.arange(lo, hi)
        other = inside[g.c_tid[inside] != g.c_tid[lo]]
        if not len(other):
            continue
        sel = (calls >= lo) & (calls < hi)
        keep |= sel & (calls > other.max()) & (g.c_tid[np.minimum(calls, g.n_calls - 1)] == g.c_tid[lo])
    return calls[keep]


def spans(g: StepGraph, calls: np.ndarray) -> list[tuple[int, int]]:
    """The decompositions: runs of ``calls`` (sorted) on one thread with no Python between them
    (no call between two of them waits ``DISPATCH_GAP_NS`` or more on the CPU before it), as
    (first, last) call indices."""
    out: list[tuple[int, int]] = []
    if not len(calls):
        return out
    start = prev = int(calls[0])
    for c in calls[1:]:
        c = int(c)
        python = (g.c_gap[prev + 1:c + 1] >= DISPATCH_GAP_NS).any() or g.c_tid[c] != g.c_tid[prev]
        if python:
            out.append((start, prev))
            start = c
        prev = c
    out.append((start, prev))
    return out


def _checks(g: StepGraph, last: int) -> np.ndarray:
    """The info check after a decomposition: the syncs and waiting copies among the next
    CHECK_CALLS calls of its thread."""
    nxt = np.arange(last + 1, min(last + 1 + CHECK_CALLS, g.n_calls))
    nxt = nxt[g.c_tid[nxt] == g.c_tid[last]]
    return nxt[synchronising(g)[nxt]]


def without(g: StepGraph, runs: list[tuple[int, int]]) -> StepGraph:
    """The decompositions gone: the operations their calls launched, the calls (the CPU time
    between them too), and their info checks (the copies' operations with them)."""
    body = np.concatenate([np.arange(a, b + 1) for a, b in runs]) if runs else np.zeros(0, np.int64)
    checks = np.concatenate([_checks(g, b) for _, b in runs]) if runs else np.zeros(0, np.int64)
    calls = np.union1d(body, checks)
    ops = g.launched_by(calls)
    out = scale_ops(g, ops, np.inf) if len(ops) else g
    firsts = np.array([a for a, _ in runs], dtype=np.int64)
    # the Python before each decomposition stays (it is the step's own); inside one there is none
    return drop_cpu(remove_calls(out, firsts), np.setdiff1d(calls, firsts))


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None or ctx.iterations == 0:
        return []
    g = m.graph
    its = max(len(g.iter_call) - 1, 1)
    mine, calls = decompositions(g)
    if not len(calls):
        return []   # none, decompositions of the data (forward, backward), or no backward at all
    gpu_ns = float(g.g_dur[mine].sum()) / its
    if gpu_ns < RULE.param("min_share") * m.iteration_ns:
        return []
    runs = spans(g, calls)
    every = RULE.param("every")
    edit = (lambda gr: blend(gr, without(gr, runs), 1.0 - 1.0 / every))
    gain, basis = ctx.price(edit, f"the decompositions after the backward ({gpu_ns / 1e6:.2f} ms of solver kernels "
                                  f"an iteration, their launches, the CPU time between them and their info "
                                  f"checks) done one step in {every:.0f}")
    gone, _ = ctx.price(lambda gr: without(gr, runs), "the decompositions gone")
    # the kernels named by the time they take (cuSOLVER's names carry the routine)
    by_name: dict[str, float] = {}
    for o in mine:
        k = bare_kernel_name(str(g.op_names[g.g_name[o]]))
        k = "_".join(k.split("_")[:3]) if len(k) > 32 else k   # cuBLAS's long kernel names
        by_name[k] = by_name.get(k, 0.0) + float(g.g_dur[o])
    names = sorted(by_name, key=lambda k: -by_name[k])[:4]
    ev = {"decomposition_kernel_ns_per_iteration": int(gpu_ns),
          "decomposition_launches_per_iteration": round(len(mine) / its, 1),
          "share_of_iteration": round(gpu_ns / m.iteration_ns, 3),
          "every": int(every), "without_speedup": round(gone, 3), "kernels": names}
    return [Finding(RULE.code, RULE.name,
                    f"the optimizer step decomposes matrices every step ({len(mine) / its:.0f} solver-kernel launches "
                    f"an iteration after the backward, {gpu_ns / 1e6:.1f} ms: {', '.join(names)}): "
                    f"recompute them every {every:.0f} steps and reuse the last result between (Shampoo's "
                    "preconditioner update frequency, K-FAC's inverse update interval); check the loss curve",
                    Rung.NONE, ev, gain,
                    f"{basis}; without them at all: {gone:.2f}x", max(gain, gone), edit=edit)]
