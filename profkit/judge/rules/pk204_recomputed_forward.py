"""PK204 recomputed-forward: the backward runs stretches of the forward again (activation checkpointing).

What
    In each step, kernel sequences of the forward launched again during the backward: what
    activation (gradient) checkpointing does, ``torch.utils.checkpoint`` or HF
    ``gradient_checkpointing_enable()``, which keeps only each block's input and recomputes its
    forward when the backward reaches it.
Why
    Checkpointing trades compute for memory: the recomputed forward is work the step does twice
    (about a third more for a transformer whose every layer is checkpointed). Where the
    activations fit in memory (a smaller model, a smaller batch, a larger GPU than the recipe was
    written for), turning it off, or checkpointing fewer layers, gives that time back.
Evidence
    The step graph's kernels of each modelled iteration, split by the CPU thread that launched
    them: the forward is the launching thread's kernels before the first kernel that autograd's
    own thread launches (PyTorch runs a CUDA backward on a thread of its own), the backward that
    thread's kernels. A backward kernel is recomputed forward where it lies in a run of
    ``min_run`` or more kernels whose names follow each other in that order in the forward, the
    run holding at least ``min_distinct`` distinct names that are not GEMM or convolution
    kernels (a backward's own GEMMs may share a forward GEMM's kernel name, its elementwise
    and normalisation kernels do not: the gradient of an op is another kernel), nor the
    scatter-add's (a gather's gradient is a scatter-add, so its sort and indexing kernels, and
    the fills and ranges around them, are the forward's too where the forward scatters: a mesh
    network's deterministic ``index_add_``). A library
    kernel right after a recomputed stretch whose name also follows that stretch in the forward
    (the backward's first GEMM, the next layer's first GEMM) is counted with it: one kernel a
    block too many at most. A step whose
    backward runs on the launching thread (``set_multithreading_enabled(False)``) gives no
    split and no finding.
Fix
    Turn checkpointing off (``model.gradient_checkpointing_disable()``, no
    ``torch.utils.checkpoint``) if the activations fit; else checkpoint fewer blocks (every other
    layer), or ``torch.compile``'s activation-memory budget (``torch._functorch.config.
    activation_memory_budget``), which recomputes only the cheap ops.
Expected gain
    Graph edit (``scale_ops`` with the launches dropped, and ``drop_cpu``): the
    recomputed kernels take no time, and the CPU time that launched them goes: on the backward's
    thread, every call after its previous kernel launch up to the next launch after a stretch
    (the checkpoint's re-entry, the forward's Python run again and the nested backward it starts
    on the recomputed graph), and the memsets those calls made. The step
    model replays the step at the calibrated CPU scale. On a host-bound step the Python is most
    of it: an HF Llama of 16 checkpointed layers (grad_checkpoint_train) was priced 1.07x with the
    kernels and their launch calls alone, 1.35x with this CPU time (1.38x on its first-sight
    capture), measured 1.62x: no ceiling, since the checkpoint's own work outside the recomputed
    stretch (its saved-tensor hooks, the RNG state it keeps) stays in the price. It assumes the
    activations fit: a step near the memory limit may slow down in the allocator without
    checkpointing (or not run at all).
References
    Chen et al., Training Deep Nets with Sublinear Memory Cost (2016); PyTorch
    ``torch.utils.checkpoint`` docs; HF ``gradient_checkpointing_enable``.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import drop_cpu, scale_ops

RULE = RuleMeta(
    code="PK204", name="recomputed-forward",
    summary="the backward recomputes the forward (activation checkpointing): turn it off where "
            "the activations fit",
    tables=(Table.KERNEL, Table.RUNTIME), example="traces/corpus/grad_checkpoint_train.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_run", 8.0, "forward kernels in a row, in the forward's order, that a "
                                  "backward stretch must repeat"),
            Param("min_distinct", 3.0, "distinct names in such a run that are not GEMM or "
                                       "convolution kernels"),
            Param("min_share", 0.03, "the recomputed kernels' share of the modelled GPU time")))

# Kernels whose name a backward's own work may share with the forward's: a GEMM's library kernel
# (chosen by shape, not by direction; PK205 counts matrix work with this pattern too), and
# (SCATTER_RE) the scatter-add machinery with the fills and ranges around it: a gather's gradient
# is a scatter-add, and under use_deterministic_algorithms an index_add_ in the forward and a
# gather's backward both sort their indices with CUB and add with indexing_backward_kernel (a
# mesh network's 24 of each a step read as a recomputed forward at 1.04x, with no checkpoint in it).
MATRIX_RE = re.compile(r"gemm|gemv|cublas|cutlass|nvjet|sm\d+_xmma|conv|cudnn|wgrad|dgrad|"
                       r"implicit_convolve|winograd", re.I)
SCATTER_RE = re.compile(r"radix_?sort|cub::|indexing_backward_kernel|FillFunctor|arange", re.I)


def recomputed(g: StepGraph, min_run: int, min_distinct: int) -> np.ndarray:
    """Mask over the graph's operations: backward kernels that repeat a run of the forward's
    (see the module's Evidence)."""
    out = np.zeros(g.n_ops, dtype=bool)
    shared = np.array([bool(MATRIX_RE.search(str(n)) or SCATTER_RE.search(str(n))) for n in g.op_names],
                      dtype=bool)
    kernel = (g.g_kind == 0) & (g.g_call >= 0)
    tid = np.where(g.g_call >= 0, g.c_tid[np.maximum(g.g_call, 0)], -1)
    it = np.searchsorted(g.iter_call, np.maximum(g.g_call, 0), side="right") - 1
    for i in range(len(g.iter_call) - 1):
        ops = np.flatnonzero(kernel & (it == i))
        if len(ops) < 2 * min_run:
            continue
        ops = ops[np.argsort(g.g_call[ops], kind="stable")]   # launch order
        main = tid[ops[0]]
        other = np.flatnonzero(tid[ops] != main)
        if not len(other):
            continue   # one thread: no forward/backward split to read
        fwd = ops[:other[0]]
        bwd = ops[other[0]:][tid[ops[other[0]:]] != main]
        if len(fwd) < min_run or len(bwd) < min_run:
            continue
        grams = {tuple(g.g_name[fwd[k:k + min_run]].tolist()) for k in range(len(fwd) - min_run + 1)}
        names = g.g_name[bwd]
        hit = np.zeros(len(bwd), dtype=bool)
        for k in range(len(bwd) - min_run + 1):
            gram = names[k:k + min_run]
            if tuple(gram.tolist()) in grams and \
                    len({n for n in gram.tolist() if not shared[n]}) >= min_distinct:
                hit[k:k + min_run] = True
        # A block's recomputed forward is one stretch: a few of its kernels between two matched
        # runs (a library kernel chosen anew, a short sequence the grams missed) belong to it
        # when the forward launched kernels of those names too.
        forward_names = np.zeros(len(g.op_names), dtype=bool)
        forward_names[g.g_name[fwd]] = True
        pos = np.flatnonzero(hit)
        for a, b in zip(pos[:-1], pos[1:]):
            if 1 < b - a <= min_run and forward_names[names[a + 1:b]].all():
                hit[a + 1:b] = True
        out[bwd[hit]] = True
    return out


def recompute_cpu(g: StepGraph, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(the calls whose CPU time is the recomputation, the kernel launch right after each
    stretch, the thread's usual CPU gap before a kernel launch: the median). On the thread that
    launched ``ops``: every call after the thread's previous kernel
    launch up to the next kernel launch after each stretch: the checkpoint's re-entry (RNG state
    restored, inputs detached), the forward's Python run again, and the nested backward it starts
    on the recomputed graph (0.43 ms a layer in an HF Llama, against a fraction of a microsecond
    between two launches of one backward). A stretch ends at a launch of another kernel; the CPU
    time right before that launch is the nested backward's too, down to the thread's usual gap
    before a launch (the caller caps it)."""
    none = np.empty(0, dtype=np.int64)
    launches = np.unique(g.g_call[ops[g.g_call[ops] >= 0]])
    if not len(launches):
        return none, none, 0.0
    recomputing = np.zeros(g.n_calls, dtype=bool)
    recomputing[launches] = True
    launching = np.zeros(g.n_calls, dtype=bool)   # kernels: a memset between two (a GEMM's workspace) is the stretch's
    launching[g.g_call[(g.g_call >= 0) & (g.g_kind == 0)]] = True
    out, resumed = [], []
    tids = np.unique(g.c_tid[launches])
    threads = np.isin(g.c_tid, tids)
    usual = float(np.median(g.c_gap[launching & threads])) if (launching & threads).any() else 0.0
    for tid in tids:
        same = np.flatnonzero(g.c_tid == tid)
        start, before = None, -1
        for c in same[launching[same] | recomputing[same]]:
            if recomputing[c]:
                start = c if start is None else start
                last = c
                continue
            if start is not None:
                out.append(same[(same > before) & (same < c)])
                resumed.append(c)
                start = None
            before = c
        if start is not None:
            out.append(same[(same > before) & (same <= last)])
    return (np.concatenate(out) if out else none), np.asarray(resumed, dtype=np.int64), usual


def detect(ctx: RuleContext) -> list[Finding]:
    model = ctx.model
    if model is None:
        return []
    g = model.graph
    mask = recomputed(g, int(RULE.param("min_run")), int(RULE.param("min_distinct")))
    ops = np.flatnonzero(mask)
    n_kernels = len(ops)
    busy = float(g.g_dur[(g.g_kind == 0) & (g.g_call >= 0)].sum())
    again = float(g.g_dur[ops].sum())
    if not len(ops) or busy <= 0 or again < RULE.param("min_share") * busy:
        return []
    its = max(len(g.iter_call) - 1, 1)
    cpu, resumed, usual = recompute_cpu(g, ops)
    within = np.zeros(g.n_calls, dtype=bool)
    within[cpu] = True
    # the memsets and copies those calls made (a GEMM's workspace zeroed) go with them
    ops = np.union1d(ops, np.flatnonzero((g.g_call >= 0) & (g.g_kind != 0) & within[np.maximum(g.g_call, 0)]))
    cpu_ns = float(g.c_gap[cpu].sum() + g.c_own[cpu].sum()
                   + np.clip(g.c_gap[resumed] - usual, 0.0, None).sum())

    def edit(gr: StepGraph) -> StepGraph:
        out = drop_cpu(scale_ops(gr, ops, float("inf"), True), cpu)
        out.c_gap[resumed] = np.minimum(out.c_gap[resumed], usual)
        return out
    gain, basis = ctx.price(edit,
                            f"the {n_kernels / its:.0f} recomputed forward kernels an iteration "
                            f"({again / its / 1e6:.2f} ms of {busy / its / 1e6:.2f} ms of kernels) gone "
                            f"with the CPU time that launched them ({cpu_ns / its / 1e6:.2f} ms an "
                            "iteration as profiled: the forward's Python run again, and the "
                            "nested backward it starts)")
    return [Finding(RULE.code, RULE.name,
                    f"the backward recomputes {again / busy:.0%} of the step's kernel time of forward "
                    "(activation checkpointing): if the activations fit, turn it off "
                    "(model.gradient_checkpointing_disable(), no torch.utils.checkpoint), else "
                    "checkpoint fewer blocks", Rung.NONE,
                    {"recomputed_kernels_per_iteration": round(n_kernels / its, 1),
                     "recomputed_ns_per_iteration": int(again / its),
                     "kernel_ns_per_iteration": int(busy / its),
                     "recompute_cpu_ns_per_iteration_profiled": int(cpu_ns / its)},
                    gain, f"{basis}; it assumes the activations fit in memory, and keeps the checkpoint's own work "
                          "outside the recomputation (a floor for the host's part)", gain,
                    scope=Scope.PROGRAM)]
