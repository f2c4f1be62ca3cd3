"""PK106 rnn-cell-loop: a recurrent layer stepped through time in Python, one cell call a timestep.

What
    PyTorch's fused LSTM/GRU cell kernels (``lstm_cell_forward``, ``gru_cell_forward``: what
    ``nn.LSTMCell`` and ``nn.GRUCell`` launch) at least ``min_per_iteration`` times an iteration:
    a Python loop over timesteps (and layers), each cell launching its two GEMMs and its
    pointwise update.
Why
    Each timestep costs the CPU a few launches and the Python around them while the GPU runs a few
    microseconds of work: the loop is launch-bound, the GPU mostly idle. ``nn.LSTM`` / ``nn.GRU``
    run the same recurrence inside one call: cuDNN computes the input projections of all
    timesteps in one GEMM and the recurrent part in a few kernels it launches itself, without
    Python between timesteps.
Evidence
    The cell kernels per iteration, and the launch calls of the loop (from the GEMMs before each
    iteration's first cell kernel to its last one). Only a plain recurrence over a sequence: when
    other kernels than GEMMs run between two cell steps (a softmax, a projection and an add that
    feed each step's output back as the next input: an iterative refiner), the library layers
    cannot run the loop and the rule stays quiet (PK103 prices capturing it), unless a stretch
    of the loop is plain (``plain_runs``: ``min_per_iteration`` cell steps or more with only
    GEMMs between them, an encoder before its decoder): that stretch alone is priced, the
    library layer timed at about its length, and the action says the rest must stay a loop.
    A GRU forecaster (96 encoder steps, then 48 decoder steps feeding each prediction back):
    quiet at first sight, the encoder as nn.GRU measured 1.72x; priced 2.13x since (the
    library call's own launches of cuDNN's recurrence are not in the edit).
Fix
    Replace the loop with ``nn.LSTM(input_size, hidden_size, num_layers)`` (or ``nn.GRU``) over
    the whole sequence (the cells' weights load into it as ``weight_ih_l{k}`` / ``weight_hh_l{k}``);
    where the loop must stay (custom cells, per-step logic), capture it in a CUDA graph (PK103).
Expected gain
    Graph edit: the loop's calls are made by the library instead of Python: their CPU time and
    the dispatch and Python between them go, one call per iteration comes back, and their
    kernels run back to back with their measured durations (cuDNN's batched input GEMM and
    persistent recurrent kernels are not slower than the cells' kernels, so the GPU side is not
    priced down: a floor). The step model replays the edited graph at the calibrated CPU scale
    (measured without a profiler on the H200, a 2-layer LSTMCell loop of 256 timesteps, the
    variants side by side in one process: a CUDA graph of the loop 2.70-3.29x, priced 2.88x;
    nn.LSTM 3.50-3.58x, priced 2.88x: cuDNN's kernels took 7.6-9.2 ms a batch where the cells'
    took 10.1 ms, which the floor leaves out. Without shapes the trace cannot price them:
    dropping the per-timestep input GEMMs, which cuDNN batches, would give about 5.8 ms, too
    little, since its recurrent kernels take longer a timestep than the cells' GEMM and update).
    That floor is the estimate, said as "estimated: no replacement timed at capture".

    **Timed at capture** (``profkit capture`` records each cell's sizes, batch and calls per
    iteration in its calibration run and times the library layer over those steps against the
    cell loop, PROFKIT_META ``replacements``; on CUDA the loop is timed as a CUDA graph, its
    kernels back to back, so the ratio is the kernels' alone): the loop's kernels also run the
    measured ratio faster. The action says "replacement timed at the program's shapes: X us vs
    Y us" (the library layer, then the loop). A loop timed with its host time in it (one that
    needs gradients, which the timing does not capture in a graph) does not say what the kernels
    gain: the floor stays, and says why. The library layer is timed as it runs, its launching
    included: cuDNN's LSTM launches a GEMM and an elementwise kernel a step, and a 2-layer one over
    256 steps timed 7.5 ms where its kernels took 3.8 ms in the program with the fix (H100, 2026-12-05,
    analyses/replacement_check.md). The ratio is then the layer's time, not its kernels' alone,
    and the edit, which removes the loop's host time, keeps the layer's own launching in the
    kernels' place: that H100 capture priced 30.9 -> 8.8 ms an iteration; the fix measured 8.2 ms
    on the H200 (its 29.3 ms loop). Stacked cells (one stepping on another's h) are timed as one
    multi-layer layer, as the fix runs them.
References
    PyTorch ``nn.LSTM`` / ``nn.GRU`` docs (cuDNN implementation); NVIDIA cuDNN RNN API
    (persistent kernels); Appleyard et al., "Optimizing Performance of Recurrent Neural Networks
    on GPUs" (2016).
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import (ESTIMATED, GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Table,
                                      timed_text)
from profkit.run.step.graph import CallKind, StepGraph
from profkit.run.step.transform import cuda_graph, scale_ops

CELL_RE = re.compile(r"(lstm|gru)_cell_forward", re.I)

RULE = RuleMeta(
    code="PK106", name="rnn-cell-loop",
    summary="an LSTM/GRU stepped through time in Python: nn.LSTM / nn.GRU (cuDNN) over the sequence",
    tables=(Table.KERNEL, Table.RUNTIME), example="traces/corpus/lstm_cell_loop.sqlite.xz",
    quiet_on="traces/corpus/early_exit_sync.sqlite.xz",
    params=(Param("min_per_iteration", 8, "cell kernels per iteration that make a loop over time"),))


def loop_calls(g: StepGraph, cell_ops: np.ndarray) -> np.ndarray:
    """The calls of each iteration's cell loop: from the GEMM launches right before its first cell
    kernel's launch to its last cell kernel's launch, on that thread."""
    names = np.asarray(g.op_names, dtype=object)
    gemm = np.array([bool(GEMM_KERNEL_RE.search(str(n))) for n in names], dtype=bool)
    # Per call: whether every operation it launched is a GEMM (a cell's projections).
    n_ops = np.diff(g.ops_ptr)
    op_gemm = gemm[g.g_name[g.ops_idx]] if len(g.ops_idx) else np.empty(0, bool)
    gemm_ops_per_call = np.add.reduceat(op_gemm.astype(np.int64), g.ops_ptr[:-1]) if len(g.ops_idx) else 0
    gemm_call = (n_ops > 0) & (gemm_ops_per_call == n_ops) & (g.c_kind == int(CallKind.LAUNCH))
    cell_calls = np.unique(g.g_call[cell_ops][g.g_call[cell_ops] >= 0])
    it = np.searchsorted(g.iter_call, cell_calls, side="right") - 1
    out = []
    for k in np.unique(it):
        mine = cell_calls[it == k]
        lo, hi = int(mine.min()), int(mine.max())
        tid = g.c_tid[lo]
        while lo > 0 and gemm_call[lo - 1] and g.c_tid[lo - 1] == tid:
            lo -= 1
        span = np.arange(lo, hi + 1)
        out.append(span[g.c_tid[span] == tid])
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _steps(g: StepGraph, cell_ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cell kernels in order and, per pair of consecutive ones: whether they are a step of one
    stream with work between them, and whether that work is GEMMs alone (the next cell's input
    and hidden projections)."""
    names = np.asarray(g.op_names, dtype=object)
    gemm = np.array([bool(GEMM_KERNEL_RE.search(str(n))) for n in names], dtype=bool)[g.g_name]
    ops = np.sort(cell_ops)  # the graph's operations are in stream order, then start
    a, b = ops[:-1], ops[1:]
    step = (g.g_stream[a] == g.g_stream[b]) & (b - a > 1)
    plain = step & np.array([bool(gemm[x + 1:y].all()) for x, y in zip(a, b)], dtype=bool)
    return ops, step, plain


def plain_recurrence(g: StepGraph, cell_ops: np.ndarray) -> bool:
    """Whether the loop is a plain recurrence over a sequence: between two consecutive cell
    kernels of a stream only GEMMs run (the next cell's input and hidden projections), in at
    least PLAIN_SHARE of the steps."""
    _, step, plain = _steps(g, cell_ops)
    return bool(step.any()) and plain.sum() >= PLAIN_SHARE * step.sum()


PLAIN_SHARE = 0.9  # the loop's first and last steps may sit next to other work


def plain_runs(g: StepGraph, cell_ops: np.ndarray, shortest: int) -> list[np.ndarray]:
    """The stretches of consecutive cell kernels (one stream) with only GEMMs between each and
    the next, ``shortest`` cells or more: each a plain recurrence over a sequence, where others
    of the same loop are not (a sequence-to-sequence model's encoder steps over its input, then
    a decoder whose steps project each output and feed it back)."""
    ops, _, plain = _steps(g, cell_ops)
    runs = np.split(ops, np.flatnonzero(~plain) + 1)
    return [r for r in runs if len(r) >= shortest]


def cell_kernels(g: StepGraph) -> np.ndarray:
    """The graph's LSTM/GRU cell kernels that a call in the window launched."""
    names = np.asarray(g.op_names, dtype=object)
    cell = np.array([bool(CELL_RE.search(str(n))) for n in names] + [False], dtype=bool)
    return np.flatnonzero(cell[np.where(g.g_name >= 0, g.g_name, len(names))] & (g.g_call >= 0))


def kernel_ratio(ctx: RuleContext, steps: int | None = None) -> tuple[float | None, str]:
    """(how many times faster the library layer ran, as it runs, than the cell loop's kernels,
    timed at the program's shapes with the loop as a CUDA graph; the words that say where the
    price comes from), or (None, the estimate's words). ``steps``: only the loops of about that
    many steps (the plain stretch of a loop whose other steps are not a recurrence: the stretch
    can take in a neighbouring step whose input is the same kind of projection)."""
    entries = [e for e in ctx.replacements.measured("rnn")
               if steps is None or abs(int(e.shape.get("calls", -1)) - steps) <= max(2, 0.05 * steps)]
    graphed = [e for e in entries if "CUDA graph" in e.original]
    if not graphed:
        if entries:
            return None, (f"{ESTIMATED} as kernels alone (the loop was timed with its host time: "
                          "its kernels' own gain is not known), the kernels kept: a floor")
        return None, ESTIMATED
    ratio = sum(e.original_ns for e in graphed) / sum(e.replacement_ns for e in graphed)
    if ratio < 1.0:   # cuDNN slower at these shapes: the kernels as they are, said so
        return 1.0, timed_text(graphed, "the library layer vs the cell loop, ") + " (not faster: kernels kept)"
    return ratio, timed_text(graphed, "the library layer vs the cell loop, ")


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None or ctx.iterations == 0:
        return []
    g = m.graph
    names = np.asarray(g.op_names, dtype=object)
    cell_ops = cell_kernels(g)
    its = max(len(g.iter_call) - 1, 1)
    if len(cell_ops) < RULE.param("min_per_iteration") * its:
        return []
    part = None
    if not plain_recurrence(g, cell_ops):
        # Work other than the cells' projections between two cell steps (a softmax, a Linear and
        # a residual add feeding each step's output back in: an iterative refiner, a decoder):
        # nn.LSTM / nn.GRU cannot run those steps; graph capture (PK103) can. Stretches of plain
        # steps among them (an encoder's) can still be one library call.
        runs = plain_runs(g, cell_ops, int(RULE.param("min_per_iteration")))
        if not runs:
            return []
        part = np.concatenate(runs)
        cell_all, cell_ops = len(cell_ops), part
    calls = loop_calls(g, cell_ops)
    launches = int((g.c_kind[calls] == int(CallKind.LAUNCH)).sum())
    steps = None
    if part is not None:
        lengths = {len(r) for r in runs}
        steps = lengths.pop() if len(lengths) == 1 else None
    ratio, said = kernel_ratio(ctx, steps)
    what = (f"the cell loop's {launches / its:.0f} launches per iteration and the Python between them "
            "made by one library call")
    if ratio is None:
        gain, basis = ctx.price(lambda gr: cuda_graph(gr, calls, whole_step=True),
                                what + ", its kernels kept (a floor: cuDNN's own kernels can be faster "
                                "than the cells')")
    else:
        loop_ops = g.launched_by(calls)
        gain, basis = ctx.price(lambda gr: scale_ops(cuda_graph(gr, calls, whole_step=True), loop_ops, ratio),
                                what + f", its kernels {ratio:.2f}x faster (the library layer as it runs, "
                                "its own launches included, against the cells' kernels, timed)")
    basis = f"{said}; {basis}"
    if gain < 1.02:
        return []
    kinds = sorted({m_.group(1).upper() for n in names[np.unique(g.g_name[cell_ops])]
                    for m_ in [CELL_RE.search(str(n))] if m_})
    layer = "/".join(f"nn.{k}" for k in kinds)
    cells = '/'.join(k + 'Cell' for k in kinds)
    ev = {"cell_kernels_per_iteration": round(len(cell_ops) / its, 1),
          "loop_launches_per_iteration": round(launches / its, 1),
          "priced_from": "estimate" if ratio is None else "timed"}
    if part is None:
        action = (f"run the recurrence with {layer} over the whole sequence (cuDNN) instead of a "
                  f"Python loop of {cells} calls ({len(cell_ops) / its:.0f} cell steps per iteration); "
                  "where the loop must stay, capture it in a CUDA graph")
    else:
        ev["cell_kernels_in_loops_per_iteration"] = round(cell_all / its, 1)
        action = (f"run the plain stretch of the recurrence with {layer} (cuDNN): {len(cell_ops) / its:.0f} "
                  f"of the {cell_all / its:.0f} {cells} steps per iteration have nothing but their "
                  "projections between them (an encoder over its input); the others do other work "
                  "between steps (a decoder projecting each output and feeding it back), which "
                  f"{layer} cannot run: keep that loop, or capture it in a CUDA graph (PK103)")
    return [Finding(RULE.code, RULE.name, action, Rung.LIBRARY, ev, gain, basis, gain)]
