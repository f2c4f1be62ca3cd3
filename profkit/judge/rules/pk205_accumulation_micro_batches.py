"""PK205 accumulation-micro-batches: a step accumulates gradients over many small micro-batches.

What
    Each step runs the same forward and backward k times on k micro-batches, then the
    optimizer once: gradient accumulation (``loss.backward()`` per micro-batch, HF Trainer's
    ``gradient_accumulation_steps``), usually chosen so that one micro-batch's activations fit.
Why
    Every micro-batch pays the CPU's launches and Python again (and any per-micro-batch sync: a
    logged ``loss.item()``), and its kernels are as small as the micro-batch: a GEMM or a norm
    whose grid fills a fraction of the GPU's SMs takes about as long for twice the rows. Where the
    activations of a larger micro-batch fit, half as many micro-batches of twice the size give
    the same effective batch (the same gradient) with half the launches and fuller kernels.
Evidence
    The step graph's kernels of each modelled iteration in launch order: their GEMM, convolution
    and attention kernels repeat one sequence ``k`` >= 2 times in a row, covering at least 90%
    of the iteration's such kernels (the optimizer's tail has none), and each copy is a forward
    and its backward: launched from the step's thread and then from autograd's, the launches
    switching threads twice a copy. A stack of layers or a loop over timesteps also repeats a
    GEMM sequence, but on one thread (an inference loop), or only in the forward (a training
    step's layers: their backward follows all of them): neither is a micro-batch; nor are copies
    that each launch an optimizer's update before the next one starts (models of their own trained
    one after another: an ensemble's members, PK107's loop). And the gradients accumulate: the
    second copy's backward launches kernels the first's does not, at least one for every six
    matrix kernels of a copy (a layer's forward, input-gradient and weight-gradient GEMMs are
    three, its weight's and bias's gradients two): the adds into the gradients the first left,
    one per parameter (148 on GPT-2's 8 micro-batches, 160 on a ResNet-50's 4), where the first
    backward, the gradients set to None, hands its results over. Evaluations that each start from
    gradients set to None again (LBFGS's closure, 20 a step, each the same forward and backward:
    none) are not micro-batches, and cannot be merged (each needs the last one's step). Every
    modelled iteration must show the same ``k``. A step whose backward runs on its own thread
    (``set_multithreading_enabled(False)``) gives no split and no finding; nor does accumulation
    whose gradients were zeroed in place before the first micro-batch (``zero_grad(set_to_none=False)``,
    torch's default before 2.0: every copy adds, none more than the first).
Fix
    Fewer, larger micro-batches for the same effective batch: ``k/2`` micro-batches of twice the
    size (HF ``per_device_train_batch_size`` x2, ``gradient_accumulation_steps`` /2), if the
    activations fit: check ``torch.cuda.max_memory_allocated()`` against the GPU's memory first,
    and combine with activation checkpointing or bf16 to make room.
Expected gain
    Graph edit: the copies are merged in groups of ``f`` (each power of two that divides ``k``, and
    one micro-batch for the step; the number is halving, ``f`` = 2, unless the calibration run
    measured the memory: then the largest ``f`` whose micro-batch fits, the others said beside it).
    Fits: what the allocator held at a step's start plus ``f`` times what one micro-batch added at
    the run's peak stays within 90% of the GPU's memory (profkit.run.memory: the gradients counted
    with the activations, the warm-up's peak included: the safe side). Where even twice the size
    would not fit, halving stays the number and the action says what it would need. On the bf16
    ResNet below one batch of 128 measured 3.89x where halving, the number, was priced 2.04x: with
    the memory measured, the number is the largest merge that fits (not yet run on a GPU capture:
    the committed ones predate the record; ``tests/test_pk205_memory.py`` writes chosen figures
    into a copy). In
    each group the other copies' calls go with all the CPU time before each (``drop_cpu``: their
    launches, Python and syncs), and their operations are matched to the first copy's by name in
    launch order (``difflib``): a matched kernel becomes one kernel of the group's work, the
    first copy's, taking as many waves as their blocks together need at one resident block per
    SM, each wave as long as one of the first copy's (its time over its own waves), never less
    than the longest of them nor more than all together (the wave model of PK107); a copy or
    memset takes all their times (their bytes). A kernel of another copy with no match (the
    gradient accumulation's adds, which the first micro-batch of a step does not launch) goes.
    The edit merges the durations of the graph it is given, so it composes with another fix
    before it (a fusion). One block per SM is the conservative choice (more waves, less gain),
    and a larger GEMM may also pick a faster kernel: the price is a floor for the GPU's part. The
    step model replays the edit at the calibrated CPU scale. GPT-2 with 8 fp16 micro-batches a
    step (grad_accum_fp16_train, an H100): 2 micro-batches of four times the size measured 1.29x
    without a profiler, priced 1.19x (``to_2_speedup``; the step 9% longer than measured);
    halving is priced 1.13x (not timed). Written after that program's first sight had found no
    rule for it, then judged at first sight on a program it was not built on: a ResNet-50-shaped
    bf16 channels_last CNN with 4 micro-batches of 32 (accum_resnet_train, an H100, host-bound):
    2 micro-batches of 64 priced 2.04x, measured 1.98x; one batch of 128 priced 4.13x (4.00x
    at the baseline step time the fixes were timed against), measured 3.89x.
References
    PyTorch "gradient accumulation" recipes; HF Trainer ``gradient_accumulation_steps``.
"""
from __future__ import annotations

import difflib
import re
from typing import Optional

import numpy as np

from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table
from profkit.judge.rules.pk204_recomputed_forward import MATRIX_RE as PK204_MATRIX_RE
from profkit.judge.rules.pk201_unfused_optimizer import optimizer_step_kernel
from profkit.model import Rung
from profkit.run.memory import step_memory
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import drop_cpu

RULE = RuleMeta(
    code="PK205", name="accumulation-micro-batches",
    summary="gradient accumulation over many small micro-batches: fewer, larger ones where the "
            "activations fit",
    tables=(Table.KERNEL, Table.RUNTIME), example="traces/corpus/grad_accum_fp16_train.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("probe", 8.0, "matrix kernels at the head of the sequence looked for again"),
            Param("min_cover", 0.9, "share of the iteration's matrix kernels the copies cover")))

# GEMM, convolution and attention kernels: what a forward and backward repeat per micro-batch.
MATRIX_RE = re.compile(PK204_MATRIX_RE.pattern + r"|flash|fmha|attention", re.I)


def matrix_names(g: StepGraph) -> np.ndarray:
    """Per kernel name of the graph (and one more, False, for a name id of -1): a matrix kernel."""
    return np.array([bool(MATRIX_RE.search(str(n))) for n in g.op_names] + [False], dtype=bool)


def micro_batches(g: StepGraph, probe: int, min_cover: float,
                  matrix: Optional[np.ndarray] = None) -> list[list[np.ndarray]]:
    """Per modelled iteration, the calls of each micro-batch copy (in launch order), or an empty
    list where the iteration shows none (see the module's Evidence). A copy starts at its first
    matrix kernel; the last ends as many kernels later as the one before it took. ``matrix``:
    matrix_names(g), where the caller has it."""
    matrix = matrix_names(g) if matrix is None else matrix
    kernel = (g.g_kind == 0) & (g.g_call >= 0)
    out: list[list[np.ndarray]] = []
    for i in range(len(g.iter_call) - 1):
        lo, hi = g.iter_call[i], g.iter_call[i + 1]
        ops = np.flatnonzero(kernel & (g.g_call >= lo) & (g.g_call < hi))
        ops = ops[np.argsort(g.g_call[ops], kind="stable")]
        pos = np.flatnonzero(matrix[g.g_name[ops]])
        seq = g.g_name[ops[pos]]
        n = len(seq)
        copies: list[np.ndarray] = []
        for p in range(probe, n // 2 + 1) if n >= 2 * probe else ():
            if not (seq[p:p + probe] == seq[:probe]).all():
                continue
            k = n // p
            if k < 2 or k * p < min_cover * n or not (seq[:k * p].reshape(k, p) == seq[:p]).all():
                continue
            tids = g.c_tid[g.g_call[ops]]
            starts = pos[np.arange(k) * p]
            ends = np.r_[starts[1:], min(starts[-1] + (starts[-1] - starts[-2]), len(ops))]
            # each copy a forward and its backward: two threads, two switches a copy
            both = all(len(np.unique(tids[a:b])) >= 2 for a, b in zip(starts, ends))
            if both and int((np.diff(tids[starts[0]:ends[-1]]) != 0).sum()) <= 2 * k:
                # every call of the copy, any thread: from its first kernel's launch to the next's
                calls = g.g_call[ops[np.r_[starts, min(ends[-1], len(ops) - 1)]]]
                calls[-1] = calls[-1] if ends[-1] < len(ops) else hi
                copies = [np.arange(calls[j], calls[j + 1]) for j in range(k)]
            break
        out.append(copies)
    return out


def accumulation(found: list[list[np.ndarray]]) -> int:
    """The micro-batches every modelled iteration of ``found`` (micro_batches) accumulates over,
    0 where the iterations do not all show the same number of two or more."""
    ks = {len(c) for c in found}
    return ks.pop() if len(ks) == 1 and min(ks) >= 2 else 0


def accumulated(g: StepGraph, probe: int, min_cover: float, matrix: Optional[np.ndarray] = None
                ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]], int]:
    """The micro-batch copies of each modelled iteration (micro_batches), their operations
    (copy_ops; empty where there is no accumulation) and the number every iteration accumulates
    over (accumulation), 0 where an optimizer steps after each copy (stepped_per_copy: models of
    their own trained in a loop, not accumulation)."""
    matrix = matrix_names(g) if matrix is None else matrix
    found = micro_batches(g, probe, min_cover, matrix)
    k = accumulation(found)
    ops = copy_ops(g, found) if k else []
    return found, ops, 0 if k and (stepped_per_copy(g, ops) or not adds_into_gradients(g, ops, matrix)) else k


def adds_into_gradients(g: StepGraph, ops: list[list[np.ndarray]], matrix: np.ndarray) -> bool:
    """Whether, in every modelled iteration, the second copy's backward (the kernels launched off
    the thread of the copy's first call) launches kernels the first copy's does not, one or more
    for every six matrix kernels of the first: the adds into the gradients the first left
    (``ops``: copy_ops). Evaluations that start from gradients set to None again launch none."""
    for row in ops:
        if len(row) < 2:
            return False
        oa, ob = row[0], row[1]
        ma = matrix[g.g_name[oa]] & (g.g_kind[oa] == 0)
        _, ib = align(g.g_name[oa], g.g_name[ob], ma, matrix[g.g_name[ob]] & (g.g_kind[ob] == 0))
        extra = np.setdiff1d(ob, ob[ib])
        extra = extra[(g.g_kind[extra] == 0) & (g.g_call[extra] >= 0)]
        step_thread = g.c_tid[g.g_call[ob[0]]]
        backward = int((g.c_tid[g.g_call[extra]] != step_thread).sum())
        if 6 * backward < int(ma.sum()):
            return False
    return True


def stepped_per_copy(g: StepGraph, ops: list[list[np.ndarray]]) -> bool:
    """Whether, in some modelled iteration, every copy but the last launches an optimizer's update
    (``ops``: copy_ops): each copy's gradients stepped before the next copy's backward, as when
    separate models (an ensemble's members) are trained one after another in a loop. Accumulation
    steps once, after the last copy."""
    step = np.array([optimizer_step_kernel(str(n)) for n in g.op_names] + [False], dtype=bool)
    return any(len(row) >= 2 and all(step[g.g_name[o]].any() for o in row[:-1]) for row in ops)


def merged_ns(ta, tb, ca, cb, slots: int, tmax=None):
    """One kernel doing the work of several: ``ta``/``ca`` the first's time and blocks, ``tb``/``cb``
    the others' times and blocks summed (``tmax`` the longest of all, ``ta``/``tb``'s by default):
    as many waves as all the blocks together need at ``slots`` resident blocks, each as long as
    one of the first's; never less than the longest, never more than all together (their sum
    where a grid is unknown). Element-wise over arrays."""
    ta, tb = np.asarray(ta, dtype=np.float64), np.asarray(tb, dtype=np.float64)
    ca, cb = np.asarray(ca, dtype=np.int64), np.asarray(cb, dtype=np.int64)
    tmax = np.maximum(ta, tb) if tmax is None else np.asarray(tmax, dtype=np.float64)
    known = (ca > 0) & (cb > 0) & (slots > 0)
    s = max(int(slots), 1)
    waves = np.ceil((np.maximum(ca, 1) + np.maximum(cb, 1)) / s) / np.ceil(np.maximum(ca, 1) / s)
    return np.where(known, np.clip(ta * waves, tmax, ta + tb), ta + tb)


def align(a: np.ndarray, b: np.ndarray, cut_a: np.ndarray, cut_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of ``a`` and ``b`` (operation names in launch order) matched to each other:
    the matrix kernels (``cut_*``), the same sequence in both copies, one to one, and the stretches
    between them by ``difflib`` (a stretch that is the same in both, one to one): two copies of
    thousands of operations compared stretch by stretch, not whole."""
    ca, cb = np.flatnonzero(cut_a), np.flatnonzero(cut_b)
    if len(ca) != len(cb) or not (a[ca] == b[cb]).all():
        ca = cb = np.empty(0, dtype=np.int64)   # not cut the same way: compared whole
    ia: list[np.ndarray] = []
    ib: list[np.ndarray] = []
    for (a0, a1), (b0, b1) in zip(zip(np.r_[0, ca], np.r_[ca, len(a)]), zip(np.r_[0, cb], np.r_[cb, len(b)])):
        sa, sb = a[a0:a1], b[b0:b1]
        if len(sa) == len(sb) and (sa == sb).all():
            ia.append(np.arange(a0, a1))
            ib.append(np.arange(b0, b1))
            continue
        sm = difflib.SequenceMatcher(None, sa.tolist(), sb.tolist(), autojunk=False)
        for blk in sm.get_matching_blocks():
            ia.append(np.arange(a0 + blk.a, a0 + blk.a + blk.size))
            ib.append(np.arange(b0 + blk.b, b0 + blk.b + blk.size))
    none = np.empty(0, dtype=np.int64)
    return (np.concatenate(ia) if ia else none), (np.concatenate(ib) if ib else none)


def copy_ops(g: StepGraph, copies: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Per iteration and copy, the operations its calls launched, in the order they started."""
    out = []
    for its in copies:
        row = []
        for calls in its:   # a copy's calls are one stretch: calls[0] .. calls[-1]
            ops = np.flatnonzero((g.g_call >= calls[0]) & (g.g_call <= calls[-1]))
            row.append(ops[np.argsort(g.g_start[ops], kind="stable")])
        out.append(row)
    return out


def merge_edit(g: StepGraph, copies: list[list[np.ndarray]], ops: list[list[np.ndarray]], grid: np.ndarray,
               slots: int, m: int, matrix: np.ndarray, aligned: dict):
    """(the edit, the calls that go, the merged operations' time before and after) for merging
    each iteration's copies by ``m`` (see the module's Expected gain): in each group the first
    copy stays, the others' operations (``ops``: copy_ops) are matched to its own by name in
    launch order (``aligned``: the matches already made, by iteration and copies, which the
    merges by other ``m`` share). The edit merges the times of the graph it is given, so that it
    composes with other fixes' edits (a fusion first)."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    gone: list[np.ndarray] = []
    gone_ops: list[np.ndarray] = []
    for i, its in enumerate(copies):
        for first in range(0, len(its) - m + 1, m):
            oa = ops[i][first]
            for j in range(first + 1, first + m):
                ob = ops[i][j]
                if (i, first, j) not in aligned:
                    aligned[i, first, j] = align(g.g_name[oa], g.g_name[ob],
                                                 matrix[g.g_name[oa]] & (g.g_kind[oa] == 0),
                                                 matrix[g.g_name[ob]] & (g.g_kind[ob] == 0))
                ia, ib = aligned[i, first, j]
                xs.append(oa[ia])
                ys.append(ob[ib])
                gone.append(its[j])
                gone_ops.append(ob)
    x_of_y = np.concatenate(xs) if xs else np.empty(0, dtype=np.int64)
    y = np.concatenate(ys) if ys else np.empty(0, dtype=np.int64)
    x, at = np.unique(x_of_y, return_inverse=True)
    calls = np.concatenate(gone) if gone else np.empty(0, dtype=np.int64)
    b_ops = np.concatenate(gone_ops) if gone_ops else np.empty(0, dtype=np.int64)
    # copies and memsets move the bytes of all: their times summed (no grid, no waves)
    kernel = g.g_kind[x] == 0
    cb = np.where(grid[y] > 0, grid[y], 0)
    blocks = np.bincount(at, weights=cb, minlength=len(x)).astype(np.int64)
    unknown = np.bincount(at, weights=(grid[y] <= 0), minlength=len(x)) > 0
    cx = np.where(kernel & ~unknown, grid[x], -1)

    def merged(gr: StepGraph) -> np.ndarray:
        tb = np.bincount(at, weights=gr.g_dur[y], minlength=len(x))
        tmax = gr.g_dur[x].astype(np.float64).copy()
        np.maximum.at(tmax, at, gr.g_dur[y])
        return merged_ns(gr.g_dur[x], tb, cx, blocks, slots, tmax)

    def edit(gr: StepGraph) -> StepGraph:
        out = gr.copy()
        out.g_dur[x] = merged(gr)
        out.g_dur[b_ops] = 0.0
        out.g_qgap[b_ops] = 0.0
        return drop_cpu(out, calls)
    before = float(g.g_dur[x].sum() + g.g_dur[y].sum())
    return edit, calls, before, float(merged(g).sum())


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None or ctx.iterations == 0:
        return []
    g = m.graph
    matrix = matrix_names(g)
    found, ops, k = accumulated(g, int(RULE.param("probe")), float(RULE.param("min_cover")), matrix)
    if not k:
        return []   # no iteration, or not every modelled iteration, accumulates the same way
    gpu = ctx.prof.full_trace.primary_gpu()
    sm = int(gpu.sm_count or 0) if gpu is not None else 0
    grid = np.full(g.n_ops, -1, dtype=np.int64)   # blocks per kernel, -1 where unknown
    kernels = np.flatnonzero((g.g_kind == 0) & (g.g_call >= 0))
    grid[kernels] = ctx.launch_grids(kernels)
    its = len(found)
    # k/f micro-batches of f times the size: halving (the smallest change, the likeliest to fit)
    # is the number; each power of two that divides k, and one micro-batch, said beside it
    ev: dict = {"micro_batches": k}
    prices = []
    alternatives = {}
    aligned: dict = {}
    for f in sorted({2, k} | {d for d in (4, 8, 16, 32, 64) if d < k and k % d == 0}):
        n = -(-k // f)
        edit, calls, before, after = merge_edit(g, found, ops, grid, sm, f, matrix, aligned)
        gain, basis = ctx.price(edit, f"{k} micro-batches a step -> {n}: in each group of {f} the "
                                      f"others' {len(calls) / its / n:.0f} calls gone with their CPU "
                                      f"time, their operations merged into the first's ({before / its / 1e6:.2f}"
                                      f" -> {after / its / 1e6:.2f} ms of GPU work a step: waves at one block "
                                      "per SM)")
        ev[f"to_{n}_speedup"] = round(gain, 3)
        prices.append((f, gain, basis, before, after, edit))
        alternatives[f"to_{n}_speedup"] = edit
    # The number: halving, unless the calibration run measured the memory a micro-batch takes;
    # then the largest merge whose micro-batch fits
    mem = step_memory(ctx.prof.full_trace.meta.get("calibration"), g.window.delimiter)
    pick = 0
    if mem is not None:
        fitting = [i for i, (f, *_) in enumerate(prices) if mem.fits(f)]
        pick = fitting[-1] if fitting else 0
        ev.update(resident_bytes=int(mem.resident_bytes), micro_batch_bytes=int(mem.step_bytes),
                  device_bytes=int(mem.device_bytes))
    f_pick, gain, basis, before, after, edit = prices[pick]
    ev.update(merged_gpu_ns_per_step=int(after / its), paired_gpu_ns_per_step=int(before / its))
    per_copy = float(np.mean([(g.g_kind[o[0]] == 0).sum() for o in ops]))
    ev["kernels_per_micro_batch"] = round(per_copy, 1)
    others = "; ".join(f"{-(-k // f)} of {f} times the size: {gf:.2f}x" for i, (f, gf, *_) in enumerate(prices)
                       if i != pick)
    n_pick = -(-k // f_pick)
    use = (f"one batch of {f_pick} times the size (no accumulation)" if n_pick == 1 else
           f"{n_pick} micro-batches of {'twice' if f_pick == 2 else f'{f_pick} times'} the size")
    gib = 2 ** 30
    if mem is None:
        memory = (f"the GPU's {gpu.total_memory / gib:.0f} GiB" if gpu is not None and gpu.total_memory
                  else "the GPU's memory")
        fit = f"if the activations fit (check torch.cuda.max_memory_allocated() against {memory})"
        assumes = "it assumes the activations of the larger micro-batch fit"
    elif mem.fits(f_pick):
        fit = (f"which fits: a micro-batch took {mem.step_bytes / gib:.1f} GiB over the "
               f"{mem.resident_bytes / gib:.1f} GiB a step starts with, about {mem.need(f_pick) / gib:.1f} "
               f"GiB at {f_pick} times the size, of the GPU's {mem.device_bytes / gib:.0f} GiB "
               "(measured in the calibration run)")
        assumes = f"the micro-batch of {f_pick} times the size fits, by the memory the calibration run measured"
    else:
        fit = (f"once the activations fit: at twice the size about {mem.need(2) / gib:.1f} GiB of the GPU's "
               f"{mem.device_bytes / gib:.0f} GiB (a micro-batch took {mem.step_bytes / gib:.1f} GiB in the "
               "calibration run); activation checkpointing or bf16 first")
        assumes = "it needs the activations of the larger micro-batch to fit, which they do not as the step stands"
    return [Finding(RULE.code, RULE.name,
                    f"each step accumulates gradients over {k} micro-batches ({per_copy:.0f} kernels "
                    f"each, launched again for every one): use {use} for the same effective batch "
                    f"(the number below{'; ' + others if others else ''}), {fit}", Rung.NONE, ev, gain,
                    f"{basis}; a floor for the GPU's part (a larger GEMM may also pick a faster "
                    f"kernel); {assumes}", gain,
                    scope=Scope.PROGRAM, edit=edit, alternatives=alternatives)]
