"""What ``torch.compile`` can fuse in a step, and what the fused kernels cost: the graph edit behind
every compile price.

Inductor fuses chains of pointwise and reduction ops inside one compiled graph into one kernel. It
fuses nothing else, so a run of the step's kernels is a fusion candidate only while all of this
holds (``fusible_runs``):

* the kernels are the framework's own elementwise, reduction and normalisation kernels over real
  numbers (an op on complex tensors, ``c10::complex`` in its kernel's name, is left to its eager
  kernel: Inductor writes none for complex dtypes); library kernels (cuBLAS/cuBLASLt GEMMs,
  cuDNN convolutions and normalisations, flash/cuDNN attention, CUB sorts and scans, NCCL) stay
  library kernels, kernels Inductor already wrote (``triton_*``) are fused already, and the
  optimizer's multi-tensor kernels belong to ``optimizer.step()``, which ``torch.compile(model)``
  does not compile (its own fix is ``fused=True``);
* they are one stream's, launched one after the other in one iteration (a compiled graph runs
  once a call of the model) and under the same innermost NVTX range of the program (forward and
  backward are separate graphs; the optimizer's and the data loader's ranges hold no candidate);
* no blocking call lies between their launches: a synchronisation (``.item()``, a device-to-host
  copy) is a graph break, and Inductor fuses nothing across it;
* a batch norm's statistics in training (``batch_norm_collect_statistics``, the backward's
  ``batch_norm_backward_reduce``) end a run: they reduce over the whole batch, more than one
  block holds, so Inductor ends a kernel there and what uses them is another pass over the
  tensor. Fused across them, ResNet-50's training step (native batch norm, bf16) was priced
  1.63x for ``torch.compile``'s default mode and 1.69x for ``reduce-overhead``, measured 1.08x
  and 1.47x; with the cut, 1.28x and 1.31x (no test of it).

A fused kernel is never faster than its bytes (``fused_ns``). The candidates are memory-bound
kernels over the tensors of one chain: fused, the chain reads its inputs and writes its outputs
once, the intermediates staying in registers, which is about the traffic of its longest kernel (a
read and a write of the chain's largest tensor): the run is priced at its longest kernel, never
less. That assumes the intermediates die inside the chain; where one is needed later as well (a
residual sum that feeds the next layer), the fused kernel writes it too and is slower than this:
PK401, which knows the add + RMSNorm pattern, prices that pair's fusion at 4 passes of 5 (1.25x on
``traces/micro_addnorm``, where this price is 1.89x). A run never spans two iterations: before
this was so, the whole window's kernels of a loop with no library kernel became one, and a
micro-benchmark was promised 575x. A run that ends in a reduction to almost nothing writes less
than its longest kernel: a cross-entropy's float32 log-softmax, with the upcast before it and the
gradient's zeroing and downcast around its backward, fuses into a loss that reads the logits
once forward and once backward, writing only their gradient (``loss_groups``, PK203's edit too):
such a run is priced at those passes (and at least at its other kernels). An HF Llama step with
a 128k vocabulary, compiled with its loss (an H100, 2026-12-07): 1.28x before, 1.53x with it,
measured 1.68x; GPT-2 fp16 with 8 micro-batches, the default mode: 1.72x before, 1.82x (1.75x
at a module graph's call cost), its capture's trial 1.81x (an H100, 2026-12-05).
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

from profkit.run.step.graph import CallKind, StepGraph
from profkit.run.step.transform import add_cpu, synchronising
from profkit.run.summary import DATA_RE, GEMM_RE, NCCL_RE

# Kernels over complex numbers (c10::complex<float> in a kernel's template arguments). Inductor
# writes no kernel for complex dtypes: an op on complex tensors runs as its eager kernel inside the
# compiled graph (where compiling it does not fail outright: an FNO's spectral layers, torch 2.11,
# InductorError KeyError 'complex64').
COMPLEX_RE = re.compile(r"complex<", re.I)
# Kernels no compiler fuses: libraries, Inductor's own, the optimizer's multi-tensor kernels, and
# kernels over complex numbers.
LIBRARY_RE = re.compile(
    GEMM_RE.pattern[2:] + r"|" + NCCL_RE.pattern[2:] +
    r"|cub::|cub_|DeviceRadixSort|DeviceScan|DeviceReduce|DeviceSelect|DeviceSegmented|DeviceHistogram"
    r"|bn_fw|bn_bw|batchnorm_fw|batchnorm_bw|cudnn|nchwToNhwc|nhwcToNchw|gemv|dot_kernel|splitK"
    r"|^triton_|multi_tensor_apply|Fused(Adam|AdamW|Sgd|SGD|Adagrad)|" + COMPLEX_RE.pattern, re.I)
# The optimizer step and code around it that torch.compile(model) does not compile.
OUTSIDE_MODEL_RE = re.compile(r"optim|adam|sgd|zero_grad|clip_grad|lr_sched|scheduler|\bema\b|"
                              r"ema_update|log\b|metric", re.I)
# PyTorch's batch-norm kernels that reduce over the batch (training): a fused run ends after them.
BN_STATS_RE = re.compile(r"batch_norm_collect_statistics|batch_norm_backward_reduce|welford", re.I)


# A float32 log-softmax (a cross-entropy over float32 logits) and the logits-sized passes beside
# it: what a fused loss (Inductor's, Liger's) replaces, priced by the passes it makes over the
# logits (loss_groups; PK203 prices the same edit)
LOGSOFTMAX_RE = re.compile(r"SoftMax(?:Forward|Backward)\w*<[^>]*?float, float, float, .*?LogSoftMax", re.I)
# the logits-sized passes beside the log-softmax: casts (copies) and the zeroed gradient (a fill)
COPY_RE = re.compile(r"copy_kernel|LoadWithCast|StoreWithCast", re.I)
FILL_RE = re.compile(r"FillFunctor", re.I)
TINY = 0.05       # kernels under this share of the log-softmax's time between it and a pass (NLL's)
LOOK = 4          # kernels looked through on each side
# a pass over the logits shorter than this is a kernel's launch and tail, not its bytes: such a
# loss (a small vocabulary, a loss per sample) is priced as any run, at its longest kernel
MIN_PASS_NS = 10_000.0


def _passes(g: StepGraph, o: int, before: tuple, after: tuple) -> list[int]:
    """Operation ``o`` (a log-softmax) and the logits-sized kernels next to it on its stream:
    ``before``/``after`` are (pattern, least share of o's time) looked for on that side, the
    small kernels between skipped."""
    same = np.flatnonzero((g.g_stream == g.g_stream[o]) & (g.g_kind == 0))
    same = same[np.argsort(g.g_start[same], kind="stable")]
    i = int(np.searchsorted(g.g_start[same], g.g_start[o]))
    while i < len(same) and same[i] != o:
        i += 1
    out = [o]
    for side, step in ((before, -1), (after, 1)):
        j = i + step
        for _ in range(LOOK):
            if not side or j < 0 or j >= len(same):
                break
            q = same[j]
            name = str(g.op_names[g.g_name[q]])
            if g.g_dur[q] < TINY * g.g_dur[o]:
                j += step
                continue
            if any(p.search(name) and g.g_dur[q] >= share * g.g_dur[o] for p, share in side):
                out.append(int(q))
                j += step
                continue
            break
    return out


def loss_groups(g: StepGraph) -> tuple[list[np.ndarray], np.ndarray, float]:
    """Per iteration, a float32 cross-entropy's forward group (the upcast, the log-softmax forward) and backward
    group (the zeroed gradient, the backward, the downcast), the time of each fused, and the
    eager kernels' time over the fused ones' (PK203's price: see its --explain)."""
    is_ls = np.array([bool(LOGSOFTMAX_RE.search(str(n))) for n in g.op_names] + [False], dtype=bool)
    ops = np.flatnonzero(is_ls[g.g_name] & (g.g_kind == 0))
    fwd = [o for o in ops if "Forward" in str(g.op_names[g.g_name[o]])]
    bwd = [o for o in ops if "Backward" in str(g.op_names[g.g_name[o]])]
    if not fwd:
        return [], np.zeros(0), 1.0
    pass_ns = float(np.median(g.g_dur[fwd])) / 2.0
    if pass_ns < MIN_PASS_NS:
        return [], np.zeros(0), 1.0
    out, new = [], []
    upcast = False
    for o in fwd:
        grp = _passes(g, o, ((COPY_RE, 0.2),), ())
        upcast = upcast or len(grp) > 1
        out.append(np.asarray(grp, dtype=np.int64))
    fused_fwd, fused_bwd = (0.5, 1.0) if upcast else (1.0, 2.0)
    new += [fused_fwd * pass_ns] * len(out)
    for o in bwd:
        out.append(np.asarray(_passes(g, o, ((FILL_RE, 0.1),), ((COPY_RE, 0.2),)), dtype=np.int64))
        new.append(fused_bwd * pass_ns)
    # never slower than the eager kernels (a backward over fewer tokens than the median forward)
    new = [min(ns, float(g.g_dur[grp].sum())) for grp, ns in zip(out, new)]
    eager = float(sum(g.g_dur[grp].sum() for grp in out))
    return out, np.asarray(new), eager / max(float(sum(new)), 1e-9)


def candidates(g: StepGraph, anywhere: bool = False, also: Optional[np.ndarray] = None) -> np.ndarray:
    """Per operation: whether torch.compile of the model could fuse it (see the module docstring):
    a kernel of the window, not a library's, Inductor's or the optimizer's, launched outside the
    optimizer's and the data loader's ranges (``anywhere``: in any range, for torch.compile of
    the code around a kernel wherever it runs; ``also``: per operation, library kernels the
    compiled graph no longer runs, such as the BatchNorm that freezing folds into the
    convolutions, which then join the run around them)."""
    names = np.array([bool(LIBRARY_RE.search(str(n))) for n in g.op_names] + [True], dtype=bool)
    lib = names[np.where(g.g_name >= 0, g.g_name, len(g.op_names))]
    rng = np.array([bool(OUTSIDE_MODEL_RE.search(str(r)) or DATA_RE.search(str(r))) for r in g.range_names]
                   + [False], dtype=bool)
    call = np.maximum(g.g_call, 0)
    outside = rng[np.where(g.g_call >= 0, g.c_range[call], len(g.range_names))] & (not anywhere)
    pick = ~lib & ~outside if also is None else (~lib & ~outside) | also
    return (g.g_kind == 0) & (g.g_call >= 0) & pick


def fusible_runs(g: StepGraph, anywhere: bool = False, also: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """The runs of two or more candidate operations that one compiled graph would fuse, each in
    stream order: consecutive on their stream, in one iteration, under one range, with no blocking
    call launched between them (``anywhere``, ``also``: see candidates)."""
    cand = candidates(g, anywhere, also)
    ops = np.flatnonzero(g.g_kind == 0)
    if not len(ops):
        return []
    ops = ops[np.lexsort((g.g_start[ops], g.g_stream[ops]))]
    call = np.maximum(g.g_call[ops], 0)
    it = np.searchsorted(g.iter_call, call, side="right")
    blocking = synchronising(g)
    breaks = np.cumsum(blocking)  # blocking calls up to and including each call
    c = cand[ops]
    # A batch norm's statistics are a reduction over the whole batch, too large for one block:
    # Inductor ends a kernel there, and what uses them is the next kernel's pass over the tensor
    stats = np.array([bool(BN_STATS_RE.search(str(n))) for n in g.op_names] + [False], dtype=bool)
    ends = stats[np.where(g.g_name[ops] >= 0, g.g_name[ops], len(g.op_names))]
    same = np.r_[False, (g.g_stream[ops][1:] == g.g_stream[ops][:-1]) & c[1:] & c[:-1] & ~ends[:-1]
                 & (it[1:] == it[:-1]) & (g.c_range[call][1:] == g.c_range[call][:-1])
                 & (breaks[call][1:] == breaks[call][:-1])]
    # a run starts at every candidate not joined to its predecessor
    start = c & ~same
    rid = np.cumsum(start)
    rid[~c] = 0
    out = []
    if not c.any():
        return out
    order = np.argsort(rid, kind="stable")
    r_sorted = rid[order]
    cuts = np.flatnonzero(np.r_[True, r_sorted[1:] != r_sorted[:-1], True])
    for a, b in zip(cuts[:-1], cuts[1:]):
        if r_sorted[a] == 0 or b - a < 2:
            continue
        out.append(ops[order[a:b]])
    return out


def fused_ns(g: StepGraph, run: np.ndarray) -> float:
    """The time of ``run`` as one fused kernel: that of its longest kernel (see the module
    docstring)."""
    return float(g.g_dur[run].max())


def inductor_fusion(g: StepGraph, anywhere: bool = False) -> tuple[list[np.ndarray], np.ndarray]:
    """The fusible runs of the step and the time of each as one kernel (for ``replace_ops``)."""
    runs = fusible_runs(g, anywhere)
    new = np.array([fused_ns(g, r) for r in runs], dtype=np.float64)
    # A run that holds a cross-entropy's log-softmax is a fused loss: never slower than the
    # passes such a loss makes over the logits (loss_groups), nor than its other kernels
    groups, loss_ns, _ = loss_groups(g) if runs else ([], np.zeros(0), 1.0)
    run_of = np.full(g.n_ops, -1, dtype=np.int64)
    for i, r in enumerate(runs if groups else ()):
        run_of[r] = i
    for grp, ns in zip(groups, loss_ns):
        i = int(run_of[grp[0]])
        if i >= 0:
            others = runs[i][~np.isin(runs[i], grp)]
            new[i] = max(float(ns), float(g.g_dur[others].max()) if len(others) else 0.0)
    return runs, new


# What one call of a compiled graph costs the host beyond the eager ops it runs: Dynamo's guards,
# AOTAutograd's wrapper and, in training, its backward's autograd node. Measured by
# scripts/bench/compile_breaks.py and scripts/bench/compiled_launch_cost.py (an H100's host, torch
# 2.11, 2026-12-07; analyses/compile_breaks.md), us a call, forward and backward (inference, the
# forward alone): a module's graph of static shapes, its parameters among its inputs, 300-490
# (training: stages of GEMMs, of MLP blocks, a chain of softmaxes with its saved outputs 460),
# 34-53 (inference); a two-op function without parameters 153 (26); an expert MLP after a
# ``nonzero``, its token count changing every call (dynamic shapes: symbolic guards, sizes
# computed at run time), 320-416 (137). Eight such stages of 8 experts: eager 64.4 ms a step,
# compiled 91.0 ms (0.71x); a real MoE's routing loop measured 0.77x where the fusion alone was
# priced 1.57x. A kernel the compiled graph keeps costs the host about what an eager op does
# (0.86-0.92 of it, on the same programs), so each kept launch keeps its eager cost.
GRAPH_CALL_US = {(True, False): 450.0, (True, True): 450.0, (False, False): 50.0, (False, True): 140.0}


def graph_entries(g: StepGraph, calls: np.ndarray, module_calls: int = 0) -> np.ndarray:
    """Where the compiled graphs of a step begin, given the ``calls`` torch.compile(model) runs:
    the first kernel launched among them in each iteration and after each blocking call (a
    synchronisation or a copy the host waits for: Dynamo breaks its graph there, and the code
    after it is another compiled graph, called every iteration). A model called ``module_calls``
    times an iteration (the op record's calls of its outermost modules: a draft and a target model
    in a decode loop, the crops of a multi-crop step) calls its compiled graph as often, breaks or
    not: an iteration with fewer entries gets the missing ones at launches spread evenly over its
    own (the calls of one model launch alike). Returns those launches' operations (one each), for
    ``add_cpu``."""
    calls = np.asarray(calls, dtype=np.int64)
    if not len(calls) or not g.n_calls:
        return np.empty(0, np.int64)
    blocking = synchronising(g)
    seg = np.cumsum(blocking)                       # blocking calls up to and including each call
    it = np.searchsorted(g.iter_call, np.arange(g.n_calls), side="right")
    launch = calls[g.c_kind[calls] == int(CallKind.LAUNCH)]
    if not len(launch):
        return np.empty(0, np.int64)
    key = it[launch].astype(np.int64) * (int(seg[-1]) + 2) + seg[launch]
    first = launch[np.unique(key, return_index=True)[1]]
    if module_calls > 1:
        first = np.union1d(first, _spread_entries(it, launch, first, int(module_calls)))
    ops = g.launched_by(first)
    # one operation per entry call (a call that launched several counts once)
    return ops[np.unique(g.g_call[ops], return_index=True)[1]]


def _spread_entries(it: np.ndarray, launch: np.ndarray, first: np.ndarray, per_iteration: int) -> np.ndarray:
    """Launches that stand for the compiled graph calls an iteration lacks: where an iteration's
    entries (``first``) number fewer than ``per_iteration``, the missing ones at launches evenly
    spaced among that iteration's other launches."""
    out = []
    it_launch, it_first = it[launch], it[first]
    for i in np.unique(it_launch):
        short = per_iteration - int((it_first == i).sum())
        pool = np.setdiff1d(launch[it_launch == i], first)
        if short <= 0 or not len(pool):
            continue
        short = min(short, len(pool))
        out.append(pool[(np.arange(1, short + 1) * len(pool)) // (short + 1)])
    return np.concatenate(out) if out else np.empty(0, np.int64)


def compile_host(g: StepGraph, calls: np.ndarray, training: bool, dynamic_share: float,
                 host: float, module_calls: int = 0) -> StepGraph:
    """``g`` with each compiled graph's call cost (GRAPH_CALL_US, measured without a profiler,
    put in the trace's CPU time by ``host``, the calibrated CPU scale) added where it begins
    (graph_entries, with the model's ``module_calls`` an iteration where the op record has
    them); ``dynamic_share`` of the graphs priced as graphs whose shapes follow the data. Part
    of every torch.compile price: a step broken into many graphs, or a model called many times
    a step, can lose more to the calls than the fusion saves."""
    entries = graph_entries(g, calls, module_calls)
    if not len(entries):
        return g
    share = min(max(float(dynamic_share), 0.0), 1.0)
    us = (1.0 - share) * GRAPH_CALL_US[training, False] + share * GRAPH_CALL_US[training, True]
    return add_cpu(g, entries, us * 1e3 / max(host, 1e-9))
